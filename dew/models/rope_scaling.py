"""``RopeScaling``: the record of how a rotary embedding's frequencies are rescaled for a longer
context, a field of ``transformer`` (``model.config.rope_scaling``). Plain data, no JAX: the
architecture's fields (``dew.models.transformer``) hold it and the rotary tables
(``dew.models.attention.rope_frequencies``) read it, so it sits below both.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from dew.contract.models import check_positive

RopeType = Literal["linear", "llama3"]


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """A rescaling of the rotary embedding's frequencies for contexts longer than the model was
    first trained on, as Hugging Face's ``rope_scaling`` (``rope_parameters``) names it. The
    field names are Hugging Face's, so a Llama ``config.json``'s values copy over as they are."""

    rope_type: RopeType
    """``linear``: every frequency divided by ``factor`` (positions interpolated, Chen et al. 2023).
    ``llama3``: Llama 3.1's: frequencies whose wavelength exceeds ``original_max_position_embeddings
    / low_freq_factor`` divided by ``factor``, those shorter than ``original_max_position_embeddings /
    high_freq_factor`` kept, those between interpolated smoothly (``dew.models.attention.rope_frequencies``)."""
    factor: float
    """How much longer the context is made (Llama 3.1: 8)."""
    low_freq_factor: float = 1.0
    """``llama3`` only: the longest kept wavelength is ``original_max_position_embeddings / this``."""
    high_freq_factor: float = 4.0
    """``llama3`` only: wavelengths below ``original_max_position_embeddings / this`` are kept."""
    original_max_position_embeddings: int = 8192
    """``llama3`` only: the context length the model was first trained at (Llama 3: 8192 positions)."""

    def __post_init__(self) -> None:
        if self.factor <= 0:
            raise ValueError(f"rope_scaling.factor={self.factor} must be > 0")
        if self.rope_type == "llama3":
            check_positive(self, "original_max_position_embeddings")
            if not 0 < self.low_freq_factor < self.high_freq_factor:
                raise ValueError(
                    f"rope_scaling: low_freq_factor={self.low_freq_factor} and high_freq_factor="
                    f"{self.high_freq_factor} must satisfy 0 < low < high"
                )
