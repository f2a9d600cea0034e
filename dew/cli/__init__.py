"""Command-line entry points: ``dew-train`` (Hydra) and ``dew-sample``."""
