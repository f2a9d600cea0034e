"""``next_token``: next-token prediction for a causal language model, registered. The loss,
evaluation and the cached sampler are in ``dew.objectives.autoregressive``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from dew.contract.data import whole
from dew.contract.objectives import ObjectiveSpec, check_sampling, objectives

if TYPE_CHECKING:
    from dew.contract.config import RunConfig
    from dew.contract.data import Dataset


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
        check_sampling("next_token", self.ema_decay, 1, self.temperature, self.top_k, self.samples)


@objectives.register("next_token")
class NextTokenSpec(ObjectiveSpec):
    """A causal language model learns each token from the ones before it."""

    Knobs = NextTokenKnobs
    role = "causal_lm"
    data_kind = "tokens"
    batch_fields = ("segment_ids", "positions", "loss_mask")
    loss_unit = "nats/token"

    @classmethod
    def build(cls, run: RunConfig, dataset: Dataset) -> Any:
        from dew.objectives.autoregressive import NextToken  # heavy: JAX loads only when the objective is built

        fields = dataset.model_fields()
        vocab_size = whole(fields["vocab_size"], "the data's vocab_size")
        seq_len = whole(fields["seq_len"], "the data's seq_len")
        return NextToken(
            model_config=run.model,
            knobs=cls.knobs(run),
            vocab_size=vocab_size,
            seq_len=seq_len,
            tokenizer=getattr(dataset, "tokenizer", None),
        )

    @classmethod
    def metrics(cls) -> tuple[Any, ...]:
        from dew.objectives.metrics import NextTokenAccuracy  # heavy: JAX loads only when the metrics are asked for

        return (NextTokenAccuracy(),)
