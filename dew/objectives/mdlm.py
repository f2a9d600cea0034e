"""Masked diffusion language modelling: MDLM (Sahoo et al., "Simple and Effective Masked Diffusion
Language Models", 2024) over token windows with simple_dit in token mode.

Forward process (§3.1): each token of x_0 is independently replaced by the mask token ``m`` with
probability 1 - α_t. The schedule is log-linear, α_t = 1 - t (σ(t) = -log(1 - t)), so t = 0 is the
data and t = 1 all masks. The mask is an extra vocabulary id, ``m = V`` for data ids 0..V-1, so the
model's vocabulary is V + 1.

SUBS parameterisation (§3.2.3): the denoiser's p_θ(x_0 | z_t) (1) never puts mass on the mask
(its logit is set to -∞), and (2) carries every unmasked token of z_t over unchanged (a one-hot row).

Loss (§3.3, Eq. 10): the continuous-time NELBO, E_t E_q [α'_t / (1 - α_t) · log p_θ(x_0 | z_t)]
summed over the masked positions; with α_t = 1 - t the weight is 1/t. By SUBS the unmasked positions
contribute log 1 = 0. Times are drawn on [eps, 1], antithetically (§3.5). At initialisation
simple_dit outputs zero logits, so every masked token costs log V and E[1{masked}/t] = 1: the loss
is log V per token.

Packed documents and loss masks (docs/data.md): a batch's ``segment_ids`` and ``positions`` reach the
denoiser (attention within each document, positions from 0 in each: ``dew.models.dit``), and each
token's weight is ``next_token``'s rule at the token itself: 0 on padding (segment 0) and where a
``loss_mask`` is 0 (a chat's prompt), else 1. A weighted-out token is never masked (LLaDA's fine-tuning,
Nie et al. 2025 §2.3: the prompt stays clean and conditions the response) and adds nothing; the loss
is ``sum(w · NELBO integrand) / sum(w)``. Without those fields every weight is 1, as before. A row's
documents share its time t.

Sampler (§3.2.2, Eq. 7): ancestral steps from t to s < t on a grid from 1 to 0; a masked token stays
masked with probability s/t, else it is drawn from p_θ(x_0 | z_t); unmasked tokens never change. The
last step reaches s = 0, where no token can stay masked.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar, TypedDict, Unpack

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dew.contract.config import ModelConfig
from dew.contract.objectives import objective_of
from dew.objectives.base import Batch, Loss
from dew.objectives.tokens import decode, shape_logits

NEG_INF = -1e6
"""The "-∞" of SUBS, finite (as in MDLM's code) so that no row is all -inf and no gradient is NaN;
exp of it is exactly 0 in float32."""


def subs_log_probs(logits_BxLxV1: jax.Array, z_BxL: jax.Array, mask_id: int) -> jax.Array:
    """log p_θ(x_0 | z_t) under SUBS: the mask is never predicted, unmasked tokens carry over."""
    logits = logits_BxLxV1.astype(jnp.float32).at[..., mask_id].set(NEG_INF)
    logp = jax.nn.log_softmax(logits, axis=-1)
    ids = jnp.arange(logits.shape[-1])
    one_hot = jnp.where(ids == z_BxL[..., None], 0.0, NEG_INF)
    return jnp.where((z_BxL != mask_id)[..., None], one_hot, logp)


class SampleOptions(TypedDict, total=False):
    """What ``sample_text`` hands ``sample`` beyond the count and the key (``sample``'s keywords)."""

    steps: int | None
    temperature: float | None
    top_k: int | None


@dataclasses.dataclass
class MaskedDiffusion:
    """The masked-diffusion objective over ``tokens`` batches (the window's first ``seq_len``)."""

    eval_sums: ClassVar[tuple[str, ...]] = ("bits_per_token",)
    """The keys of ``evaluate``'s ``Loss.sums``: its loss in bits too (declared, so that a run checks the
    values its evaluations report before it trains: ``dew.objectives.base``)."""

    model_config: ModelConfig
    knobs: Any
    """``MaskedDiffusionKnobs`` (``dew.objectives.masked_diffusion``), from the registration's ``build``."""
    vocab_size: int
    """V, the data's vocabulary without the mask token."""
    seq_len: int
    tokenizer: Mapping[str, object] | None = None
    """The dataset's tokenizer record, for decoding samples."""

    @property
    def mask_id(self) -> int:
        return self.vocab_size

    @property
    def ema_decay(self) -> float:
        return self.knobs.ema_decay

    def build(self, rngs: nnx.Rngs) -> nnx.Module:
        return self.model_config.build(rngs)

    # ------------------------------------------------------------------------------ the loss

    def times(self, key: jax.Array, n: int, *, antithetic: bool) -> jax.Array:
        """``n`` times on [eps, 1]; antithetic: one shared uniform shift of the n stripes."""
        u = jax.random.uniform(key, (n,))
        if antithetic:
            u = (u / n + jnp.arange(n) / n) % 1.0
        return self.knobs.eps + (1.0 - self.knobs.eps) * u

    def corrupt(
        self, key: jax.Array, x0_BxL: jax.Array, t_B: jax.Array, weight_BxL: jax.Array | None = None
    ) -> jax.Array:
        """z_t: each token masked with probability 1 - α_t = t (none whose weight is 0)."""
        masked = jax.random.uniform(key, x0_BxL.shape) < t_B[:, None]
        if weight_BxL is not None:
            masked = masked & (weight_BxL > 0)
        return jnp.where(masked, self.mask_id, x0_BxL)

    def inputs(self, batch: Batch) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """``(x_0, weight, model keywords)`` of a batch: the window's first ``seq_len`` tokens, each
        token's weight (module docstring) and the documents' ``segment_ids``/``positions``."""
        x0_BxL = batch["tokens"][:, : self.seq_len].astype(jnp.int32)
        weight_BxL = jnp.ones(x0_BxL.shape, jnp.float32)
        kwargs = {k: batch[k][:, : self.seq_len].astype(jnp.int32) for k in ("segment_ids", "positions") if k in batch}
        if "segment_ids" in kwargs:
            weight_BxL = weight_BxL * (kwargs["segment_ids"] != 0).astype(jnp.float32)
        if "loss_mask" in batch:
            weight_BxL = weight_BxL * batch["loss_mask"][:, : self.seq_len].astype(jnp.float32)
        return x0_BxL, weight_BxL, kwargs

    def per_token(
        self,
        model: nnx.Module,
        x0_BxL: jax.Array,
        t_B: jax.Array,
        z_BxL: jax.Array,
        max_logits: bool = False,
        fields: Mapping[str, jax.Array] | None = None,
    ) -> tuple[jax.Array, jax.Array | None]:
        """The NELBO's integrand per token, -log p_θ(x_0 | z_t) / t (0 where z_t is unmasked);
        ``fields``: the documents' ``segment_ids`` and ``positions``, for the denoiser."""
        kwargs = dict(fields or {})
        out = model(z_BxL, t_B, return_max_logits=True, **kwargs) if max_logits else (model(z_BxL, t_B, **kwargs), None)
        logp = subs_log_probs(out[0], z_BxL, self.mask_id)
        logp_x0 = jnp.take_along_axis(logp, x0_BxL[..., None], axis=-1)[..., 0]
        return -logp_x0 / t_B[:, None], out[1]

    def loss(self, model: nnx.Module, batch: Batch, key: jax.Array, *, max_logits: bool = False) -> Loss:
        x0, weight, kwargs = self.inputs(batch)
        k_t, k_mask = jax.random.split(key)
        t = self.times(k_t, x0.shape[0], antithetic=self.knobs.antithetic)
        per_token, logits = self.per_token(model, x0, t, self.corrupt(k_mask, x0, t, weight), max_logits, kwargs)
        return Loss((per_token * weight).sum(), weight.sum(), {}, logits)

    def evaluate(self, model: nnx.Module, batch: Batch, key: jax.Array) -> Loss:
        """The NELBO per token (nats) and in bits, with antithetic times and masks fixed by ``key``."""
        x0, weight, kwargs = self.inputs(batch)
        weight = weight * batch["mask"].astype(jnp.float32)[:, None]
        k_t, k_mask = jax.random.split(key)
        t = self.times(k_t, x0.shape[0], antithetic=True)
        per_token, _ = self.per_token(model, x0, t, self.corrupt(k_mask, x0, t, weight), fields=kwargs)
        total = (per_token * weight).sum()
        return Loss(total, weight.sum(), {"bits_per_token": total / math.log(2)})

    # ------------------------------------------------------------------------------- sampling

    def sample(
        self,
        model: nnx.Module,
        count: int,
        key: jax.Array,
        *,
        steps: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
    ) -> jax.Array:
        """``count`` sequences of ``seq_len`` ids in [0, V), by the ancestral sampler from all masks."""
        steps = steps or self.knobs.sample_steps
        temperature = self.knobs.temperature if temperature is None else temperature
        top_k = self.knobs.top_k if top_k is None else top_k
        graphdef, state = nnx.split(model)
        mask_id = self.mask_id

        @jax.jit
        def run(state: nnx.State, key: jax.Array) -> jax.Array:
            m = nnx.merge(graphdef, state)
            ts = jnp.linspace(1.0, 0.0, steps + 1)

            def body(i: jax.Array, z: jax.Array) -> jax.Array:
                t, s = ts[i], ts[i + 1]
                logits = m(z, jnp.full((count,), t, jnp.float32))
                logp_x0 = jax.nn.log_softmax(shape_logits(subs_log_probs(logits, z, mask_id), temperature, top_k))
                # q(z_s | z_t, x_0 ~ p_θ) for a masked token: x_0 with mass (t - s)/t, the mask s/t.
                log_q = logp_x0 + jnp.log(t - s)
                log_q = log_q.at[..., mask_id].set(jnp.log(s))
                drawn = jax.random.categorical(jax.random.fold_in(key, i), log_q)
                return jnp.where(z == mask_id, drawn, z)

            z = jnp.full((count, self.seq_len), mask_id, jnp.int32)
            return jax.lax.fori_loop(0, steps, body, z)

        return run(state, key)

    def sample_text(
        self, model: nnx.Module, key: jax.Array, count: int | None = None, **options: Unpack[SampleOptions]
    ) -> tuple[np.ndarray, list[str]]:
        """``count`` sampled sequences: their ids and their text."""
        ids = np.asarray(self.sample(model, count or self.knobs.samples, key, **options))
        return ids, decode(ids, self.tokenizer)

    def summary(self) -> dict[str, Any]:
        return {
            "objective": objective_of(self.knobs),
            "vocab_size": self.vocab_size,
            "mask_id": self.mask_id,
            "seq_len": self.seq_len,
            **dataclasses.asdict(self.knobs),
        }
