"""``dew-runs plot``: metric curves, one line per run, and for a sweep the final metric against each
swept value.

``plot_data`` prepares every number the figure shows (tested against the journals); ``draw``
only draws it, with matplotlib's non-interactive Agg backend (no display needed on a cluster).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dew.contract.data import datasets
from dew.contract.dynamics import KINDS, split
from dew.contract.models import architectures
from dew.contract.objectives import natural_objective, objectives
from dew.runs.status import ENDED, Run
from dew.runs.table import differing_fields, flatten, number, short_names

UNITS = {
    "train/lr": "learning rate",
    "train/grad_norm": "global L2 norm",
    "perf/examples_per_sec": "examples/s",
    "perf/tokens_per_sec": "tokens/s",
    "perf/flops_per_sec": "FLOP/s",
    "perf/mfu": "fraction of peak FLOP/s",
    "eval/bits_per_token": "bits/token",
    "train/loss_scale": "loss scale",
}

if TYPE_CHECKING:
    from matplotlib.axes import Axes


@dataclasses.dataclass
class Curve:
    """One metric of one run, as plotted."""

    run: str
    label: str
    metric: str
    steps: list[int]
    values: list[float]
    smoothed: list[float] | None
    finished: bool


@dataclasses.dataclass
class SweepPoint:
    """A run's final value of ``metric`` against its value of a swept ``field``."""

    run: str
    field: str
    metric: str
    x: Any
    y: float
    finished: bool


@dataclasses.dataclass
class PlotData:
    metrics: list[str]
    curves: list[Curve]
    fields: list[str]
    """The swept fields (scalar-valued config fields that differ between the runs)."""
    points: list[SweepPoint]
    units: dict[str, str]


def smooth(values: Sequence[float], weight: float) -> list[float]:
    """An exponential moving average with TensorBoard's debiasing: with weight w the smoothed value
    is sum_i w^(t-i) (1-w) x_i / (1 - w^(t+1)); non-finite values are passed through, not averaged."""
    out, average, count = [], 0.0, 0
    for v in values:
        if not math.isfinite(v):
            out.append(v)
            continue
        average, count = weight * average + (1 - weight) * v, count + 1
        out.append(average / (1 - weight**count))
    return out


def objective_of(record: dict[str, Any] | None) -> str | None:
    """The objective a record trains (named, or the one dew picks for its model and data); None
    where the record names parts this installation does not know."""
    if record is None:
        return None
    if record.get("objective"):
        return record["objective"]
    model, data = record.get("model") or {}, record.get("data") or {}
    arch, dataset = model.get("architecture"), data.get("name") if isinstance(data, dict) else None
    if (
        not isinstance(arch, str)
        or not isinstance(dataset, str)
        or arch not in architectures
        or dataset not in datasets
    ):
        return None
    try:
        return natural_objective(architectures[arch].role, datasets[dataset].kind)
    except ValueError:
        return None


def unit(metric: str, runs: Sequence[Run]) -> str:
    if metric in UNITS:
        return UNITS[metric]
    if metric.endswith("/loss"):
        kinds = {objective_of(r.record) for r in runs} - {None}
        if len(kinds) != 1:
            return "loss"
        name = kinds.pop()
        return objectives[name].loss_unit if name is not None and name in objectives else "loss"
    return ""


def labels(runs: Sequence[Run]) -> dict[str, str]:
    """Each run's legend label: the fields it differs in (short names), else its name."""
    keys = differing_fields(runs)
    heads = short_names(keys)
    out = {}
    for run in runs:
        flat = flatten(run.record) if run.record is not None else {}
        text = ", ".join(f"{heads[k]}={number(flat.get(k))}" for k in keys)
        out[run.summary.name] = text or run.summary.name
    if len(set(out.values())) < len(out):  # runs alike in every field: tell them apart by name
        out = {name: (f"{name}: {text}" if text != name else name) for name, text in out.items()}
    return out


