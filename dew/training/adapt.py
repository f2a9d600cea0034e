"""Wrapping the module an objective trains before the run initialises it: quantized training and
LoRA (qwix). With neither set, the module is returned as it is and every ``nnx.Param`` trains."""

from __future__ import annotations

from typing import Any

from flax import nnx

from dew.config import LoRA, Quantization


def adapt(objective: Any, module: nnx.Module, dataset: Any, *, quantization: Quantization | None,
          lora: LoRA | None, seed: int) -> nnx.Module:
    """``module`` with the quantized forward and/or the low-rank adapters the run asks for."""
    if quantization is None and lora is None:
        return module
    raise ValueError("trainer.quantization and lora are not wired to qwix yet")  # replaced with the qwix wrap


def trainable(lora: LoRA | None) -> Any:
    """The nnx filter of the leaves the optimizer moves: every parameter, or only LoRA's factors."""
    return nnx.Param
