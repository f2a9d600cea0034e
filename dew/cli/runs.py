"""``dew-runs``: the runs in a checkpoint or sweep directory, read from their files alone.

    dew-runs checkpoints/lr-sweep                             # one row per run, swept fields as columns
    dew-runs checkpoints --sort eval/loss --where 'optim.learning_rate<1e-3'
    dew-runs checkpoints/lr-sweep --json                      # for scripts
    dew-runs diff checkpoints/lr-sweep/0-... checkpoints/lr-sweep/1-...
    dew-runs plot checkpoints/lr-sweep --metric train/loss,eval/loss -o lr-sweep.png
    dew-runs show checkpoints/digits
    dew-runs goodput checkpoints/lr-sweep -o goodput.png       # where each run's wall time went, and the sweep's slots
    dew-runs checkpoints/digits-sweep-1a2b3c4d5e                # a study (hydra/sweeper=optuna): its trials, best first
    dew-runs plot checkpoints/digits-sweep-1a2b3c4d5e -o study.png

No JAX is imported and nothing is written (except the plot): it is safe beside a run in progress.
A damaged run directory is listed with what is wrong with it; a directory or an option that cannot
be read ends with one message and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from dew.commandline.console import console_script
from dew.commandline.exits import EXIT_BAD_INPUT
from dew.runs import table
from dew.runs.compare import diff_text
from dew.runs.discover import RunsError, find_runs
from dew.runs.goodput import Ledger, draw_ledgers, ledger, ledger_text, sweep_slots, sweep_total
from dew.runs.plot import draw, draw_dynamics, dynamics_series, plot_data
from dew.runs.show import show_text
from dew.runs.status import Run, read_run
from dew.runs.study import Study, read_study, study_text
from dew.runs.study_plot import draw_study
from dew.runs.study_storage import has_study

COMMANDS = ("list", "diff", "plot", "show", "goodput")


def load_runs(directories: Sequence[str], tracking: str | None = None) -> list[Run]:
    """Every run at or under the directories, named by their path below the directory given."""
    runs = []
    for directory in directories:
        root = os.path.normpath(directory)
        for path in find_runs(root):
            rel = (
                os.path.relpath(os.fspath(path), root) if "://" not in root else os.fspath(path)[len(root) :].strip("/")
            )
            name = os.path.basename(root.rstrip("/")) if rel in (".", "") else rel
            runs.append(read_run(path, name, tracking=tracking))
    return runs


def _parser(command: str) -> argparse.ArgumentParser:
    prog = "dew-runs" if command == "list" else f"dew-runs {command}"
    p = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.split("\n\n")[0] if command == "list" else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands: dew-runs [list] DIR..., dew-runs diff A B, dew-runs plot DIR..., dew-runs show RUN, "
        "dew-runs goodput DIR..."
        if command == "list"
        else None,
    )
    p.add_argument(
        "--tracking",
        help="the tracking directory the journals are in, when not tracking/ beside "
        "the checkpoint directory (default: $DEW_TRACKING_DIR, else found)",
    )
    if command == "list":
        p.add_argument(
            "dirs",
            nargs="*",
            default=["checkpoints"],
            metavar="DIR",
            help="run, sweep or checkpoint directories (default: checkpoints)",
        )
        p.add_argument(
            "--sort",
            metavar="KEY",
            help="order by a metric (eval/loss is the best, others the last "
            "value), a config field or a column (step, wall, status)",
        )
        p.add_argument("--reverse", action="store_true", help="largest first")
        p.add_argument(
            "--where",
            action="append",
            default=[],
            metavar="EXPR",
            help="keep runs where KEY OP VALUE holds (OP: < <= > >= = !=); repeatable, all must hold",
        )
        p.add_argument("--json", action="store_true", help="a JSON list of the rows, for scripts")
    elif command == "diff":
        p.add_argument("a", metavar="A", help="a run directory")
        p.add_argument("b", metavar="B", help="another run directory")
        p.add_argument("--metric", default="train/loss", help="the metric whose first differing step is reported")
    elif command == "plot":
        p.add_argument("dirs", nargs="*", default=["checkpoints"], metavar="DIR")
        p.add_argument("--metric", default="train/loss,eval/loss", help="comma-separated metrics, one panel each")
        p.add_argument("-o", "--output", default="runs.png", help="the file to write; .svg for SVG (default: runs.png)")
        p.add_argument("--logx", action="store_true", help="log-scale steps")
        p.add_argument("--logy", action="store_true", help="log-scale metric values")
        p.add_argument(
            "--smooth",
            type=float,
            default=0.0,
            metavar="W",
            help="exponential moving average weight in [0, 1) (0.9 smooths strongly; default 0: raw)",
        )
        p.add_argument("--where", action="append", default=[], metavar="EXPR", help="as for the list")
        p.add_argument(
            "--dynamics",
            action="store_true",
            help="draw one run's training dynamics (trainer.dynamics_every): a row per kind, a panel "
            "per module, a line per block",
        )
    elif command == "goodput":
        p.add_argument("dirs", nargs="*", default=["checkpoints"], metavar="DIR")
        p.add_argument("-o", "--output", help="also draw the ledgers to this file (.png or .svg)")
    else:
        p.add_argument("run", metavar="RUN", help="a run directory")
    return p


def _select(runs: list[Run], where: Sequence[str]) -> list[Run]:
    for expression in where:
        keep = table.parse_where(expression, runs)
        runs = [r for r in runs if keep(r)]
    return runs


def _one(path: str, tracking: str | None) -> Run:
    runs = load_runs([path], tracking)
    if len(runs) != 1 or os.path.normpath(os.fspath(runs[0].path)) != os.path.normpath(path):
        raise RunsError(f"{path!r} is not a run directory (it holds {len(runs)} runs: give one of them)")
    return runs[0]


def run(argv: Sequence[str]) -> str:
    """Run one dew-runs command and return what it prints; raises RunsError for bad input."""
    argv = list(argv)
    command = argv.pop(0) if argv and argv[0] in COMMANDS else "list"
    args = _parser(command).parse_args(argv)
    if command == "list":
        runs = load_runs(args.dirs, args.tracking)
        studies = _studies(args.dirs, args.tracking) if not (args.json or args.sort or args.where) else ""
        keys = table.fill_fields(runs)
        runs = _select(runs, args.where)
        if args.sort:
            runs = table.sort_runs(runs, args.sort, reverse=args.reverse)
        if args.json:
            return table.to_json(runs)
        return studies + (table.render(runs, keys) if runs else f"no runs in {', '.join(args.dirs)}")
    if command == "diff":
        return diff_text(_one(args.a, args.tracking), _one(args.b, args.tracking), args.metric)
    if command == "show":
        return show_text(_one(args.run, args.tracking))
    if command == "goodput":
        return _goodput(args)
    if not 0.0 <= args.smooth < 1.0:
        raise RunsError(f"--smooth {args.smooth}: the weight must lie in [0, 1)")
    if os.path.splitext(args.output)[1].lower() not in (".png", ".svg"):
        raise RunsError(f"-o {args.output!r}: the file must end in .png or .svg")
    if len(args.dirs) == 1 and not args.where and (study := _study(args.dirs[0], args.tracking)) is not None:
        width, height = draw_study(study, args.output)
        return (
            f"wrote {args.output} ({width}x{height}): study {study.name}, {len(study.trials)} trials, "
            "the objective against each searched parameter and the best so far"
        )
    runs = load_runs(args.dirs, args.tracking)
    table.fill_fields(runs)
    runs = _select(runs, args.where)
    if not runs:
        raise RunsError(f"no runs to plot in {', '.join(args.dirs)}")
    if args.dynamics:
        if len(runs) != 1 or not dynamics_series(runs[0]):
            raise RunsError(
                f"--dynamics draws one run that logged trainer.dynamics_every's metrics; {', '.join(args.dirs)} "
                f"holds {len(runs)} runs" + ("" if len(runs) != 1 else ", and it logged none")
            )
        width, height = draw_dynamics(runs[0], args.output)
        return f"wrote {args.output} ({width}x{height}): the training dynamics of {runs[0].summary.name}"
    metrics = [m.strip() for m in args.metric.split(",") if m.strip()]
    data = plot_data(runs, metrics, smoothing=args.smooth)
    if not data.curves:
        have = sorted({m for r in runs if r.journal is not None for m in r.journal.metric_names()})
        raise RunsError(f"--metric {args.metric}: no run logged it; the journals hold {', '.join(have) or 'nothing'}")
    width, height = draw(data, args.output, logx=args.logx, logy=args.logy)
    return f"wrote {args.output} ({width}x{height}): {len(runs)} runs, {', '.join(metrics)}" + (
        f"; final values against {', '.join(data.fields)}" if data.fields else ""
    )


def _goodput(args: argparse.Namespace) -> str:
    """``dew-runs goodput``: each run's ledger (dew.runs.goodput), a row per sweep among the
    directories (its slots' idle time), and the plot with ``-o``."""
    if args.output and os.path.splitext(args.output)[1].lower() not in (".png", ".svg"):
        raise RunsError(f"-o {args.output!r}: the file must end in .png or .svg")
    ledgers: list[Ledger] = []
    totals: list[Ledger] = []
    for directory in args.dirs:
        runs = [r for r in load_runs([directory], args.tracking) if r.journal is not None]
        mine = [ledger(r.summary.name, r.journal.written) for r in runs if r.journal is not None]
        ledgers += mine
        below = [os.fspath(r.path) for r in runs if os.path.normpath(os.fspath(r.path)) != os.path.normpath(directory)]
        if mine and below and (slots := sweep_slots(directory, below)) is not None:
            totals.append(sweep_total(f"all in {os.path.basename(os.path.normpath(directory))}", mine, slots))
    if not ledgers:
        raise RunsError(f"no run with a journal in {', '.join(args.dirs)}")
    text = ledger_text(ledgers, totals)
    if args.output:
        width, height = draw_ledgers([*ledgers, *totals], args.output)
        text += f"\nwrote {args.output} ({width}x{height})"
    return text


def _study(directory: str, tracking: str | None) -> Study | None:
    """The Optuna study a sweep directory holds (``hydra/sweeper=optuna``), or None."""
    return read_study(directory, tracking) if has_study(directory) else None


def _studies(directories: Sequence[str], tracking: str | None) -> str:
    """The studies among ``directories``, as text, each followed by a blank line."""
    return "".join(f"{study_text(s)}\n\n" for d in directories if (s := _study(d, tracking)) is not None)


@console_script
def main(argv: Sequence[str] | None = None) -> None:
    try:
        print(run(sys.argv[1:] if argv is None else argv))
    except RunsError as err:
        print(f"dew-runs: error: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except BrokenPipeError:  # dew-runs ... | head
        sys.exit(0)


if __name__ == "__main__":
    main()
