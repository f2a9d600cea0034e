"""How long ``dew-runs`` takes over a large sweep: 100 synthetic runs of 1,000 journal lines each.

Each run directory holds the default Recipe's run.json (its learning rate varied, so the table has a
swept column), two empty step directories and a journal beside it in tracking/: a start event, 960
metric records (train loss, grad norm, lr, examples/s), 20 evaluations and 20 checkpoints as
metric records and events, and an end event, as the trainer writes them. Timed: the table in
process (read every record and journal, find the differing fields, render), the command end to end
in a fresh process (Python start-up and imports included), and a plot of the 100 runs.

    python bench/runs_listing.py [--runs 100 --lines 1000 --repeat 3]

The last line printed is JSON: {"bench": "runs_listing", "list_s": ..., "cli_s": ..., "plot_s": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_sweep(root: Path, runs: int, lines: int) -> Path:
    from dew.recipe import Recipe

    record = Recipe().to_dict()
    sweep = root / "ck" / "sweep"
    for i in range(runs):
        name = f"{i}-optim.learning_rate={1e-4 * (i + 1):.4g}"
        run = sweep / name
        run.mkdir(parents=True)
        record["optim"]["learning_rate"] = 1e-4 * (i + 1)
        (run / "run.json").write_text(json.dumps(record))
        journal = root / "tracking" / "sweep" / name / "journal.jsonl"
        journal.parent.mkdir(parents=True)
        evals = (lines - 2) // 50  # an eval record, an eval event and a checkpoint event every 48 steps
        metrics = lines - 2 - 3 * evals
        t, out = 1.7e9, [{"event": "start", "step": 0, "time": 1.7e9, "journal": 1, "total_steps": metrics}]
        for step in range(1, metrics + 1):
            t += 0.1
            out.append(
                {
                    "step": step,
                    "time": t,
                    "train/grad_norm": 1.0 / step,
                    "train/loss": 2.0 / step**0.5,
                    "train/lr": 1e-3,
                    "perf/examples_per_sec": 1000.0 + i,
                }
            )
            if step % (metrics // evals) == 0 and len([r for r in out if r.get("event") == "eval"]) < evals:
                out.append({"step": step, "eval/loss": 2.1 / step**0.5})
                out.append({"event": "eval", "step": step, "time": t, "eval/loss": 2.1 / step**0.5})
                out.append({"event": "checkpoint", "step": step, "time": t})
        out.append({"event": "end", "step": metrics, "time": t})
        assert len(out) == lines, len(out)
        journal.write_text("".join(json.dumps(r) + "\n" for r in out))
        for step in (metrics - 48, metrics):
            (run / str(step)).mkdir()
    return sweep


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from dew.cli.runs import run

    with tempfile.TemporaryDirectory() as tmp:
        sweep = make_sweep(Path(tmp), args.runs, args.lines)
        table = run([str(sweep)])
        assert len(table.splitlines()) == args.runs + 1, table[:500]
        list_s = timed(lambda: run([str(sweep)]), args.repeat)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]
            ),
        }
        cli_s = timed(
            lambda: subprocess.run(
                [sys.executable, "-m", "dew.cli.runs", str(sweep)], check=True, capture_output=True, env=env
            ),
            args.repeat,
        )
        plot_s = timed(lambda: run(["plot", str(sweep), "-o", os.path.join(tmp, "sweep.png")]), args.repeat)
    result = {
        "bench": "runs_listing",
        "runs": args.runs,
        "lines": args.lines,
        "list_s": list_s,
        "cli_s": cli_s,
        "plot_s": plot_s,
    }
    print(
        f"{args.runs} runs x {args.lines} journal lines: table {list_s:.2f} s in process, "
        f"{cli_s:.2f} s as a command, plot {plot_s:.2f} s"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
