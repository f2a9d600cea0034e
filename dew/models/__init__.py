"""The architecture registry and ``build``. This package file imports no JAX; ``build`` imports the
architecture's module when it builds."""

from dew.models.flops import flops_per_example
from dew.models.registry import Architecture, architectures, build, resolve_fields, with_data_fields

__all__ = ["Architecture", "architectures", "build", "flops_per_example", "resolve_fields",
           "with_data_fields"]
