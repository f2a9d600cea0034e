"""The JAX trainer, optimizers and schedules. Submodules import JAX; this package file does not."""
