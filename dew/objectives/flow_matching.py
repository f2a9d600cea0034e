"""``flow_matching``: rectified flow matching on images, class-conditional with classifier-free
guidance, registered. The loss, evaluation and sampler are in ``dew.objectives.rectified_flow``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Literal

from dew.contract.data import whole
from dew.contract.objectives import ObjectiveSpec, objectives

if TYPE_CHECKING:
    from dew.contract.config import RunConfig
    from dew.contract.data import Dataset


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


@objectives.register("flow_matching")
class FlowMatchingSpec(ObjectiveSpec):
    """A denoiser learns the velocity of the straight path from an image to noise."""

    Knobs = FlowMatchingKnobs
    role = "denoiser"
    data_kind = "image"
    loss_unit = "MSE of the velocity, per pixel"

    @classmethod
    def build(cls, run: RunConfig, dataset: Dataset) -> Any:
        from dew.objectives.rectified_flow import FlowMatching  # heavy: JAX loads only when the objective is built

        fields = dataset.model_fields()
        size = whole(fields["input_size"], "the data's input_size")
        channels = whole(fields["in_channels"], "the data's in_channels")
        return FlowMatching(
            model_config=run.model,
            knobs=cls.knobs(run),
            num_classes=whole(fields.get("num_classes", 0), "the data's num_classes"),
            image_shape=(size, size, channels),
        )
