"""dew: a Hydra-driven experiment framework for training JAX models.

Importing ``dew`` (and ``dew.contract.config``) does not import JAX: composing and validating a run takes
milliseconds on a login node. The JAX stack lives in ``dew.models``, ``dew.objectives`` and
``dew.training`` and is imported where a run is built.
"""

__version__ = "0.1.0"
