"""Writing samples of a trained run to its directory: a PNG grid for images, a text file for tokens.
Both go through epath, so a run directory on any filesystem epath reaches (gs://) takes them."""

from __future__ import annotations

import os
from typing import Any

import jax
from etils import epath

from dew.objectives.flow_matching import write_grid


def write_sample_grid(objective: Any, model: Any, run_dir: Any, *, seed: int, name: str = "samples.png") -> str:
    """A PNG grid of class-conditional samples, one row per class, in ``run_dir``."""
    images, labels = objective.sample_grid(model, jax.random.PRNGKey(seed + 3))
    rows = max(int(labels.max()) + 1, 1)
    return write_grid(os.fspath(run_dir) + "/" + name, images, rows=rows, scale=4)


def write_text_samples(objective: Any, model: Any, run_dir: Any, *, seed: int, name: str = "samples.txt") -> str:
    """The objective's ``samples`` knob of sequences, decoded, one block each, in ``run_dir``."""
    _, texts = objective.sample_text(model, jax.random.PRNGKey(seed + 3))
    path = os.fspath(run_dir) + "/" + name
    epath.Path(path).write_text("".join(f"--- sample {i} ---\n{text}\n" for i, text in enumerate(texts)))
    return path
