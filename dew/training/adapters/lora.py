"""LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") with qwix.

Each matmul against a weight ``W`` in a module whose path fully matches one of ``lora.targets``
becomes ``x·W + (alpha / rank) · (x·A)·B``: ``A`` is ``(fan in, rank)``, He-uniform from the run's
seed, ``B`` is ``(rank, fan out)`` and zero, so the adapted model computes exactly what the base model
does until the first update (§4.1). The factors are ``nnx.LoRAParam`` attributes named
``<weight>_lora_a`` / ``<weight>_lora_b`` next to the weight they adapt (``blocks/attn/q/kernel_lora_a``),
in the weight's dtype; in a stack of blocks they are stacked on the leading ``depth`` axis like the
weights. Only they train: ``trainable(lora)`` is ``nnx.LoRAParam`` and every ``nnx.Param`` stays what
the seed initialised, or what ``trainer.init_from`` loaded (``dew.training.checkpointing.warmstart``).

With ``trainer.quantization`` as well, the frozen base matmul is the quantized-training one
(``dew.training.adapters.quantization``: fake-quantized operands, straight-through gradients, so gradients
still flow through every frozen layer to the factors below it) and the delta ``(x·A)·B`` is added in
the compute dtype: the QLoRA arrangement (Dettmers et al. 2023) with the base stored in its
``param_dtype`` rather than packed to 4 bits.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import qwix
from flax import nnx

from dew import compat
from dew.contract.config import LoRA, Quantization
from dew.training.adapters import quantization as quant


@dataclasses.dataclass(frozen=True, kw_only=True)
class QLoraRule(qwix.LoraRule, qwix.QtRule):
    """A LoRA rule whose base matmul is quantized for training (``qwix.QtRule``'s fields)."""


class _QtBase(qwix.PtqProvider):
    """``QtProvider``'s matmuls under ``PtqProvider``'s name, for ``QLoraProvider``'s MRO."""

    dot_general = qwix.QtProvider.dot_general
    einsum = qwix.QtProvider.einsum
    conv_general_dilated = qwix.QtProvider.conv_general_dilated


compat.qwix_convert_rules(  # each rule a QtRule, as QtProvider's matmuls expect
    _QtBase, lambda rule: rule if isinstance(rule, qwix.QtRule) else qwix.QtRule(**dataclasses.asdict(rule))
)
for _name, _method in compat.qwix_qt_provider_private().items():  # the private methods those matmuls call
    setattr(_QtBase, _name, _method)


class QLoraProvider(quant.ExactWeights, qwix.LoraProvider, _QtBase):
    """qwix's LoRA provider over quantized-training base matmuls instead of its PTQ ones.

    ``LoraProvider`` computes the base product with ``super()`` and adds the delta. Its own base is
    ``PtqProvider``'s, which replaces weights by stored quantized ones and has no straight-through
    gradient. The MRO here is ``LoraProvider -> _QtBase -> PtqProvider``, so that
    ``super()`` lands on ``QtProvider``'s matmuls: the delta is LoRA's, the base is what
    ``trainer.quantization`` trains through without LoRA.
    """


class LoraProvider(quant.ExactWeights, qwix.LoraProvider):
    """qwix's LoRA provider, one weight per matmul (``dew.training.adapters.quantization.one_weight_per_matmul``)."""


def provider(lora: LoRA, quantization: Quantization | None) -> qwix.LoraProvider:
    """The qwix provider of ``lora`` (and of ``quantization`` under it, when set).

    Rules are matched in order, the first whose pattern fully matches the module path wins: a
    targeted module that is also quantized, a targeted module, a quantized module.
    """
    adapter = dict(rank=lora.rank, alpha=lora.alpha)
    if quantization is None:
        return LoraProvider([qwix.LoraRule(module_path=t, **adapter) for t in lora.targets])
    q = quantization
    qtypes = dict(weight_qtype=q.weight_qtype, act_qtype=q.act_qtype, bwd_qtype=q.bwd_qtype, tile_size=q.tile_size)
    both = [QLoraRule(module_path=f"(?=(?:{q.module_path})$)(?:{t})", **adapter, **qtypes) for t in lora.targets]
    adapted = [QLoraRule(module_path=t, **adapter) for t in lora.targets]
    return QLoraProvider([*both, *adapted, quant.rule(q)])


def apply(
    module: nnx.Module, inputs: tuple[jax.Array, ...], lora: LoRA, quantization: Quantization | None, rngs: nnx.Rngs
) -> nnx.Module:
    """``module`` with LoRA factors on every targeted weight; ``A`` is drawn from ``rngs``."""
    if quantization is not None:
        quant.check_module_path(module, quantization.module_path, "trainer.quantization.module_path")
    try:
        adapted = qwix.apply_lora_to_model(module, provider(lora, quantization), *inputs, rngs=rngs)
    except ValueError as e:
        raise ValueError(
            f"lora={lora} with trainer.quantization={quantization}: qwix cannot adapt the module: {e}"
        ) from e
    check_targets(adapted, lora)
    return adapted


def check_targets(adapted: nnx.Module, lora: LoRA) -> None:
    """Raise, naming the pattern, if a target put a delta on no weight."""
    factors = ["/".join(map(str, path[:-1])) for path, _ in nnx.to_flat_state(nnx.state(adapted, nnx.LoRAParam))]
    for target in lora.targets:
        if not any(re.fullmatch(target, p) for p in factors):
            weighted = sorted(
                {"/".join(map(str, path[:-1])) for path, _ in nnx.to_flat_state(nnx.state(adapted, nnx.Param))}
            )
            raise ValueError(
                f"lora.targets pattern {target!r} matches no module with a weight matmul; "
                f"modules that can carry a delta: {', '.join(weighted)}"
            )
