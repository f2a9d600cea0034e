"""The run's precision settings as the layers take them: compute dtype, storage dtype, matmul precision.

Every layer of dew's models is built with ``Precision.linear_kwargs`` (or the dtype pair for norms and
embeddings), so one record decides what each matmul computes in (``dtype``), what each parameter is
stored in (``param_dtype``) and what each matmul asks XLA for (``matmul``, passed as ``precision=``).
Flax computes in float32 when ``dtype`` is unset; dew always sets it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from dew.contract.models import PrecisionFields

LAX_PRECISION = {  # matmul_precision name -> jax.lax.Precision
    "default": jax.lax.Precision.DEFAULT,
    "high": jax.lax.Precision.HIGH,
    "highest": jax.lax.Precision.HIGHEST,
}


@dataclasses.dataclass(frozen=True)
class Precision:
    """Compute dtype, parameter dtype and matmul precision of one model."""

    dtype: jnp.dtype
    """Compute dtype of every layer (``jnp.float32``, ``jnp.bfloat16``, ...)."""
    param_dtype: jnp.dtype
    """Storage dtype of every parameter."""
    matmul: str
    """``default``, ``high`` or ``highest``: what every matmul asks XLA for."""

    @classmethod
    def of(cls, record: PrecisionFields) -> Precision:
        """Read the precision fields of an architecture's fields record."""
        return cls(jnp.dtype(record.dtype), jnp.dtype(record.param_dtype), record.matmul_precision)

    @property
    def lax(self) -> jax.lax.Precision:
        """``matmul`` as the ``precision=`` argument of ``dot_general`` / ``einsum``."""
        return LAX_PRECISION[self.matmul]

    @property
    def dtypes(self) -> dict[str, Any]:
        """Keyword arguments of layers without a matmul (norms, embeddings)."""
        return {"dtype": self.dtype, "param_dtype": self.param_dtype}

    @property
    def linear_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of every ``nnx.Linear`` / ``nnx.LinearGeneral``."""
        return {**self.dtypes, "precision": self.lax}
