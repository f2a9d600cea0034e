"""dew's architectures and their layers. This package file hands on the architecture registry and
``build`` (defined in the contract, ``dew.contract.models``) under the names docs/models.md uses; it
imports no JAX, and ``build`` imports the architecture's layers when it builds."""

from dew.contract.models import Architecture, QKClipLayer, architectures, build, of, resolve_fields, with_data_fields
from dew.models.flops import flops_per_example

__all__ = [
    "Architecture",
    "QKClipLayer",
    "architectures",
    "build",
    "flops_per_example",
    "of",
    "resolve_fields",
    "with_data_fields",
]
