"""Flow matching (rectified flow) for images, class-conditional with classifier-free guidance.

Convention (pinned): x_t = (1 - t)·x_0 + t·ε with t = 0 the data and t = 1 noise, ε ~ N(0, I); the
model predicts the velocity v = dx_t/dt = ε - x_0 and the loss is the mean squared error over pixels.
At initialisation simple_dit outputs exactly zero, so the loss is E[(ε - x_0)²] = 1 + E[x_0²] per
pixel. Sampling integrates dx/dt = v from t = 1 to t = 0 (Euler or Heun) with guidance
v = v_null + w·(v_label - v_null).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dew.contract.config import ModelConfig
from dew.contract.objectives import objective_of
from dew.objectives.base import Batch, Loss
from dew.sampling import to_uint8


@dataclasses.dataclass
class FlowMatching:
    """The flow-matching objective over ``image``/``label`` batches."""

    eval_sums: ClassVar[tuple[str, ...]] = ()
    """The keys of ``evaluate``'s ``Loss.sums``: none, it reports the loss alone (declared, so that a run
    checks the values its evaluations report before it trains: ``dew.objectives.base``)."""

    model_config: ModelConfig
    knobs: Any
    """``FlowMatchingKnobs`` (``dew.objectives.flow_matching``), from the registration's ``build``."""
    num_classes: int
    image_shape: tuple[int, int, int]

    @property
    def ema_decay(self) -> float:
        return self.knobs.ema_decay

    def build(self, rngs: nnx.Rngs) -> nnx.Module:
        return self.model_config.build(rngs)

    def _time(self, key: jax.Array, n: int) -> jax.Array:
        if self.knobs.time_sampling == "logit_normal":
            return jax.nn.sigmoid(jax.random.normal(key, (n,)))
        return jax.random.uniform(key, (n,))

    def _mse(
        self, model: nnx.Module, x0: jax.Array, t: jax.Array, eps: jax.Array, y: jax.Array, max_logits: bool = False
    ) -> tuple[jax.Array, jax.Array | None]:
        """Per-example mean squared velocity error (and the attention's max logits if asked)."""
        tb = t[:, None, None, None]
        x_t = (1.0 - tb) * x0 + tb * eps
        out = model(x_t, t, y, return_max_logits=True) if max_logits else (model(x_t, t, y), None)
        v = out[0][..., : x0.shape[-1]].astype(jnp.float32)
        return jnp.mean(jnp.square(v - (eps - x0)), axis=(1, 2, 3)), out[1]

    def loss(self, model: nnx.Module, batch: Batch, key: jax.Array, *, max_logits: bool = False) -> Loss:
        x0 = batch["image"].astype(jnp.float32)
        y = batch["label"].astype(jnp.int32)
        k_t, k_eps, k_drop = jax.random.split(key, 3)
        n = x0.shape[0]
        t = self._time(k_t, n)
        eps = jax.random.normal(k_eps, x0.shape)
        if self.num_classes and self.knobs.label_dropout > 0:
            drop = jax.random.bernoulli(k_drop, self.knobs.label_dropout, (n,))
            y = jnp.where(drop, self.num_classes, y)
        per_example, logits = self._mse(model, x0, t, eps, y, max_logits)
        return Loss(per_example.sum(), jnp.asarray(n, jnp.float32), {}, logits)

    def evaluate(self, model: nnx.Module, batch: Batch, key: jax.Array) -> Loss:
        x0 = batch["image"].astype(jnp.float32)
        mask = batch["mask"].astype(jnp.float32)
        k_t, k_eps = jax.random.split(key)
        n = x0.shape[0]
        # Stratified times (fixed given the key) lower the variance of the held-out estimate.
        t = (jnp.arange(n) + jax.random.uniform(k_t, (n,))) / n
        eps = jax.random.normal(k_eps, x0.shape)
        per_example, _ = self._mse(model, x0, t, eps, batch["label"].astype(jnp.int32))
        return Loss((per_example * mask).sum(), mask.sum(), {})

    def velocity(
        self, model: nnx.Module, x: jax.Array, t: float | jax.Array, y: jax.Array, guidance_scale: float
    ) -> jax.Array:
        """The guided velocity at (x, t) for labels y."""
        n = x.shape[0]
        t_B = jnp.full((n,), t, jnp.float32)
        c = x.shape[-1]
        if not self.num_classes or guidance_scale == 1.0:
            return model(x, t_B, y)[..., :c].astype(jnp.float32)
        both = model(
            jnp.concatenate([x, x]),
            jnp.concatenate([t_B, t_B]),
            jnp.concatenate([y, jnp.full_like(y, self.num_classes)]),
        )[..., :c].astype(jnp.float32)
        v_label, v_null = both[:n], both[n:]
        return v_null + guidance_scale * (v_label - v_null)

    def sample(
        self,
        model: nnx.Module,
        labels: jax.Array | np.ndarray,
        key: jax.Array,
        *,
        steps: int | None = None,
        guidance_scale: float | None = None,
        sampler: str | None = None,
    ) -> jax.Array:
        """Images for ``labels``, integrated from noise at t = 1 to t = 0; values in about [-1, 1]."""
        steps = steps or self.knobs.sample_steps
        w = self.knobs.guidance_scale if guidance_scale is None else guidance_scale
        sampler = sampler or self.knobs.sampler
        graphdef, state = nnx.split(model)

        @jax.jit
        def run(state: nnx.State, labels: jax.Array, key: jax.Array) -> jax.Array:
            m = nnx.merge(graphdef, state)
            x = jax.random.normal(key, (labels.shape[0], *self.image_shape))
            ts = jnp.linspace(1.0, 0.0, steps + 1)

            def body(i: jax.Array, x: jax.Array) -> jax.Array:
                t, t_next = ts[i], ts[i + 1]
                v = self.velocity(m, x, t, labels, w)
                x_euler = x + (t_next - t) * v
                if sampler == "euler":
                    return x_euler
                # Heun: average the slopes at both ends, except on the last step to t = 0.
                v_next = self.velocity(m, x_euler, t_next, labels, w)
                x_heun = x + (t_next - t) * 0.5 * (v + v_next)
                return jnp.where(i == steps - 1, x_euler, x_heun)

            return jax.lax.fori_loop(0, steps, body, x)

        return run(state, jnp.asarray(labels, jnp.int32), key)

    def sample_grid(
        self, model: nnx.Module, key: jax.Array, per_class: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``per_class`` samples of every class (one row per class): uint8 images and labels."""
        per_class = per_class or self.knobs.samples_per_class
        classes = max(self.num_classes, 1)
        labels = np.repeat(np.arange(classes), per_class).astype(np.int32)
        images = np.asarray(self.sample(model, labels, key))
        return to_uint8(images), labels

    def summary(self) -> dict[str, Any]:
        return {
            "objective": objective_of(self.knobs),
            "num_classes": self.num_classes,
            "image_shape": list(self.image_shape),
            **dataclasses.asdict(self.knobs),
        }
