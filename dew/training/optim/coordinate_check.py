"""muP's coordinate check (Yang et al., Tensor Programs V, §D.1): does a layer's activation size
depend on the width once the model has trained a few steps?

Each width of the architecture is built from the same fields (only ``hidden_size`` changes, and
``mup`` is on or off), trained ``steps`` Adam steps at one fixed rate on one fixed batch (with muP,
the optimizer's muP groups: ``dew.training.optim.mup.mup_groups``), and then run once more on that
batch, recording the RMS of each layer's output: the module outputs outside the stack of blocks
(flax's ``nnx.capture(..., method_outputs=...)``: the embeddings, the readout, the model's output),
and each block's output, the residual stream, as the train step's dynamics record it
(``dew.models.stack.recording``). Normalisation layers are left out: their output's RMS is their
scale by construction. A layer's *slope* is the least-squares slope of log RMS against log width.

Under muP every coordinate stays the same size at every width: the slopes are near 0. Under the
standard parametrization at a fixed Adam rate, the updates of a ``fan_in``-wide matrix add up
coherently over its inputs, so the output grows with the width (slope near 1 for the logits); that
is the blow-up muP removes. docs/mup.md has the slopes of both architectures and the plots
(bench/mup_coord_check.py).

The task is what the architecture's role and data kind make of one fixed batch: next-token
cross-entropy for a causal language model; for a denoiser, the rectified-flow velocity (``ε - x_0``
at a fixed ``t`` and ``ε``) on images, and cross-entropy against the clean tokens in token mode.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dew.contract.config import OptimConfig
from dew.contract.dynamics import PREFIX
from dew.contract.models import Architecture, of
from dew.models import stack
from dew.training.dynamics import activation_metrics
from dew.training.optim.build import build_optimizer
from dew.training.optim.mup import mup_groups

__all__ = ["CoordinateCheck", "coordinate_check", "slope"]

READOUTS = frozenset({"head", "lm_head", "final_layer", "final_layer/linear"})
"""The readout's modules (``transformer``'s, ``simple_dit``'s), left out of the layers: their output is
the readout before muP's ``1/m`` (``head`` after it, the model's output again), which the check
records as ``output``."""

Batch = dict[str, jax.Array]
Task = tuple[Callable[[nnx.Module, Batch], jax.Array], Callable[[jax.Array, Batch], jax.Array]]


@dataclasses.dataclass(frozen=True)
class CoordinateCheck:
    """One architecture's check under one parametrization."""

    architecture: str
    mup: bool
    widths: tuple[int, ...]
    steps: int
    learning_rate: float
    seeds: int
    rms: dict[str, tuple[float, ...]]
    """Each layer's output RMS at each width, after ``steps`` steps: ``blocks_<i>`` each block's
    output (the residual stream), ``output`` the model's, the others a module's by its path."""

    @property
    def slopes(self) -> dict[str, float]:
        """Each layer's slope of log RMS against log width."""
        return {name: slope(self.widths, values) for name, values in self.rms.items()}

    def record(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "slopes": self.slopes}


def slope(widths: Sequence[int], values: Sequence[float]) -> float:
    """The least-squares slope of ``log values`` against ``log widths``."""
    return float(np.polyfit(np.log(np.asarray(widths, float)), np.log(np.asarray(values, float)), 1)[0])


def coordinate_check(
    architecture: str,
    fields: Mapping[str, object],
    widths: Sequence[int],
    *,
    mup: bool,
    steps: int = 5,
    learning_rate: float = 1e-2,
    batch_size: int = 8,
    seeds: int = 4,
) -> CoordinateCheck:
    """The check of ``architecture`` built from ``fields`` at each of ``widths`` (``hidden_size``),
    with ``mup`` on or off (module docstring). Every width trains on the same batch, from ``seeds``
    initialisations (seeds 0, 1, ...: each layer's RMS is their mean, as Tensor Programs V averages
    its seeds); the model's muP fields (``mup_base_width`` ...) are taken from ``fields``."""
    rms: dict[str, list[float]] = {}
    for width in widths:
        arch = of(architecture, {**fields, "hidden_size": width, "mup": mup})
        for name, value in _trained_rms(arch, steps, learning_rate, batch_size, seeds).items():
            rms.setdefault(name, []).append(value)
    incomplete = [name for name, values in rms.items() if len(values) != len(widths)]
    if incomplete:
        raise ValueError(f"coordinate check of {architecture!r}: layers {incomplete} are missing at some widths")
    check = CoordinateCheck(
        architecture, mup, tuple(widths), steps, learning_rate, seeds, {name: tuple(v) for name, v in rms.items()}
    )
    _check_finite(check)
    return check


