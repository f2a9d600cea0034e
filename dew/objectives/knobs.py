"""The knobs each objective adds to a run, as typed records (no JAX): recorded in run.json, restored
by ``load`` and overridable from the command line (``flow_matching.guidance_scale=3``)."""

from __future__ import annotations

import dataclasses
from typing import Literal


@dataclasses.dataclass(frozen=True)
class FlowMatchingKnobs:
    """Rectified flow matching: x_t = (1 - t)·x_0 + t·ε, t = 0 data and t = 1 noise; the model
    predicts the velocity ε - x_0."""

    label_dropout: float = 0.1
    """Probability that a training label is replaced by the null class (classifier-free guidance)."""
    time_sampling: Literal["uniform", "logit_normal"] = "uniform"
    """How training draws t: uniform on [0, 1], or the logit-normal(0, 1) of Esser et al. 2024."""
    ema_decay: float = 0.999
    """Decay of the exponential moving average of the parameters that sampling uses; 0 turns the
    EMA off (sampling uses the trained parameters)."""
    sampler: Literal["euler", "heun"] = "euler"
    """The ODE solver from t = 1 to t = 0."""
    sample_steps: int = 32
    """Solver steps (Heun evaluates the model twice per step but the last)."""
    guidance_scale: float = 1.0
    """Classifier-free guidance weight w: v = v_null + w·(v_label - v_null); 1 is no guidance."""
    samples_per_class: int = 8
    """Columns of the sample grid written at the end of a run (one row per class)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.label_dropout < 1.0:
            raise ValueError(f"flow_matching.label_dropout={self.label_dropout} must lie in [0, 1)")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"flow_matching.ema_decay={self.ema_decay} must lie in [0, 1)")
        if self.sample_steps <= 0 or self.samples_per_class <= 0:
            raise ValueError("flow_matching.sample_steps and flow_matching.samples_per_class must be positive")
