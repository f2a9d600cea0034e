"""Objectives: what a model learns, how it is evaluated and how it samples.

Each objective owns its loss, its evaluation metrics and its sampler: the trainer hands it the module
and the batch and never sees timesteps, noise or masks. The registry maps a name to the module that
builds it; ``natural_objective`` picks the objective an architecture and a dataset imply. This package
file imports no JAX.
"""

from __future__ import annotations

from dew.registry import unknown_name

objectives: dict[str, str] = {
    "flow_matching": "dew.objectives.flow_matching:FlowMatching",
    "masked_diffusion": "dew.objectives.masked_diffusion:MaskedDiffusion",
    "next_token": "dew.objectives.next_token:NextToken",
}
"""Objective name -> ``module:class``."""

_natural = {
    ("simple_dit", "image"): "flow_matching",
    ("simple_dit", "tokens"): "masked_diffusion",
    ("transformer", "tokens"): "next_token",
}
"""(architecture, data kind) -> the objective that trains it; the only pairs that train."""


def natural_objective(architecture: str, data_kind: str) -> str:
    """The objective an architecture trains on data of ``data_kind`` (image or tokens)."""
    try:
        return _natural[(architecture, data_kind)]
    except KeyError:
        raise ValueError(f"no objective trains model.architecture={architecture!r} on {data_kind} data; "
                         f"pairs are {', '.join(f'{a} on {k} ({o})' for (a, k), o in _natural.items())}") from None


def check_objective(name: str, architecture: str, data_kind: str) -> None:
    """Raise if objective ``name`` is unknown or cannot train this architecture on this data."""
    if name not in objectives:
        raise unknown_name("objective", name, objectives)
    if _natural.get((architecture, data_kind)) != name:
        pairs = [f"{a} on {k}" for (a, k), o in _natural.items() if o == name]
        raise ValueError(f"objective={name!r} cannot train model.architecture={architecture!r} on "
                         f"{data_kind} data; it trains {', '.join(pairs)}")
