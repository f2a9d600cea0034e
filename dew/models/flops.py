"""Training FLOPs per example, which the trainer divides by step time and peak FLOPs for MFU.

Convention (Kaplan et al. 2020; PaLM, Chowdhery et al. 2022, appendix B):

    training FLOPs = 6 · (matmul parameters used per token · tokens + those used once per example)
                   + 12 · depth · tokens² · attention width

A forward matmul costs 2 FLOPs per weight per row it multiplies, and the backward pass twice that,
hence 6. Only weights that take part in a matmul count: embedding-table lookups, biases, norms and
elementwise work are left out. The attention term is ``QKᵀ`` and ``softmax·V`` (2 · 2 · T² · width
FLOPs forward per layer) times 3, counted over the full ``T x T`` square even for causal attention,
as PaLM's MFU does, so numbers compare across codebases. ``tokens`` is the full sequence (or the
patches of an image). Each architecture counts its own weights (``Architecture.flops_per_example``)
and hands them to ``training_flops``.

This module imports no JAX.
"""

from __future__ import annotations

from collections.abc import Mapping

from dew.contract.models import architecture, resolve_fields


def training_flops(per_token: int, per_example: int, tokens: int, depth: int, attention_width: int) -> float:
    """The convention above, from an architecture's matmul weights used per token and per example,
    its tokens per example, its attention layers and their width."""
    return float(6 * (per_token * tokens + per_example) + 12 * depth * tokens**2 * attention_width)


def flops_per_example(name: str, fields: object) -> float | None:
    """Training FLOPs (forward and backward) of one example of architecture ``name``; ``fields`` is
    its fields record or a mapping of its fields. None where the architecture counts none."""
    arch = architecture(name)
    record = resolve_fields(name, fields) if isinstance(fields, Mapping) else fields
    return arch(record).flops_per_example()
