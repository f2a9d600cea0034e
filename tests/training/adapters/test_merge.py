"""Merging LoRA factors into the weights (``dew.training.adapters.merge.merged``), on a module built
by hand: no training, no compile."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew.config import LoRA, RunConfig
from dew.training.adapters.merge import MergeError, merged


class _Adapted(nnx.Module):
    """One weight and the factors qwix would put beside it (``_lora_b`` left out when ``b`` is None)."""

    def __init__(self, b: np.ndarray | None) -> None:
        self.kernel = nnx.Param(jnp.ones((2, 3), jnp.float32))
        self.kernel_lora_a = nnx.LoRAParam(jnp.asarray([[1.0], [2.0]], jnp.float32))
        if b is not None:
            self.kernel_lora_b = nnx.LoRAParam(jnp.asarray(b, jnp.float32))


def test_a_weight_becomes_w_plus_scale_a_b() -> None:
    run = RunConfig(lora=LoRA(rank=1, alpha=2.0))
    out = merged(_Adapted(np.asarray([[1.0, 0.0, -1.0]])), run)
    assert sorted(out) == ["kernel"]
    np.testing.assert_array_equal(np.asarray(out["kernel"]), [[3.0, 1.0, -1.0], [5.0, 1.0, -3.0]])


def test_a_factor_without_its_partner_is_named() -> None:
    with pytest.raises(MergeError, match="^--merge-lora: kernel has the factor _lora_a without _lora_b$"):
        merged(_Adapted(None), RunConfig(lora=LoRA(rank=1, alpha=2.0)))
