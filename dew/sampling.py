"""Writing samples of a trained run to its directory."""

from __future__ import annotations

import os
from typing import Any

import jax

from dew.objectives.flow_matching import write_grid


def write_sample_grid(objective: Any, model: Any, run_dir: Any, *, seed: int, name: str = "samples.png") -> str:
    """A PNG grid of class-conditional samples, one row per class, in ``run_dir``."""
    images, labels = objective.sample_grid(model, jax.random.PRNGKey(seed + 3))
    rows = max(int(labels.max()) + 1, 1)
    return write_grid(os.fspath(run_dir) + "/" + name, images, rows=rows, scale=4)
