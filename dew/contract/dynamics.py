"""The names of the training dynamics' metrics (``trainer.dynamics_every``; dew.training.dynamics
computes them, ``dew-runs plot --dynamics`` draws them): ``dynamics/<kind>/<group>``, read here
without JAX."""

from __future__ import annotations

from collections.abc import Iterable

PREFIX = "dynamics/"
KINDS = ("act_rms", "grad_rms", "update_rms", "param_rms", "update_ratio")
"""The kinds of dynamics metric, each ``dynamics/<kind>/<group>``."""


def split(name: str) -> tuple[str, str] | None:
    """``dynamics/<kind>/<group>`` -> (kind, group); None for any other metric."""
    parts = name.split("/")
    if len(parts) != 3 or parts[0] + "/" != PREFIX or parts[1] not in KINDS:
        return None
    return parts[1], parts[2]


def kinds_in(names: Iterable[str]) -> list[str]:
    """The dynamics kinds among metric ``names``, in ``KINDS``' order."""
    found = {s[0] for s in map(split, names) if s is not None}
    return [k for k in KINDS if k in found]
