"""Optimizers: the registry, the chain a run trains with, each rule, bf16 moments, schedules, muP."""
