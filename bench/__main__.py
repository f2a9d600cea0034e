"""``python -m bench``: every CPU benchmark in bench/, one after the other, then one table.

A benchmark is a ``bench/<name>.py`` with a ``__main__`` guard whose last printed line is a JSON
record (``{"bench": name, ...}``); they are found by listing the directory, so a new one joins the
suite by existing; the GPU check is left out, and the MaxText comparison runs only when ``--only``
names it (it needs MaxText installed in its own environment). Each runs in its own process with
``JAX_PLATFORMS=cpu`` and its defaults (the commands docs/performance.md quotes), one at a time, so
none measures another's load. The table shows each one's ratios and their per-round spread (every
field named ``ratio``, ``*_ratio``, ``*_vs_*``, ``*_share`` or ``*_over_*``, with its
``*s``/``*_range`` companion when the benchmark records one), then every JSON record follows, one
per line.

    python -m bench                       # the whole suite (tens of minutes on a 2-core machine)
    python -m bench --only data_pipeline  # a subset, comma-separated
    python -m bench --only maxtext_parity # dew against MaxText (bench/maxtext_parity.py says how to install it)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOT_CPU = {
    "gpu": "the GPU check (its CPU smoke run is tests/bench/test_gpu_smoke.py)",
    "maxtext_parity": "needs MaxText installed in its own environment",
}
"""Benchmarks the CPU suite leaves out, and why."""
OPT_IN = {"maxtext_parity"}
"""Of those, the ones ``--only`` runs when it names them."""
RATIO = re.compile(r"(^ratio$|_ratio$|_vs_|_share$|_over_)")


def discover(opt_in: bool = False) -> list[str]:
    """The names of bench/*.py that run as scripts, the CPU suite's exclusions left out (but those
    of ``OPT_IN`` with ``opt_in``)."""
    names = []
    for path in sorted(HERE.glob("*.py")):
        if path.stem.startswith("_") or (path.stem in NOT_CPU and not (opt_in and path.stem in OPT_IN)):
            continue
        if re.search(r"^if __name__ == .__main__.:", path.read_text(), re.M):
            names.append(path.stem)
    return names


def ratios(record: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """``(name, value, spread)`` of every ratio in a benchmark's record, nested records included."""
    rows = []
    for key, value in record.items():
        if isinstance(value, dict):
            rows += ratios(value, f"{prefix}{key}.")
        elif RATIO.search(key) and isinstance(value, (int, float)):
            spread = record.get(f"{key}s", record.get(f"{key}_range"))
            if isinstance(spread, list) and len(spread) > 2:
                spread = [min(spread), max(spread)]
            rows.append((prefix + key, value, spread))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=None, help="comma-separated benchmark names")
    args = parser.parse_args(argv)
    names = discover(opt_in=bool(args.only))
    if args.only:
        unknown = sorted(set(args.only.split(",")) - set(names))
        if unknown:
            parser.error(f"--only: no CPU benchmark {', '.join(unknown)}; known: {', '.join(names)}")
        names = [n for n in names if n in args.only.split(",")]
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])),
    }
    records, failed = [], []
    for name in names:
        print(f"== {name}", flush=True)
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(HERE / f"{name}.py")], env=env, capture_output=True, text=True, cwd=HERE.parent
        )
        lines = proc.stdout.strip().splitlines()
        try:
            record = json.loads(lines[-1])
        except (IndexError, ValueError):
            record = None
        if proc.returncode or not isinstance(record, dict):
            failed.append(name)
            print(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}", flush=True)
            continue
        record.setdefault("bench", name)
        record["wall_s"] = round(time.perf_counter() - start, 1)
        records.append(record)

    print(
        f"\nbench suite, {datetime.date.today()}, {platform.node()} ({platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end)"
    )
    print("| benchmark | figure | value | spread (min, max) |\n|---|---|---|---|")
    for record in records:
        rows = ratios({k: v for k, v in record.items() if k != "bench"}) or [("wall_s", record["wall_s"], None)]
        for key, value, spread in rows:
            shown = "" if spread is None else ", ".join(str(s) for s in spread)
            print(f"| {record['bench']} | {key} | {value} | {shown} |")
    for record in records:
        print(json.dumps(record))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
