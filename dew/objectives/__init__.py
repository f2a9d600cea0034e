"""Objectives: what a model learns, how it is evaluated and how it samples.

Each objective owns its loss, its evaluation metrics and its sampler: the trainer hands it the module
and the batch and never sees timesteps, noise or masks. The registry of objectives is the
contract's (``dew.contract.objectives``, handed on here); ``natural_objective`` picks the one an architecture's role
and a dataset's
kind imply. This package file imports no JAX.
"""

from __future__ import annotations

from dew.contract.objectives import ObjectiveSpec, check_objective, natural_objective, objectives

__all__ = ["ObjectiveSpec", "check_objective", "natural_objective", "objectives"]
