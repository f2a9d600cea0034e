"""The logical axis names: the vocabulary every parameter and main activation names its dimensions
with, and ``trainer.layout.rules`` maps to mesh axes (``dew.models.axes`` applies them).

It is part of the contract because the config validates a rule's name against it on a login node,
before anything imports JAX. An architecture registered later names its dimensions with these words
(or adds its own here).
"""

from __future__ import annotations

LOGICAL_AXES: dict[str, str] = {
    "batch": "examples of a batch (activations)",
    "length": "positions of a sequence: tokens or image patches (activations)",
    "embed": "the model width: the residual stream and every matrix that reads or writes it",
    "mlp": "the hidden width of an MLP",
    "heads": "attention query heads",
    "kv_heads": "attention key/value heads (grouped-query attention)",
    "kv": "features of one attention head (head_dim)",
    "vocab": "token vocabulary: the embedding table and the logits",
    "layers": "the stacked blocks of a scanned stack (dew.models.stack)",
    "modulation": "DiT's adaLN outputs: shift, scale and gate of each sub-layer (6 x embed)",
    "classes": "class labels of a label embedding (num_classes + 1 rows)",
    "features": "per-example input or output features outside the model width: pixels of a patch, timestep frequencies",
}
"""Logical axis name -> what it names."""
