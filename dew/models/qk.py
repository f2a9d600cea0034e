"""Where each architecture keeps its attention's query and key projections, for MuonClip's QK-clip
(``dew.training.muon.qk_clip``, Kimi K2 tech report, section 2.1).

Both architectures stack their blocks on a leading depth axis (scanned or not), so one
``QKClipLayer`` named ``"attn"`` covers every layer, and the model's ``(depth, heads)`` max logits
(``return_max_logits=True``) line up with the leaves' leading axes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dew.models.registry import resolve_fields
from dew.training.muon import QKClipLayer

LAYER = "attn"
"""The name the trainer gives the model's max logits when it hands them to ``qk_clip``."""


def qk_clip_layers(architecture: str, fields: Mapping[str, Any]) -> dict[str, QKClipLayer]:
    """The QK-clip layer description of ``architecture`` built from ``fields`` (its model config).

    Raises for an architecture without one, and for QK-norm: an RMSNorm on each head's queries and
    keys divides the projection's scale away, so the clip could not cap a logit.
    """
    f = resolve_fields(architecture, fields)
    if architecture == "simple_dit":
        return {LAYER: QKClipLayer(query=("blocks/attn/q/kernel", "blocks/attn/q/bias"),
                                   key=("blocks/attn/k/kernel", "blocks/attn/k/bias"),
                                   num_heads=f.num_heads, split_heads=True)}
    if architecture == "transformer":
        if f.qk_norm:
            raise ValueError("optim.optimizer='muonclip' with model.config.qk_norm=true: QK-norm normalises "
                             "the query and key scale away, so QK-clip cannot cap the logits; use one of them")
        return {LAYER: QKClipLayer(query=("blocks/attn/q/kernel",), key=("blocks/attn/k/kernel",),
                                   num_heads=f.num_heads, num_kv_heads=f.num_kv_heads, split_heads=True)}
    raise ValueError(f"optim.optimizer='muonclip': architecture {architecture!r} has no QK-clip layer description "
                     "(dew.models.qk); use muon")
