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

import re
from typing import Any

import qwix
from flax import nnx

from dew.config import Quantization


def rule(q: Quantization, *, module_path: str | None = None) -> qwix.QtRule:
    """The qwix rule of ``q`` (over ``module_path`` when given instead of ``q.module_path``)."""
    return qwix.QtRule(module_path=q.module_path if module_path is None else module_path,
                       weight_qtype=q.weight_qtype, act_qtype=q.act_qtype, bwd_qtype=q.bwd_qtype,
                       tile_size=q.tile_size)


def module_paths(module: nnx.Module) -> list[str]:
    """The path of every submodule, as qwix matches rules against it (``blocks/attn/q``)."""
    return ["/".join(map(str, path)) for path, _ in nnx.iter_modules(module) if path]


def check_module_path(module: nnx.Module, pattern: str, field: str) -> None:
    """Raise unless ``pattern`` fully matches at least one submodule path of ``module``."""
    paths = module_paths(module)
    if not any(re.fullmatch(pattern, p) for p in paths):
        raise ValueError(f"{field}={pattern!r} matches no module path; the model's are "
                         f"{', '.join(paths)}")


def quantize(module: nnx.Module, inputs: tuple[Any, ...], q: Quantization) -> nnx.Module:
    """``module`` with its forward quantized as ``q`` says (see the module docstring). ``inputs`` is
    one sample call, which qwix traces once to find the weights each matmul reads."""
    check_module_path(module, q.module_path, "trainer.quantization.module_path")
    return qwix.quantize_model(module, qwix.QtProvider([rule(q)]), *inputs)
