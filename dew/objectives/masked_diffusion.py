"""``masked_diffusion``: masked diffusion (MDLM, Sahoo et al. 2024) over token windows with a
denoiser, registered. The loss, evaluation and sampler are in ``dew.objectives.mdlm``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from dew.contract.data import whole
from dew.contract.objectives import ObjectiveSpec, check_sampling, objectives

if TYPE_CHECKING:
    from dew.contract.config import RunConfig
    from dew.contract.data import Dataset


@dataclasses.dataclass(frozen=True)
class MaskedDiffusionKnobs:
    """Masked diffusion (MDLM, Sahoo et al. 2024) over token windows.

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
        check_sampling(
            "masked_diffusion", self.ema_decay, self.sample_steps, self.temperature, self.top_k, self.samples
        )


@objectives.register("masked_diffusion")
class MaskedDiffusionSpec(ObjectiveSpec):
    """A denoiser learns to fill in masked tokens; the mask token is an extra vocabulary id."""

    Knobs = MaskedDiffusionKnobs
    role = "denoiser"
    data_kind = "tokens"
    batch_fields = ("segment_ids", "positions", "loss_mask")
    loss_unit = "nats/token (NELBO)"

    @classmethod
    def model_fields(cls, dataset: Dataset) -> dict[str, object]:
        """The mask token joins the vocabulary as id V of a model vocabulary of V + 1; the model
        reads the window's first ``seq_len`` tokens, unconditionally."""
        fields = dataset.model_fields()
        return {
            "vocab_size": whole(fields["vocab_size"], "the data's vocab_size") + 1,
            "input_size": whole(fields["seq_len"], "the data's seq_len"),
            "num_classes": 0,
        }

    @classmethod
    def conflict_hint(cls) -> str:
        return "masked_diffusion adds the mask token to the data's vocabulary: vocab_size is the data's + 1"

    @classmethod
    def build(cls, run: RunConfig, dataset: Dataset) -> Any:
        from dew.objectives.mdlm import MaskedDiffusion  # heavy: JAX loads only when the objective is built

        fields = dataset.model_fields()
        vocab_size = whole(fields["vocab_size"], "the data's vocab_size")
        seq_len = whole(fields["seq_len"], "the data's seq_len")
        return MaskedDiffusion(
            model_config=run.model,
            knobs=cls.knobs(run),
            vocab_size=vocab_size,
            seq_len=seq_len,
            tokenizer=getattr(dataset, "tokenizer", None),
        )
