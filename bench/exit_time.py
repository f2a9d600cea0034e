"""What a dew command's end costs: the same tiny ``dew-train`` run ending as dew's commands end
(``console_script``: threads joined, exit handlers run, then ``os._exit``) and ending as Python
ends a program (the same handlers, then the interpreter's tear-down: the garbage collection and
unloading of every module JAX, Flax, Orbax, Hydra and dew imported).

Both sides run the same command in a fresh process, with a warm compilation cache (one run before
the rounds fills it), interleaved round by round with the order rotating: ``dew`` is
``python -m dew.cli.train ...`` as a user runs it; ``python`` calls the same ``main`` through its
``__wrapped__`` (``functools.wraps``: the function under ``console_script``), so the program ends
as Python's own does. A side's cost is its process's CPU time (user + system, from ``wait4``) and
its wall time; the run's own log says when the training ended, so the tail after it is timed too.

    JAX_PLATFORMS=cpu python bench/exit_time.py [--rounds 5]

The last line printed is JSON: {"bench": "exit_time", "cpu_ratio": ..., "tail_s": {...}, ...}.
``cpu_ratio`` is the median over the rounds of the ``dew`` side's CPU time over the ``python``
side's in the same round; ``tail_s`` each side's median time from the run's last log line to the
process's end.
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

TINY = [
    "experiment=digits",
    "model.config.depth=1",
    "model.config.hidden_size=32",
    "model.config.num_heads=2",
    "trainer.batch_size=32",
    "trainer.steps=3",
    "trainer.eval_every=null",
    "optim.schedule.warmup_steps=1",
    "flow_matching.samples_per_class=1",
    "flow_matching.sample_steps=1",
]
PYTHON_END = (
    "import sys; sys.argv[0] = 'dew-train'; from dew.cli import train; "
    "sys.exit(train.main.__wrapped__())"  # no console_script: the interpreter's own end
)


def run(side: str, work: Path, n: int) -> dict[str, float]:
    args = [*TINY, f"trainer.checkpoint_dir={work / f'ck{n}'}", f"trainer.compilation_cache_dir={work / 'xla'}"]
    argv = (
        [sys.executable, "-m", "dew.cli.train", *args] if side == "dew" else [sys.executable, "-c", PYTHON_END, *args]
    )
    began = time.monotonic()
    proc = subprocess.Popen(argv, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    last = began
    for _line in proc.stderr:  # the run logs to stderr; its last line is the end of the command's work
        last = time.monotonic()
    _, status, usage = os.wait4(proc.pid, 0)
    ended = time.monotonic()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{side}: {argv} exited with {os.waitstatus_to_exitcode(status)}")
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": ended - began, "tail_s": ended - last}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dew-exit-") as tmp:
        work = Path(tmp)
        run("dew", work, 0)  # fills the compilation cache
        sides: dict[str, list[dict[str, float]]] = {"dew": [], "python": []}
        for r in range(args.rounds):
            for side in ("dew", "python") if r % 2 == 0 else ("python", "dew"):
                sides[side].append(run(side, work, len(sides["dew"]) + len(sides["python"]) + 1))
                print(f"round {r} {side}: {sides[side][-1]}", flush=True)
    ratios = [d["cpu_s"] / p["cpu_s"] for d, p in zip(sides["dew"], sides["python"], strict=True)]
    median = lambda side, key: round(statistics.median(x[key] for x in sides[side]), 3)  # noqa: E731
    print(
        json.dumps(
            {
                "bench": "exit_time",
                "cpu_ratio": round(statistics.median(ratios), 3),
                "cpu_ratios": [round(r, 3) for r in ratios],
                "cpu_s": {side: median(side, "cpu_s") for side in sides},
                "wall_s": {side: median(side, "wall_s") for side in sides},
                "tail_s": {side: median(side, "tail_s") for side in sides},
                "rounds": args.rounds,
            }
        )
    )


if __name__ == "__main__":
    main()
