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


@dataclasses.dataclass(frozen=True)
class MaskedDiffusionKnobs:
    """Masked diffusion (MDLM, Sahoo et al. 2024) over token windows with simple_dit.

    The log-linear schedule α_t = 1 - t: at time t each token is independently the mask token with
    probability t (t = 0 data, t = 1 all masked). The mask token is an extra vocabulary id, V (the
    data's vocabulary is 0..V-1), so the model's ``vocab_size`` is V + 1.
    """

    eps: float = 1e-3
    """Smallest time training draws (t ~ U[eps, 1]), which bounds the loss weight 1/t by 1/eps."""
    antithetic: bool = True
    """Draw a batch's times antithetically (stratified: one per 1/B stripe of [eps, 1] from a
    single uniform shift), which lowers the variance of the loss (MDLM §3.5)."""
    ema_decay: float = 0.999
    """Decay of the exponential moving average of the parameters that sampling uses; 0 turns the
    EMA off."""
    sample_steps: int = 64
    """Steps of the ancestral sampler from t = 1 to t = 0 (one model call each)."""
    temperature: float = 1.0
    """Divides the logits of p_θ(x_0 | z_t) before the sampler draws from them; 1 is the model."""
    top_k: int = 0
    """Draw only among the k most likely tokens of p_θ(x_0 | z_t); 0 keeps every token."""
    samples: int = 4
    """Sequences written to samples.txt at the end of a run."""

    def __post_init__(self) -> None:
        if not 0.0 < self.eps < 1.0:
            raise ValueError(f"masked_diffusion.eps={self.eps} must lie in (0, 1)")
        _check_sampling("masked_diffusion", self.ema_decay, self.sample_steps, self.temperature,
                        self.top_k, self.samples)


@dataclasses.dataclass(frozen=True)
class NextTokenKnobs:
    """Next-token prediction (a causal language model): cross-entropy of ``tokens[:, 1:]`` given
    ``tokens[:, :-1]``."""

    ema_decay: float = 0.0
    """Decay of the exponential moving average of the parameters that sampling uses; 0 (the
    default: language models rarely keep one) turns the EMA off."""
    temperature: float = 1.0
    """Divides the logits before each token is drawn; 1 is the model."""
    top_k: int = 0
    """Draw each token only among the k most likely; 0 keeps every token."""
    samples: int = 4
    """Sequences written to samples.txt at the end of a run."""

    def __post_init__(self) -> None:
        _check_sampling("next_token", self.ema_decay, 1, self.temperature, self.top_k, self.samples)


def _check_sampling(name: str, ema_decay: float, steps: int, temperature: float, top_k: int,
                    samples: int) -> None:
    if not 0.0 <= ema_decay < 1.0:
        raise ValueError(f"{name}.ema_decay={ema_decay} must lie in [0, 1)")
    if steps <= 0:
        raise ValueError(f"{name}.sample_steps={steps} must be positive")
    if temperature <= 0:
        raise ValueError(f"{name}.temperature={temperature} must be > 0")
    if top_k < 0:
        raise ValueError(f"{name}.top_k={top_k} must be >= 0 (0 keeps every token)")
    if samples <= 0:
        raise ValueError(f"{name}.samples={samples} must be positive")
