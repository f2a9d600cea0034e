"""A search's space, from Hydra's sweep grammar to Optuna's distributions (``hydra.sweeper.params`` and
the command line's sweeps; docs/search.md).

| override | Optuna distribution |
|---|---|
| ``choice(a, b, ...)``, ``shuffle(range(...))`` | ``CategoricalDistribution`` of the values |
| ``range(a, b[, step])``: ints | ``IntDistribution(a, last, step=step)``, ``last`` the range's last value |
| ``range(a, b, step)``: a float among them | ``FloatDistribution(a, last, step=step)`` |
| ``interval(a, b)`` | ``FloatDistribution(a, b)``: Hydra's interval is floats, even between ints |
| ``int(interval(a, b))`` | ``IntDistribution(a, b)`` |
| ``tag(log, ...)`` of an interval | the same with ``log=True`` |
| ``key=value`` | a fixed value (it takes ``key`` out of the space) |

These are the meanings hydra-optuna-sweeper gave them, but for ``range``: Hydra's ``range(a, b)``
stops before ``b`` (a grid sweep of it runs ``b - a`` jobs), and so does its search here (the plugin
drew ``b`` too).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override, RangeSweep, Transformer
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution


def parse(arguments: Sequence[str]) -> tuple[dict[str, BaseDistribution], dict[str, Any]]:
    """(distributions, fixed values) of overrides in Hydra's grammar; a later key replaces an earlier
    one, and a fixed value takes its key out of the space."""
    space: dict[str, BaseDistribution] = {}
    fixed: dict[str, Any] = {}
    for override in OverridesParser.create().parse_overrides(list(arguments)):
        key = override.get_key_element()
        if override.is_sweep_override():
            space[key] = distribution(override)
            fixed.pop(key, None)
        else:
            fixed[key] = override.get_value_element_as_str()
            space.pop(key, None)
    return space, fixed


def distribution(override: Override) -> BaseDistribution:
    """The Optuna distribution of one sweep override (the table above)."""
    value = override.value()
    if override.is_choice_sweep() or (isinstance(value, RangeSweep) and value.shuffle):
        choices: list[Any] = list(override.sweep_iterator(transformer=Transformer.encode))
        return CategoricalDistribution(choices)
    if isinstance(value, RangeSweep):
        values: list[Any] = list(override.sweep_iterator())
        if not values:
            raise ValueError(f"{override.input_line}: the range is empty")
        step: Any = value.step
        if any(isinstance(v, float) for v in (value.start, value.stop, step)):
            return FloatDistribution(float(values[0]), float(values[-1]), step=float(step))
        return IntDistribution(int(values[0]), int(values[-1]), step=int(step))
    if isinstance(value, IntervalSweep):
        log = "log" in value.tags
        start: Any = value.start
        end: Any = value.end
        if isinstance(start, int) and isinstance(end, int):
            return IntDistribution(start, end, log=log)
        return FloatDistribution(float(start), float(end), log=log)
    raise ValueError(f"{override.input_line}: a search takes choice, range or interval sweeps (docs/search.md)")


def grid(space: dict[str, BaseDistribution]) -> dict[str, list[Any]]:
    """Every value of each distribution, for Optuna's ``GridSampler``; ``ValueError`` naming a key
    whose values are not countable (an interval of floats)."""
    out = {}
    for key, dist in space.items():
        if isinstance(dist, CategoricalDistribution):
            out[key] = list(dist.choices)
        elif isinstance(dist, (IntDistribution, FloatDistribution)) and dist.step is not None and not dist.log:
            count = math.floor((dist.high - dist.low) / dist.step + 1e-9) + 1
            out[key] = [dist.low + i * dist.step for i in range(count)]
        else:
            raise ValueError(
                f"{key} is searched over {dist}: hydra/sweeper/sampler=grid takes choice(...) or range(...), "
                "values it can count"
            )
    return out


def lows(space: dict[str, BaseDistribution]) -> dict[str, Any]:
    """Each interval's or range's low end (a choice's values are each a trial's)."""
    return {k: d.low for k, d in space.items() if isinstance(d, (IntDistribution, FloatDistribution))}


def is_float(dist: BaseDistribution) -> bool:
    """Whether ``dist`` samples floats (an ``interval(a, b)`` with no ``int(...)``)."""
    return isinstance(dist, FloatDistribution)