def plot_data(runs: Sequence[Run], metrics: Sequence[str], *, smoothing: float = 0.0) -> PlotData:
    """Everything the figure shows, from the journals."""
    names = labels(runs)
    curves = []
    for metric in metrics:
        for run in runs:
            if run.journal is None:
                continue
            steps, values = run.journal.series(metric)
            if not steps:
                continue
            label = names[run.summary.name]
            if run.summary.status != "finished":
                label += f" ({run.summary.status})"
            curves.append(
                Curve(
                    run=run.summary.name,
                    label=label,
                    metric=metric,
                    steps=steps,
                    values=values,
                    smoothed=smooth(values, smoothing) if smoothing > 0 else None,
                    finished=run.summary.status in ENDED,
                )
            )
    fields = (
        [
            k
            for k in differing_fields(runs)
            if all(
                isinstance(flatten(r.record).get(k), (int, float, str, bool, type(None)))
                for r in runs
                if r.record is not None
            )
        ]
        if len(runs) > 1
        else []
    )
    points = []
    for field in fields:
        for metric in metrics:
            for run in runs:
                if run.record is None or run.journal is None:
                    continue
                _, values = run.journal.series(metric)
                if values and math.isfinite(values[-1]):
                    points.append(
                        SweepPoint(
                            run=run.summary.name,
                            field=field,
                            metric=metric,
                            x=flatten(run.record).get(field),
                            y=values[-1],
                            finished=run.summary.status in ENDED,
                        )
                    )
    return PlotData(
        metrics=list(metrics), curves=curves, fields=fields, points=points, units={m: unit(m, runs) for m in metrics}
    )


LEGEND_MAX = 12
"""Runs a panel labels in its legend; past that the legend would crowd out the plot."""
PANEL = (5.6, 4.0)
"""Inches of one panel; at DPI dots per inch a figure is 560 x 400 pixels per panel."""
DPI = 100


def draw(data: PlotData, output: str, *, logx: bool = False, logy: bool = False) -> tuple[int, int]:
    """Write the figure to ``output`` (PNG or SVG, by its suffix); returns its size in pixels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols, rows = max(len(data.metrics), 1), 1 + len(data.fields)
    fig, axes = plt.subplots(
        rows, cols, figsize=(PANEL[0] * cols, PANEL[1] * rows), dpi=DPI, squeeze=False, layout="constrained"
    )
    colors: dict[str, str] = {}
    for curve in data.curves:
        colors.setdefault(curve.run, f"C{len(colors) % 10}")
    for j, metric in enumerate(data.metrics):
        ax = axes[0][j]
        for curve in (c for c in data.curves if c.metric == metric):
            style = dict(
                color=colors[curve.run],
                linestyle="-" if curve.finished else "--",
                marker="o" if len(curve.steps) <= 20 else None,
                markersize=3,
            )
            if curve.smoothed is not None:
                ax.plot(curve.steps, curve.values, color=colors[curve.run], alpha=0.25, linewidth=1)
                ax.plot(curve.steps, curve.smoothed, label=curve.label, **style)
            else:
                ax.plot(curve.steps, curve.values, label=curve.label, **style)
        ax.set_title(metric)
        ax.set_xlabel("step (optimizer updates)")
        ax.set_ylabel(f"{metric} ({data.units[metric]})" if data.units[metric] else metric)
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        shown = [c for c in data.curves if c.metric == metric]
        if 0 < len(shown) <= LEGEND_MAX:
            ax.legend(fontsize="small")
        elif shown:
            ax.text(
                0.98,
                0.98,
                f"{len(shown)} runs: too many to label (pick some with --where)",
                ha="right",
                va="top",
                fontsize="small",
                transform=ax.transAxes,
            )
        else:
            ax.text(0.5, 0.5, f"no run logged {metric}", ha="center", va="center", transform=ax.transAxes)
    for i, field in enumerate(data.fields, start=1):
        for j, metric in enumerate(data.metrics):
            _final_against(axes[i][j], data, field, metric, colors, logy=logy)
    fig.savefig(output, dpi=DPI)
    width, height = (round(v * DPI) for v in fig.get_size_inches())
    plt.close(fig)
    return width, height


def _final_against(ax: Axes, data: PlotData, field: str, metric: str, colors: dict[str, str], *, logy: bool) -> None:
    """One panel of a sweep's row: each run's final ``metric`` against its value of ``field``."""
    points = sorted(
        (p for p in data.points if p.field == field and p.metric == metric), key=lambda p: (str(type(p.x)), p.x)
    )
    numeric = all(isinstance(p.x, (int, float)) and not isinstance(p.x, bool) for p in points)
    xs: list[Any] = [p.x if numeric else number(p.x) for p in points]  # numbers when numeric, else their text
    if numeric and len(set(xs)) == len(xs):  # a one-field sweep: a line through its points
        ax.plot(xs, [p.y for p in points], color="0.5", linewidth=1)
    for p, x in zip(points, xs):
        ax.plot(
            [x],
            [p.y],
            "o",
            color=colors.get(p.run, "C0"),
            markersize=7,
            markerfacecolor=colors.get(p.run, "C0") if p.finished else "white",
        )
    if numeric and points and min(xs) > 0 and max(xs) / min(xs) >= 10:
        ax.set_xscale("log")
    if numeric and 0 < len(set(xs)) <= 12:  # tick the swept values themselves, as they were given
        from matplotlib.ticker import NullFormatter

        ax.set_xticks(sorted(set(xs)), [number(x) for x in sorted(set(xs))])
        ax.xaxis.set_minor_formatter(NullFormatter())
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(field)
    ax.set_ylabel(f"final {metric} ({data.units[metric]})" if data.units[metric] else f"final {metric}")
    ax.set_title(
        f"final {metric} against {field}" + ("" if all(p.finished for p in points) else " (hollow: not finished)"),
        fontsize="medium",
    )
    ax.grid(alpha=0.3)


def dynamics_series(run: Run) -> dict[str, dict[str, dict[int, tuple[list[int], list[float]]]]]:
    """A run's training dynamics (``dew.training.dynamics``) as kind -> module -> block -> (steps,
    values): ``blocks_3_attn`` is module ``attn`` of block 3; a group of no block (``embed``) is
    its own module at block -1; the activations' module is ``output``."""
    out: dict[str, dict[str, dict[int, tuple[list[int], list[float]]]]] = {}
    names = sorted(run.journal.metric_names()) if run.journal is not None else []
    for name in names:
        parsed = split(name)
        if parsed is None or run.journal is None:
            continue
        kind, group = parsed
        parts = group.split("_")
        index = next((i for i, p in enumerate(parts) if p.isdigit()), None)
        if index is None:
            module, block = group, -1
        else:
            module, block = "_".join(parts[index + 1 :]) or "output", int(parts[index])
        out.setdefault(kind, {}).setdefault(module, {})[block] = run.journal.series(name)
    return {k: out[k] for k in KINDS if k in out}


