"""Next-token prediction for a causal language model (``transformer``).

A window of ``seq_len + 1`` tokens gives the inputs ``tokens[:, :-1]`` and the targets
``tokens[:, 1:]``; the loss is the cross-entropy summed over every target (nats) that counts (packed
documents and a ``loss_mask`` leave some out: ``dew.objectives.tokens.next_token_inputs``), over
their count, so ``loss`` is nats per token, ``bits_per_token`` is loss / ln 2 and the perplexity is
exp(loss). Evaluation draws nothing, so it is deterministic. Sampling is autoregressive with
temperature and top-k, over a key/value cache (``dew.objectives.decoding``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypedDict, Unpack

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dew.contract.config import ModelConfig
from dew.contract.data import whole
from dew.contract.objectives import objective_of
from dew.objectives.base import Batch, Loss
from dew.objectives.decoding import generate
from dew.objectives.tokens import decode, next_token_inputs


class SampleOptions(TypedDict, total=False):
    """What ``sample_text`` hands ``sample`` beyond the count and the key (``sample``'s keywords)."""

    prompt: Sequence[int] | None
    temperature: float | None
    top_k: int | None
    max_new_tokens: int | None
    cache: bool


@dataclasses.dataclass
class NextToken:
    """The next-token objective over ``tokens`` batches."""

    eval_sums: ClassVar[tuple[str, ...]] = ("bits_per_token",)
    """The keys of ``evaluate``'s ``Loss.sums``: its loss in bits too (declared, so that a run checks the
    values its evaluations report before it trains: ``dew.objectives.base``)."""

    model_config: ModelConfig
    knobs: Any
    """``NextTokenKnobs`` (``dew.objectives.next_token``), from the registration's ``build``."""
    vocab_size: int
    """The data's vocabulary: the ids sampling draws (the model's rows may be more: padding)."""
    seq_len: int
    tokenizer: Mapping[str, object] | None = None
    """The dataset's tokenizer record, for decoding samples and for the start token."""

    @property
    def ema_decay(self) -> float:
        return self.knobs.ema_decay

    def build(self, rngs: nnx.Rngs) -> nnx.Module:
        return self.model_config.build(rngs)

    def _cross_entropy(
        self, model: nnx.Module, batch: Batch, max_logits: bool = False
    ) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        """Per target: the cross-entropy (nats) and its weight (``next_token_inputs``), and the
        maximum logits when asked for."""
        inputs_BxL, targets_BxL, weight_BxL, kwargs = next_token_inputs(batch)
        out = model(inputs_BxL, return_max_logits=True, **kwargs) if max_logits else (model(inputs_BxL, **kwargs), None)
        ce_BxL = optax.softmax_cross_entropy_with_integer_labels(out[0].astype(jnp.float32), targets_BxL)
        return ce_BxL, weight_BxL, out[1]

    def loss(self, model: nnx.Module, batch: Batch, key: jax.Array, *, max_logits: bool = False) -> Loss:
        """The cross-entropy summed over the weighted targets and their count: the trainer's mean is
        ``sum(weight · nll) / sum(weight)`` over the whole batch, its micro-batches included."""
        del key  # nothing is drawn
        ce, weight, logits = self._cross_entropy(model, batch, max_logits)
        return Loss((ce * weight).sum(), weight.sum(), {}, logits)

    def evaluate(self, model: nnx.Module, batch: Batch, key: jax.Array) -> Loss:
        """Loss (nats per token) and bits per token over the real records' weighted targets."""
        del key
        ce, weight, _ = self._cross_entropy(model, batch)
        weight = weight * batch["mask"].astype(jnp.float32)[:, None]
        total = (ce * weight).sum()
        return Loss(total, weight.sum(), {"bits_per_token": total / math.log(2)})

    @staticmethod
    def derived_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
        """The perplexity, exp of a mean loss: not a mean of per-batch sums, so it is derived from
        the reported ``eval/loss`` (or ``train/loss``) rather than summed in ``Loss.sums``."""
        return {
            k.replace("/loss", "/perplexity"): math.exp(min(v, 700.0))
            for k, v in metrics.items()
            if k.endswith("/loss")
        }

    # ------------------------------------------------------------------------------- sampling

    def start_ids(self) -> list[int]:
        """The default prompt: the end-of-text id the data separates documents with, else id 0."""
        eos = (self.tokenizer or {}).get("eos_id")
        return [whole(eos, "the tokenizer's eos_id")] if eos is not None else [0]

    def sample(
        self,
        model: nnx.Module,
        count: int,
        key: jax.Array,
        *,
        prompt: Sequence[int] | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        max_new_tokens: int | None = None,
        cache: bool = True,
    ) -> jax.Array:
        """``count`` sequences: the prompt, then ``max_new_tokens`` tokens drawn one at a time (by
        default up to ``seq_len`` in all). Beyond ``seq_len`` tokens the context is a window that
        moves on by half its length (``dew.objectives.decoding``). ``cache`` False recomputes the
        whole context for each token (the reference the key/value cache is checked against)."""
        prompt = list(prompt) if prompt else self.start_ids()
        if not 0 < len(prompt) < self.seq_len:
            raise ValueError(
                f"the prompt holds {len(prompt)} tokens; it must hold 1 to seq_len - 1 = {self.seq_len - 1}"
            )
        new = self.seq_len - len(prompt) if max_new_tokens is None else max_new_tokens
        if new < 1:
            raise ValueError(f"max_new_tokens={new} must be >= 1")
        temperature = self.knobs.temperature if temperature is None else temperature
        top_k = self.knobs.top_k if top_k is None else top_k
        graphdef, state = nnx.split(model)
        prompt_BxP = jnp.broadcast_to(jnp.asarray(prompt, jnp.int32), (count, len(prompt)))
        return generate(
            graphdef,
            state,
            prompt_BxP,
            key,
            jnp.asarray(temperature, jnp.float32),
            new=new,
            window=self.seq_len,
            top_k=top_k,
            cached=cache,
            vocab=self.vocab_size,
        )

    def sample_text(
        self, model: nnx.Module, key: jax.Array, count: int | None = None, **options: Unpack[SampleOptions]
    ) -> tuple[np.ndarray, list[str]]:
        """``count`` sampled sequences: their ids and their text (without the default start id)."""
        ids = np.asarray(self.sample(model, count or self.knobs.samples, key, **options))
        shown = ids if options.get("prompt") else ids[:, len(self.start_ids()) :]
        return ids, decode(shown, self.tokenizer)

    def summary(self) -> dict[str, Any]:
        return {
            "objective": objective_of(self.knobs),
            "vocab_size": self.vocab_size,
            "seq_len": self.seq_len,
            **dataclasses.asdict(self.knobs),
        }
