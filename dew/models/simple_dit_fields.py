"""``SimpleDiTFields``: the fields of ``simple_dit`` (``model.config``), with their checks. Plain data,
no JAX, below both the registration (``dew.models.simple_dit``, whose ``build`` imports the layers)
and the layers (``dew.models.dit``), which read them: neither imports the other for their type.
"""

from __future__ import annotations

import dataclasses

from dew.contract.models import PrecisionFields, check_divides, check_positive
from dew.contract.registry import RematPolicy


@dataclasses.dataclass(frozen=True)
class SimpleDiTFields(PrecisionFields):
    """Fields of ``simple_dit`` (Peebles & Xie 2023). Defaults are DiT-S/2 on 32x32x4 latents."""

    input_size: int = 32
    """Image side in pixels (or latents); for token data, the sequence length. From the data."""
    in_channels: int = 4
    """Image channels. From the data; ignored for token data."""
    patch_size: int = 2
    """Side of a square patch (images only)."""
    hidden_size: int = 384
    """Width of the transformer."""
    depth: int = 12
    """Number of DiT blocks."""
    num_heads: int = 6
    """Attention heads per block."""
    mlp_ratio: float = 4.0
    """MLP hidden width as a multiple of ``hidden_size``."""
    num_classes: int = 1000
    """Classes of the label embedding (one more "null" class is added for guidance). From the data;
    0 builds an unconditional model."""
    vocab_size: int | None = None
    """For token data: the vocabulary (mask token included); a token embedding replaces the patch
    embedding and the output is vocabulary-sized. From the data."""
    learn_sigma: bool = False
    """Double the output channels to predict a variance as well (DiT's learned-sigma variant)."""
    mup: bool = False
    """Apply muP's multipliers (the transformer's, where a DiT's parts correspond; docs/mup.md): the
    output divided by the width multiplier, attention scaled by ``sqrt(base head_dim) / head_dim``,
    the timestep MLP's second matrix initialised with ``0.02 / sqrt(width multiplier)`` and the patch
    embedding with the base width's Xavier scale (the other hidden matrices' Xavier initialisation
    already scales as muP's). At the base width the model is the standard one;
    ``model.config.mup=true`` also brings the optimizer's muP groups (``dew.training.optim.mup``)."""
    mup_base_width: int = 256
    """The width the muP multipliers are relative to (width multiplier = hidden_size / this)."""
    mup_base_head_dim: int | None = None
    """The head_dim at the base width, which muP's attention scale ``sqrt(this) / head_dim`` is
    relative to. Unset: ``head_dim / width multiplier`` (the heads widen with the model at a fixed
    ``num_heads``); set it to head_dim when the number of heads grows instead."""
    scan_layers: bool = True
    """Stack the blocks and scan over them (compile time flat in depth); False unrolls."""
    remat: RematPolicy = "minimal_with_context"
    """What each block's backward pass keeps of its forward pass, the rest recomputed: none, full,
    dots, minimal or minimal_with_context (``dew.models.stack``; measured in docs/performance.md)."""

    def __post_init__(self) -> None:
        check_positive(
            self, "input_size", "in_channels", "patch_size", "hidden_size", "depth", "num_heads", "mup_base_width"
        )
        if self.mup_base_head_dim is not None:
            check_positive(self, "mup_base_head_dim")
        check_divides(self, "num_heads", "hidden_size")
        if self.mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio={self.mlp_ratio} must be > 0")
        if self.num_classes < 0:
            raise ValueError(f"num_classes={self.num_classes} must be >= 0 (0 is unconditional)")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"vocab_size={self.vocab_size} must be >= 1")
        if self.vocab_size is not None and self.learn_sigma:
            raise ValueError(
                f"learn_sigma=True predicts image variances; token data (vocab_size={self.vocab_size}) has none"
            )
        if (self.hidden_size // 2) % 2:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be a multiple of 4 "
                "(the 2-D sin-cos position embedding splits it in four)"
            )