def draw_dynamics(run: Run, output: str) -> tuple[int, int]:
    """One row per kind of dynamics metric, one panel per module, one line per block (coloured from
    the first block, dark, to the last, light), log-scaled: RMS values span decades."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = dynamics_series(run)
    rows, cols = len(series), max(len(m) for m in series.values())
    fig, axes = plt.subplots(
        rows, cols, figsize=(PANEL[0] * cols, PANEL[1] * rows), dpi=DPI, squeeze=False, layout="constrained"
    )
    for i, (kind, modules) in enumerate(series.items()):
        for j, (module, blocks) in enumerate(modules.items()):
            ax = axes[i][j]
            depth = max(blocks) + 1
            cmap = matplotlib.colormaps["viridis"]
            for block, (steps, values) in sorted(blocks.items()):
                color = "0.3" if block < 0 else cmap(block / max(depth - 1, 1) * 0.9)
                ax.plot(steps, values, color=color, label=f"block {block}" if block >= 0 else module, linewidth=1.2)
            ax.set_title(f"{kind}: {module}", fontsize="medium")
            ax.set_xlabel("step (optimizer updates)")
            ax.set_ylabel(kind.replace("_", " "))
            if all(v > 0 for _, vs in blocks.values() for v in vs if math.isfinite(v)):
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
            if len(blocks) <= LEGEND_MAX:
                ax.legend(fontsize="x-small")
        for j in range(len(modules), cols):
            axes[i][j].axis("off")
    fig.suptitle(f"training dynamics of {run.summary.name}")
    fig.savefig(output, dpi=DPI)
    width, height = (round(v * DPI) for v in fig.get_size_inches())
    plt.close(fig)
    return width, height
