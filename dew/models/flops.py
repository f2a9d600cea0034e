"""Training FLOPs per example, which the trainer divides by step time and peak FLOPs for MFU.

Convention (Kaplan et al. 2020; PaLM, Chowdhery et al. 2022, appendix B):

    training FLOPs = 6 · (matmul parameters used per token · tokens + those used once per example)
                   + 12 · depth · tokens² · attention width

A forward matmul costs 2 FLOPs per weight per row it multiplies, and the backward pass twice that,
hence 6. Only weights that take part in a matmul count: embedding-table lookups, biases, norms and
elementwise work are left out. The attention term is ``QKᵀ`` and ``softmax·V`` (2 · 2 · T² · width
FLOPs forward per layer) times 3, counted over the full ``T x T`` square even for causal attention,
as PaLM's MFU does, so numbers compare across codebases. ``tokens`` is the full sequence (``seq_len``
or ``input_size`` for tokens, ``(input_size / patch_size)²`` for images). ``simple_dit``'s timestep MLP
and adaLN modulations act once per example on the conditioning vector, not per token.

This module imports no JAX: it reads the fields record only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dew.models.registry import SimpleDiTFields, TransformerFields, architecture, resolve_fields

TIMESTEP_FREQUENCIES = 256
"""Width of simple_dit's sinusoidal timestep embedding (``dew.models.dit.TimestepEmbedder``)."""


def simple_dit_matmul_params(f: SimpleDiTFields) -> tuple[int, int, int]:
    """``(per-token weights, per-example weights, tokens)`` of ``simple_dit``."""
    D, mlp = f.hidden_size, int(f.hidden_size * f.mlp_ratio)
    if f.vocab_size is not None:
        tokens, embed, out = f.input_size, 0, D * f.vocab_size
    else:
        tokens = (f.input_size // f.patch_size) ** 2
        channels = f.in_channels * (2 if f.learn_sigma else 1)
        embed, out = f.patch_size ** 2 * f.in_channels * D, D * f.patch_size ** 2 * channels
    per_token = embed + f.depth * (4 * D * D + 2 * D * mlp) + out
    per_example = TIMESTEP_FREQUENCIES * D + D * D + f.depth * 6 * D * D + 2 * D * D
    return per_token, per_example, tokens


def transformer_matmul_params(f: TransformerFields) -> tuple[int, int, int]:
    """``(per-token weights, per-example weights, tokens)`` of ``transformer``."""
    D = f.hidden_size
    head_dim = f.head_dim or D // f.num_heads
    q_width, kv_width = f.num_heads * head_dim, (f.num_kv_heads or f.num_heads) * head_dim
    mlp = f.mlp_hidden or 128 * -(-8 * D // (3 * 128))
    per_block = D * q_width + 2 * D * kv_width + q_width * D + 3 * D * mlp
    return f.depth * per_block + D * f.vocab_size, 0, f.seq_len


def _attention_width(f: Any) -> int:
    if isinstance(f, TransformerFields):
        return f.num_heads * (f.head_dim or f.hidden_size // f.num_heads)
    return f.hidden_size


_MATMUL_PARAMS: dict[str, Callable[[Any], tuple[int, int, int]]] = {
    "simple_dit": simple_dit_matmul_params,
    "transformer": transformer_matmul_params,
}


def flops_per_example(name: str, fields: Any) -> float:
    """Training FLOPs (forward and backward) of one example of architecture ``name``.

    ``fields`` is the architecture's fields record, or a mapping of its fields.
    """
    architecture(name)
    if not isinstance(fields, (SimpleDiTFields, TransformerFields)):
        fields = resolve_fields(name, fields)
    per_token, per_example, tokens = _MATMUL_PARAMS[name](fields)
    attention = 12 * fields.depth * tokens ** 2 * _attention_width(fields)
    return float(6 * (per_token * tokens + per_example) + attention)
