"""What the garbage collector's settings of a dew program save (``dew.launching.gc_settings``): the
same tiny ``dew-train`` run with dew's thresholds and with CPython's defaults.

Both sides run the same command in a fresh process, with a warm compilation cache (one run before
the rounds fills it), interleaved round by round with the order rotating: ``dew`` is
``python -m dew.cli.train ...`` as a user runs it; ``default`` is the same ``main``, run as the
program the same way, with ``collect_less`` replaced by nothing, so the process keeps CPython's
thresholds (700, 10, 10) and nothing else differs. A side's cost is its process's CPU time (user +
system) and peak resident memory, from ``wait4``.

    JAX_PLATFORMS=cpu python bench/gc_settings.py [--rounds 5]

The last line printed is JSON: {"bench": "gc_settings", "cpu_ratio": ..., "cpu_s": {...}, ...}.
``cpu_ratio`` is the median over the rounds of the ``dew`` side's CPU time over the ``default``
side's in the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TINY = [
    "experiment=digits",
    "model.config.depth=1",
    "model.config.hidden_size=32",
    "model.config.num_heads=2",
    "trainer.batch_size=32",
    "trainer.steps=20",
    "trainer.eval_every=10",
    "trainer.checkpoint_every=10",
    "optim.schedule.warmup_steps=1",
    "flow_matching.samples_per_class=1",
    "flow_matching.sample_steps=1",
]
DEFAULT_GC = (
    "import sys; sys.argv[0] = 'dew-train'; from dew.cli import train; from dew.commandline import console; "
    "console.collect_less = lambda: None; train.main()"  # run as the program, CPython's thresholds kept
)


def run(side: str, work: Path, n: int) -> tuple[float, int]:
    """CPU seconds and peak resident kB of one run of ``side`` (a fresh run directory each time)."""
    args = [*TINY, f"trainer.checkpoint_dir={work / f'ck{n}'}", f"trainer.compilation_cache_dir={work / 'xla'}"]
    argv = (
        [sys.executable, "-m", "dew.cli.train", *args] if side == "dew" else [sys.executable, "-c", DEFAULT_GC, *args]
    )
    proc = subprocess.Popen(argv, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{side} run {n} exited {proc.returncode}: {' '.join(argv)}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    sides = ["dew", "default"]
    cpu: dict[str, list[float]] = {s: [] for s in sides}
    rss: dict[str, list[int]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run("dew", work, 0)  # fills the compilation cache: every measured run loads its programs
        n = 1
        for r in range(args.rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                seconds, peak = run(side, work, n)
                n += 1
                cpu[side].append(seconds)
                rss[side].append(peak)
                print(f"round {r}: {side:7s} {seconds:6.2f} CPU-s  peak {peak / 1024:6.0f} MiB", flush=True)
    ratios = [d / b for d, b in zip(cpu["dew"], cpu["default"])]
    record = {
        "bench": "gc_settings",
        "cpu_ratio": statistics.median(ratios),
        "cpu_ratios": [round(x, 3) for x in ratios],
        "cpu_s": {s: statistics.median(v) for s, v in cpu.items()},
        "peak_rss_mib": {s: statistics.median(v) / 1024 for s, v in rss.items()},
        "rounds": args.rounds,
    }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
