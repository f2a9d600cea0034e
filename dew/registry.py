"""Names shared by the config layer and the JAX stack, and the plain registries of the config layer.

Every registry is a readable dict from a name to a class; nothing registers by import side effect.
This module does not import JAX.
"""

from __future__ import annotations

from typing import Literal

DtypeName = Literal["float32", "bfloat16", "float16"]
"""A floating dtype by its NumPy/JAX name."""

MatmulPrecision = Literal["default", "high", "highest"]
"""What a matmul asks XLA for: the backend's fastest algorithm, or more mantissa bits."""

AttentionImpl = Literal["auto", "xla", "cudnn"]
"""Attention kernel: ``auto`` is cudnn on a GPU for the shapes cudnn supports and xla otherwise."""


RematPolicy = Literal["none", "full", "dots", "minimal", "minimal_with_context"]
"""What a block's backward pass keeps from its forward pass (``dew.models.stack``): everything
(``none``), only the block's input (``full``), every matmul's output (``dots``), the weight matmuls'
outputs but not attention's (``minimal``, MaxText's name), or those and attention's output
(``minimal_with_context``)."""


def unknown_name(kind: str, name: object, known: object) -> ValueError:
    """The error for a name a registry does not hold, listing the ones it does."""
    return ValueError(f"unknown {kind} {name!r}; known: {', '.join(sorted(known))}")  # type: ignore[arg-type]
