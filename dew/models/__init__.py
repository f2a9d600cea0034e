"""The architecture registry and ``build``. This package file imports no JAX; ``build`` imports the
architecture's layers when it builds."""

from dew.models.flops import flops_per_example
from dew.spec.models import Architecture, QKClipLayer, architectures, build, of, resolve_fields, with_data_fields

__all__ = ["Architecture", "QKClipLayer", "architectures", "build", "flops_per_example", "of", "resolve_fields",
           "with_data_fields"]