def _trained_rms(arch: Architecture, steps: int, learning_rate: float, batch_size: int, seeds: int) -> dict[str, float]:
    """Train ``arch`` ``steps`` Adam steps on the fixed batch from each of ``seeds`` initialisations,
    then each layer's output RMS, averaged over the seeds. One program: the seeds are ``vmap``ped,
    the steps a ``fori_loop``, the measuring forward pass at its end."""
    call, loss_of = task(arch)
    batch = fixed_batch(arch, batch_size, 0)
    models = [nnx.split(arch.build(nnx.Rngs(seed)), nnx.Param, ...) for seed in range(seeds)]
    graphdef = models[0][0]
    params, rest = (jax.tree.map(lambda *x: jnp.stack(x), *[m[i] for m in models]) for i in (1, 2))
    config = OptimConfig(optimizer="adam", learning_rate=learning_rate)
    multiplier = arch.mup_width_multiplier()
    if multiplier is not None:
        config = dataclasses.replace(config, param_groups=mup_groups(config, models[0][1], multiplier))
    tx = build_optimizer(config, models[0][1], total_steps=steps).tx

    def loss(params: nnx.State, rest: nnx.State) -> jax.Array:
        return loss_of(call(nnx.merge(graphdef, params, rest), batch), batch)

    def train_and_measure(params: nnx.State, rest: nnx.State) -> dict[str, jax.Array]:
        def step(_: int, state: tuple[nnx.State, optax.OptState]) -> tuple[nnx.State, optax.OptState]:
            params, opt_state = state
            updates, opt_state = tx.update(jax.grad(loss)(params, rest), opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        params, _ = jax.lax.fori_loop(0, steps, step, (params, tx.init(params)))
        model = nnx.merge(graphdef, params, rest)
        with stack.recording():
            out, sown = nnx.capture(call, nnx.Intermediate, method_outputs=nnx.Intermediate)(model, batch)
        return {"output": _rms(out), **layer_rms(sown)}

    rms = jax.jit(jax.vmap(train_and_measure))(params, rest)
    return {name: float(jnp.mean(values)) for name, values in rms.items()}


def _rms(x: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.mean(jnp.square(x.astype(jnp.float32))))


def layer_rms(sown: nnx.State) -> dict[str, jax.Array]:
    """Each captured layer's output RMS: a module's method output by its path (norms left out), and
    each block's output from the mean squares its stack sowed, read as the training dynamics read
    them (``dew.training.dynamics.activation_metrics``)."""
    blocks = f"{PREFIX}act_rms/"
    layers = {name.removeprefix(blocks): value for name, value in activation_metrics(sown).items()}
    for path, variable in nnx.to_flat_state(sown):
        names = [str(p) for p in path]
        value = variable.get_value() if isinstance(variable, nnx.Variable) else variable
        value = value[0] if isinstance(value, tuple) else value
        if names[-1] == stack.OUTPUT_MS:
            continue  # the blocks', above
        if len(names) > 1 and not any("norm" in n for n in names):  # the model's own call is "output"
            name = "/".join(n for n in names if n != "__call__")
            if name not in READOUTS:
                layers[name] = _rms(value)
    return layers


def task(arch: Architecture) -> Task:
    """How the check calls the model on a batch, and the loss of its output (module docstring)."""
    kind = arch.data_kind()
    if arch.role == "causal_lm" and kind == "tokens":
        return (lambda model, b: model(b["tokens"][:, :-1])), lambda out, b: _cross_entropy(out, b["tokens"][:, 1:])
    if arch.role == "denoiser" and kind == "tokens":
        return (lambda model, b: model(b["tokens"], b["t"])), lambda out, b: _cross_entropy(out, b["tokens"])
    if arch.role == "denoiser" and kind == "image":
        return (
            lambda model, b: model(b["x_t"], b["t"], b["label"]),
            lambda out, b: jnp.mean(jnp.square(out.astype(jnp.float32) - b["velocity"])),
        )
    raise ValueError(
        f"coordinate check: architecture {arch.name!r} (role {arch.role!r}, data {kind!r}) has no task here; "
        "it runs causal_lm on tokens and denoiser on tokens or images"
    )


def _cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets).mean()


def fixed_batch(arch: Architecture, batch_size: int, seed: int) -> Batch:
    """The one batch every width trains on, drawn from ``seed`` at the shapes of ``arch.call_shapes``."""
    f: Any = arch.fields
    rng = np.random.default_rng(seed)
    shapes = arch.call_shapes(batch_size)
    if arch.data_kind() == "tokens":
        (batch, length), _ = shapes[0]
        length += arch.role == "causal_lm"  # the inputs and the next token
        tokens = rng.integers(0, f.vocab_size, (batch, length), dtype=np.int32)
        return {"tokens": jnp.asarray(tokens), "t": jnp.asarray(rng.uniform(0.2, 0.8, batch), jnp.float32)}
    image, _ = shapes[0]
    x0, eps = rng.normal(size=image).astype(np.float32), rng.normal(size=image).astype(np.float32)
    t = rng.uniform(0.2, 0.8, batch_size).astype(np.float32)
    x_t = (1 - t[:, None, None, None]) * x0 + t[:, None, None, None] * eps  # rectified flow: t = 1 is noise
    labels = rng.integers(0, max(getattr(f, "num_classes", 0), 1), batch_size, dtype=np.int32)
    return {
        "x_t": jnp.asarray(x_t),
        "t": jnp.asarray(t),
        "label": jnp.asarray(labels),
        "velocity": jnp.asarray(eps - x0),
    }


def _check_finite(check: CoordinateCheck) -> None:
    bad = [name for name, values in check.rms.items() if not all(math.isfinite(v) for v in values)]
    if bad:
        raise FloatingPointError(f"coordinate check of {check.architecture!r}: non-finite RMS in {bad}")
