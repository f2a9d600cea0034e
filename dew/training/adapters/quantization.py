"""Quantized training (``trainer.quantization``): the module's matmuls run on fake-quantized operands.

**What the wrap does.** ``quantize(module, inputs, q)`` returns a copy of the module whose forward is
traced through qwix's quantized-training provider (``qwix.QtProvider``, one ``QtRule``): in every
module whose path (``blocks/attn/q``, ``final_layer/linear``: the attribute path from the root, joined
by ``/``) fully matches ``q.module_path``, each ``dot_general``/``einsum`` against a weight quantizes
the weight to ``q.weight_qtype`` and, with ``q.act_qtype`` set, the activation to ``q.act_qtype``
(symmetric absmax scales: per output channel, or per tile of ``q.tile_size`` elements along the
contraction), multiplies the quantized operands and rescales. Products of two activations (attention's
``q·k``) are quantized to ``q.act_qtype`` as well, when it is set. The backward pass is
straight-through (Bengio et al. 2013): the gradient of the rounding is taken as the identity, so
gradients reach every parameter as if the forward were the float one, computed against the original
(unquantized) residuals; with ``q.bwd_qtype`` set, the backward matmuls quantize their incoming
gradient to that type instead. The run therefore learns through the forward it will serve with.

**What it keeps.** Parameters stay what they were: the same tree, the same paths, stored in the model's
``param_dtype``, initialised from the run's seed exactly as without quantization; the optimizer moves
them in full precision and checkpoints hold them so. Quantization happens only inside the forward (a
quantized model for serving is a separate, later step: ``qwix.PtqProvider`` over these parameters).
Scales are dynamic (recomputed from each batch), so the wrap adds no state. Embedding lookups
(``nnx.Embed``) are gathers, not matmuls, and stay in the compute dtype.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import jax
import qwix
from flax import nnx

from dew import compat
from dew.contract.config import Quantization


def _traces_to(x: object, param: object) -> bool:
    """Whether ``x`` is ``param`` or follows from it through unary ops (casts, reshapes)."""
    while True:
        if x is param or (hasattr(x, "get_const") and x.get_const() is param):
            return True
        parent = getattr(x, "parent", None)
        if not isinstance(x, jax.core.Tracer) or not parent or len(parent.in_tracers) != 1:
            return False
        x = parent.in_tracers[0]


@contextlib.contextmanager
def one_weight_per_matmul(operands: tuple[jax.typing.ArrayLike, ...]) -> Iterator[None]:
    """Within: of a matmul's operands that qwix takes for the same weight, only one is it.

    qwix's ``find_param`` (is this operand a parameter of the current module?) follows a traced
    operand back to a parameter where it can, then falls back to comparing shapes. The fallback takes
    an activation for the weight whenever their shapes agree: the timestep MLP's
    ``(batch, hidden) @ (hidden, hidden)`` with ``batch == hidden`` (the digits experiment's 128 and
    128) then has two "weights" and fails. Here, when several operands claim one parameter, the one
    that traces back to it keeps the claim, else the last operand (the kernel in ``nnx.Linear``,
    ``LinearGeneral``, ``Conv`` and dew's ``einsum`` calls); the others are activations.
    """
    flax_util = compat.qwix_flax_util()
    shape_or_trace = flax_util.find_param
    names = [shape_or_trace(x) if hasattr(x, "shape") else None for x in operands]
    activations: set[int] = set()
    for name in {n for n in names if n is not None}:
        claims = [x for x, n in zip(operands, names) if n == name]
        if len(claims) > 1:
            param = flax_util.unbox(getattr(flax_util.get_current_module(), name))
            exact = [x for x in claims if _traces_to(x, param)]
            weight = (exact or claims)[-1]
            activations |= {id(x) for x in claims if x is not weight}
    if not activations:
        yield
        return

    def find_param(x: jax.typing.ArrayLike, ptq_array_type: type | None = None) -> str | None:
        return None if id(x) in activations else shape_or_trace(x, ptq_array_type)

    with compat.qwix_find_param(find_param):
        yield


class ExactWeights:
    """Mixin for qwix providers: every intercepted matmul runs under ``one_weight_per_matmul``."""

    def dot_general(
        self, lhs: jax.typing.ArrayLike, rhs: jax.typing.ArrayLike, *args: object, **kwargs: object
    ) -> jax.Array:
        with one_weight_per_matmul((lhs, rhs)):
            return super().dot_general(lhs, rhs, *args, **kwargs)  # type: ignore[misc]

    def einsum(self, einsum_str: str, *operands: jax.typing.ArrayLike, **kwargs: object) -> jax.Array:
        with one_weight_per_matmul(operands):
            return super().einsum(einsum_str, *operands, **kwargs)  # type: ignore[misc]

    def conv_general_dilated(
        self, lhs: jax.typing.ArrayLike, rhs: jax.typing.ArrayLike, *args: object, **kwargs: object
    ) -> jax.Array:
        with one_weight_per_matmul((lhs, rhs)):
            return super().conv_general_dilated(lhs, rhs, *args, **kwargs)  # type: ignore[misc]


class QtProvider(ExactWeights, qwix.QtProvider):
    """qwix's quantized-training provider, one weight per matmul (``one_weight_per_matmul``)."""


def rule(q: Quantization, *, module_path: str | None = None) -> qwix.QtRule:
    """The qwix rule of ``q`` (over ``module_path`` when given instead of ``q.module_path``)."""
    return qwix.QtRule(
        module_path=q.module_path if module_path is None else module_path,
        weight_qtype=q.weight_qtype,
        act_qtype=q.act_qtype,
        bwd_qtype=q.bwd_qtype,
        tile_size=q.tile_size,
    )


def module_paths(module: nnx.Module) -> list[str]:
    """The path of every submodule, as qwix matches rules against it (``blocks/attn/q``)."""
    return ["/".join(map(str, path)) for path, _ in nnx.iter_modules(module) if path]


def check_module_path(module: nnx.Module, pattern: str, field: str) -> None:
    """Raise unless ``pattern`` fully matches at least one submodule path of ``module``."""
    paths = module_paths(module)
    if not any(re.fullmatch(pattern, p) for p in paths):
        raise ValueError(f"{field}={pattern!r} matches no module path; the model's are {', '.join(paths)}")


def quantize(module: nnx.Module, inputs: tuple[jax.Array, ...], q: Quantization) -> nnx.Module:
    """``module`` with its forward quantized as ``q`` says (see the module docstring). ``inputs`` is
    one sample call, which qwix traces once to find the weights each matmul reads."""
    check_module_path(module, q.module_path, "trainer.quantization.module_path")
    try:
        return qwix.quantize_model(module, QtProvider([rule(q)]), *inputs)
    except ValueError as e:  # e.g. a tile_size that does not divide a contraction (attention's keys)
        raise ValueError(
            f"trainer.quantization={q}: qwix cannot quantize the matmuls of modules matching {q.module_path!r}: {e}"
        ) from e
