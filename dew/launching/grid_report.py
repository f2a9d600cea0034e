"""The line a grid sweep (Hydra's basic sweeper: ``-m optim.learning_rate=1e-3,3e-3``) ends with:
its best run by the metric ``dew-runs`` ranks runs by, read from the runs' own files as ``dew-runs``
reads them. A search (Optuna's sweeper) reports its best trial itself."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from etils import epath

from dew.runs.status import read_run


def best_run_line(results: Sequence[Any], sweep_dir: str) -> str | None:
    """``results``: a launch's ``JobReturn`` records (a completed job's value is its run directory).
    The best run by its lowest ``eval/loss`` (``dew-runs``' ``best``), else by its last
    ``train/loss`` where no run evaluated; None where no job completed with a run directory."""
    from hydra.core.utils import JobStatus

    runs = []
    for result in results:
        value = getattr(result, "_return_value", None)
        if getattr(result, "status", None) == JobStatus.COMPLETED and isinstance(value, str):
            runs.append(read_run(epath.Path(value), os.path.basename(value)).summary)
    if not runs:
        return None
    ranked = [(r.best, "eval/loss", r) for r in runs if r.best is not None and math.isfinite(r.best)]
    if not ranked:
        ranked = [
            (r.train_loss, "train/loss", r) for r in runs if r.train_loss is not None and math.isfinite(r.train_loss)
        ]
    if not ranked:
        return None
    value, metric, best = min(ranked, key=lambda x: x[0])
    where = f" at step {best.best_step}" if metric == "eval/loss" and best.best_step is not None else ""
    return (
        f"best of {len(runs)} run{'s' if len(runs) != 1 else ''} by {metric}: {best.path} "
        f"({metric} {value:.4g}{where}); dew-runs {sweep_dir} lists them all"
    )
