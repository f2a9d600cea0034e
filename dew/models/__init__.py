"""The architecture registry and ``build``. This package file imports no JAX; ``build`` imports the
architecture's module when it builds."""

from dew.models.registry import Architecture, architectures, build

__all__ = ["Architecture", "architectures", "build"]
