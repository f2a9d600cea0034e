"""Next-token prediction for a causal language model (``transformer``).

A window of ``seq_len + 1`` tokens gives the inputs ``tokens[:, :-1]`` and the targets
``tokens[:, 1:]``; the loss is the cross-entropy summed over every target (nats), so ``loss`` is
nats per token, ``bits_per_token`` is loss / ln 2 and the perplexity is exp(loss). Evaluation
draws nothing, so it is deterministic. Sampling is autoregressive with temperature and top-k.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dew.config import ModelConfig
from dew.objectives.base import Batch, Loss
from dew.objectives.knobs import NextTokenKnobs
from dew.objectives.tokens import decode, shape_logits


@dataclasses.dataclass
class NextToken:
    """The next-token objective over ``tokens`` batches."""

    model_config: ModelConfig
    knobs: NextTokenKnobs
    vocab_size: int
    seq_len: int
    tokenizer: Mapping[str, object] | None = None
    """The dataset's tokenizer record, for decoding samples and for the start token."""

    @property
    def ema_decay(self) -> float:
        return self.knobs.ema_decay

    def build(self, rngs: nnx.Rngs) -> nnx.Module:
        return self.model_config.build(rngs)

    def _cross_entropy(self, model: nnx.Module, tokens: jax.Array,
                       max_logits: bool = False) -> tuple[jax.Array, jax.Array | None]:
        tokens = tokens.astype(jnp.int32)
        inputs_BxL, targets_BxL = tokens[:, :-1], tokens[:, 1:]
        out = model(inputs_BxL, return_max_logits=True) if max_logits else (model(inputs_BxL), None)
        ce_BxL = optax.softmax_cross_entropy_with_integer_labels(out[0].astype(jnp.float32), targets_BxL)
        return ce_BxL, out[1]

    def loss(self, model: nnx.Module, batch: Batch, key: jax.Array, *, max_logits: bool = False) -> Loss:
        del key  # nothing is drawn
        ce, logits = self._cross_entropy(model, batch["tokens"], max_logits)
        return Loss(ce.sum(), jnp.asarray(ce.size, jnp.float32), {}, logits)

    def evaluate(self, model: nnx.Module, batch: Batch, key: jax.Array) -> Loss:
        """Loss (nats per token) and bits per token over the real records."""
        del key
        ce, _ = self._cross_entropy(model, batch["tokens"])
        mask = batch["mask"].astype(jnp.float32)
        total = (ce.sum(axis=1) * mask).sum()
        return Loss(total, mask.sum() * ce.shape[1], {"bits_per_token": total / math.log(2)})

    @staticmethod
    def derived_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
        """The perplexity, exp of a mean loss: not a mean of per-batch sums, so it is derived from
        the reported ``eval/loss`` (or ``train/loss``) rather than summed in ``Loss.sums``."""
        return {k.replace("/loss", "/perplexity"): math.exp(min(v, 700.0))
                for k, v in metrics.items() if k.endswith("/loss")}

    # ------------------------------------------------------------------------------- sampling

    def start_ids(self) -> list[int]:
        """The default prompt: the end-of-text id the data separates documents with, else id 0."""
        eos = (self.tokenizer or {}).get("eos_id")
        return [int(eos)] if eos is not None else [0]

    def sample(self, model: nnx.Module, count: int, key: jax.Array, *, prompt: Sequence[int] | None = None,
               temperature: float | None = None, top_k: int | None = None) -> jax.Array:
        """``count`` sequences of ``seq_len`` ids: the prompt, then tokens drawn one at a time."""
        prompt = list(prompt) if prompt else self.start_ids()
        if not 0 < len(prompt) < self.seq_len:
            raise ValueError(f"the prompt holds {len(prompt)} tokens; it must hold 1 to seq_len - 1 = "
                             f"{self.seq_len - 1}")
        temperature = self.knobs.temperature if temperature is None else temperature
        top_k = self.knobs.top_k if top_k is None else top_k
        graphdef, state = nnx.split(model)
        start = len(prompt)

        @jax.jit
        def run(state: Any, key: jax.Array) -> jax.Array:
            m = nnx.merge(graphdef, state)
            ids = jnp.zeros((count, self.seq_len), jnp.int32).at[:, :start].set(jnp.asarray(prompt, jnp.int32))

            def body(i: jax.Array, ids: jax.Array) -> jax.Array:
                # Causal: the logits at i - 1 see only ids[:, :i], whatever follows in the buffer.
                logits_BxV = jax.lax.dynamic_index_in_dim(m(ids), i - 1, axis=1, keepdims=False)
                drawn = jax.random.categorical(jax.random.fold_in(key, i),
                                               shape_logits(logits_BxV, temperature, top_k))
                return ids.at[:, i].set(drawn)

            return jax.lax.fori_loop(start, self.seq_len, body, ids)

        return run(state, key)

    def sample_text(self, model: nnx.Module, key: jax.Array, count: int | None = None,
                    **options: Any) -> tuple[np.ndarray, list[str]]:
        """``count`` sampled sequences: their ids and their text (without the default start id)."""
        ids = np.asarray(self.sample(model, count or self.knobs.samples, key, **options))
        shown = ids if options.get("prompt") else ids[:, len(self.start_ids()):]
        return ids, decode(shown, self.tokenizer)

    def summary(self) -> dict[str, Any]:
        return {"objective": "next_token", "vocab_size": self.vocab_size, "seq_len": self.seq_len,
                **dataclasses.asdict(self.knobs)}
