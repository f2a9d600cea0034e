"""``TransformerFields``: the fields of ``transformer`` (``model.config``), with their checks. Plain data,
no JAX, below both the registration (``dew.models.transformer``, whose ``build`` imports the layers)
and the layers (``dew.models.decoder``), which read them: neither imports the other for their type.
"""

from __future__ import annotations

import dataclasses

from dew.contract.models import PrecisionFields, check_divides, check_positive
from dew.contract.registry import RematPolicy
from dew.models.rope_scaling import RopeScaling


@dataclasses.dataclass(frozen=True)
class TransformerFields(PrecisionFields):
    """Fields of ``transformer``: a decoder-only causal LM (RMSNorm, RoPE, SwiGLU, GQA)."""

    vocab_size: int = 50304
    """Rows of the embedding and the head. From the data; may be set larger (padding rows no id of
    the data uses, as Qwen2.5's 151,936 rows for 151,665 tokens): the logits and the loss are over
    every row, sampling draws the data's ids alone."""
    seq_len: int = 1024
    """Longest sequence (RoPE is computed up to it). From the data."""
    hidden_size: int = 768
    """Model width."""
    depth: int = 12
    """Number of decoder blocks."""
    num_heads: int = 12
    """Query heads per block."""
    num_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); unset is ``num_heads`` (multi-head)."""
    head_dim: int | None = None
    """Features per head; unset is ``hidden_size // num_heads``."""
    mlp_hidden: int | None = None
    """SwiGLU hidden width; unset is 8/3·hidden_size rounded up to a multiple of 128."""
    qk_norm: bool = False
    """RMS-normalise queries and keys per head before RoPE (Qwen3's ``q_norm``/``k_norm``)."""
    qkv_bias: bool = False
    """Biases on the query, key and value projections, none on the output projection (Qwen2's
    attention)."""
    sliding_window: int | None = None
    """Positions each query attends to, its own included (Mistral's ``sliding_window``: query ``t``
    sees keys ``t - sliding_window + 1 .. t``); unset, every earlier position."""
    tie_embeddings: bool = False
    """Share the token embedding with the output head."""
    rope_theta: float = 10000.0
    """Base of the rotary position embedding's frequencies."""
    rope_scaling: RopeScaling | None = None
    """A rescaling of those frequencies (``{rope_type: llama3, factor: 8, ...}``: ``RopeScaling``);
    unset, none: the frequencies are ``rope_theta``'s."""
    norm_eps: float = 1e-6
    """Epsilon of every RMSNorm."""
    mup: bool = False
    """Apply muP's multipliers (lm-engine's, with the attention scale relative to the base width):
    logits / width multiplier, attention scaled by ``sqrt(base head_dim) / head_dim``, hidden
    matrices initialised with ``init_std / sqrt(width multiplier)``. At the base width the model is
    the standard one; ``model.config.mup=true`` also brings the optimizer's muP groups
    (``dew.training.optim.mup``)."""
    mup_base_width: int = 256
    """The width the muP multipliers are relative to (width multiplier = hidden_size / this)."""
    mup_base_head_dim: int | None = None
    """The head_dim at the base width, which muP's attention scale ``sqrt(this) / head_dim`` is
    relative to. Unset: ``head_dim / width multiplier``, the base width's head_dim when head_dim
    grows with the width at a fixed number of heads (as it does unset). Set it to head_dim when the
    heads grow instead (the scale is then the standard one at every width), or to 1 for
    lm-engine's plain ``1/head_dim``."""
    embedding_multiplier: float = 1.0
    """Scale of the token embedding's output."""
    residual_multiplier: float = 1.0
    """Scale of each block's branch before it joins the residual stream."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of every matrix."""
    scan_layers: bool = True
    """Stack the blocks and scan over them (compile time flat in depth); False unrolls."""
    remat: RematPolicy = "minimal_with_context"
    """What each block's backward pass keeps of its forward pass, the rest recomputed: none, full,
    dots, minimal or minimal_with_context (``dew.models.stack``; measured in docs/performance.md)."""

    def __post_init__(self) -> None:
        check_positive(self, "vocab_size", "seq_len", "hidden_size", "depth", "num_heads", "mup_base_width")
        if self.mup_base_head_dim is not None:
            check_positive(self, "mup_base_head_dim")
        if self.head_dim is None:
            check_divides(self, "num_heads", "hidden_size")
        head_dim = self.head_dim or self.hidden_size // self.num_heads
        if head_dim < 2 or head_dim % 2:
            raise ValueError(f"head_dim={head_dim} must be even (rotary embeddings rotate pairs)")
        if self.num_kv_heads is not None:
            check_positive(self, "num_kv_heads")
            check_divides(self, "num_kv_heads", "num_heads")
        if self.mlp_hidden is not None:
            check_positive(self, "mlp_hidden")
        if self.sliding_window is not None:
            check_positive(self, "sliding_window")
        if self.norm_eps <= 0 or self.init_std <= 0 or self.rope_theta <= 0:
            raise ValueError(
                f"norm_eps={self.norm_eps}, init_std={self.init_std} and rope_theta={self.rope_theta} must be > 0"
            )
