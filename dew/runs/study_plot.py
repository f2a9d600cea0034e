"""``dew-runs plot`` on a study: the objective against each searched parameter (one panel each, a
failed trial marked at the panel's foot) and the best value so far against the trial number.

Drawn with matplotlib's Agg backend, as the run plots are (``dew.runs.plot``).
"""

from __future__ import annotations

from dew.runs.study import Study

PANEL = (4.2, 3.2)
"""Inches per panel."""
DPI = 100
OBJECTIVE = "objective (each trial's selection value)"


def draw_study(study: Study, output: str) -> tuple[int, int]:
    """Write the study's figure to ``output`` (PNG or SVG, by its suffix); returns its size in pixels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    keys = sorted({k for t in study.trials for k in t.params})
    fig, axes = plt.subplots(
        1, len(keys) + 1, figsize=(PANEL[0] * (len(keys) + 1), PANEL[1]), dpi=DPI, squeeze=False, layout="constrained"
    )
    done = [t for t in study.trials if t.state == "complete" and t.value is not None]
    failed = [t for t in study.trials if t.state == "fail"]
    best = study.best
    for ax, key in zip(axes[0], keys):
        shown = [t for t in done if key in t.params]
        ax.plot([t.params[key] for t in shown], [t.value for t in shown], "o", color="C0", label="trial")
        if best is not None and key in best.params:
            ax.plot(
                [best.params[key]], [best.value], "*", color="C3", markersize=14, label=f"best (trial {best.number})"
            )
        lost = [t.params[key] for t in failed if key in t.params]
        if lost:
            ax.plot(
                lost,
                [0] * len(lost),
                "x",
                color="C3",
                transform=ax.get_xaxis_transform(),
                clip_on=False,
                label="failed",
            )
        if key in study.log_params:
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # 1, 2, 5 per decade: labels that fit
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.3g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.tick_params(axis="x", labelrotation=30)  # a narrow range gets many ticks; slanted, they stay apart
        ax.set_xlabel(key)
        ax.set_ylabel(OBJECTIVE)
        ax.set_title(f"objective against {key}", fontsize="medium")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    ax = axes[0][-1]
    so_far = study.best_so_far()
    ax.plot([t.number for t in done], [t.value for t in done], "o", color="0.6", label="trial")
    ax.step([n for n, _ in so_far], [v for _, v in so_far], where="post", color="C3", label="best so far")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial number")
    ax.set_ylabel(OBJECTIVE)
    ax.set_title(f"best so far ({study.direction})", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.suptitle(f"study {study.name}: {len(study.trials)} trials, {len(failed)} failed", fontsize="medium")
    fig.savefig(output, dpi=DPI)
    width, height = (round(v * DPI) for v in fig.get_size_inches())
    plt.close(fig)
    return width, height
