"""How long a run takes to stop after a signal, against its step time.

A stop is honoured at a step boundary, after a checkpoint of the state there. The loop dispatches
steps without waiting for them, so how late the stop lands is how far the host has run ahead of the
devices: the trainer bounds that lead to one step, and to none once steps take half a second or
more (docs/performance.md, "Stopping"), so at such steps SIGINT to exit should take at most the
rest of one step, the save and the exit.

Two ``dew-train`` runs of the digits experiment at a width and depth that make a step take about a
second on a CPU, in subprocesses, one after the other, sharing a compilation cache:

1. the step time: a few steps with ``trainer.log_every=1``, the median gap between consecutive
   steps' journal lines;
2. the stop: the experiment's own ``log_every`` (50), SIGINT ``--delay`` seconds after the log says
   step 1 ran; the time from the signal to the process's exit, and the step the run stopped at.

    JAX_PLATFORMS=cpu python bench/stop_latency.py [--hidden 384 --depth 8 --batch 128 --delay 5]

The last line printed is JSON: {"bench": "stop_latency", "exit_over_step": ..., ...}; ``exit_over_step``
is the signal-to-exit time in step times (the bound: 3). The time is split in three from the stop
checkpoint's own record (orbax's ``_CHECKPOINT_METADATA``: when its save began and when it was
committed, wall-clock): ``landing_s`` from the signal to the save's start (the steps the devices had
to finish), ``save_s`` the save, ``after_s`` from the commit to the process's exit.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

FIRST_STEP = "ran step 1 in"
"""What dew-train logs once step 1 has run (report.py: the first metrics are fetched after it)."""


def command(args: argparse.Namespace, work: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dew.cli.train",
        "experiment=digits",
        f"model.config.hidden_size={args.hidden}",
        f"model.config.depth={args.depth}",
        f"trainer.batch_size={args.batch}",
        "trainer.eval_every=null",
        "trainer.checkpoint_every=null",
        f"trainer.checkpoint_dir={work / 'ck'}",
        f"trainer.compilation_cache_dir={work / 'xla'}",
        "flow_matching.samples_per_class=1",
        "flow_matching.sample_steps=1",
        "optim.schedule.warmup_steps=1",
        *overrides,
    ]


def journal(work: Path, name: str) -> list[dict]:
    path = work / "tracking" / name / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def step_time(args: argparse.Namespace, work: Path) -> float:
    """Median seconds between consecutive steps of a short run that logs every step."""
    subprocess.run(
        command(args, work, "trainer.name=pace", f"trainer.steps={args.pace_steps}", "trainer.log_every=1"),
        cwd=work,
        check=True,
        capture_output=True,
        timeout=1800,
    )
    times = {r["step"]: r["time"] for r in journal(work, "pace") if "train/loss" in r}
    gaps = [times[s] - times[s - 1] for s in sorted(times) if s - 1 in times and s > 2]
    return statistics.median(gaps)


def stop(args: argparse.Namespace, work: Path) -> dict:
    """Start a long run, SIGINT it ``args.delay`` s after step 1 ran; seconds to exit, and where it stopped."""
    proc = subprocess.Popen(
        command(args, work, "trainer.name=stop", "trainer.steps=100000"),
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    first = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if FIRST_STEP in line:
                first.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not first.wait(1800):
            raise RuntimeError("the run never logged its first step:\n" + "".join(lines[-20:]))
        time.sleep(args.delay)
        sent, sent_wall = time.perf_counter(), time.time()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=1800)
        exited = time.perf_counter() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    stops = [r for r in journal(work, "stop") if r.get("event") == "stop"]
    stopped_at = stops[-1]["step"] if stops else None
    return {
        "exit_s": exited,
        "returncode": code,
        "stopped_at": stopped_at,
        **(parts(work, stopped_at, sent_wall, exited) if stopped_at is not None else {}),
    }


def parts(work: Path, step: int, sent: float, exited: float) -> dict:
    """Signal to save, the save, commit to exit, in seconds, from the stop checkpoint's record of
    when its save began and was committed (wall-clock nanoseconds)."""
    record = json.loads((work / "ck" / "stop" / str(step) / "_CHECKPOINT_METADATA").read_text())
    began, committed = record["init_timestamp_nsecs"] / 1e9, record["commit_timestamp_nsecs"] / 1e9
    return {"landing_s": began - sent, "save_s": committed - began, "after_s": sent + exited - committed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=384, help="model.config.hidden_size")
    parser.add_argument("--depth", type=int, default=8, help="model.config.depth")
    parser.add_argument("--batch", type=int, default=128, help="trainer.batch_size")
    parser.add_argument("--delay", type=float, default=5.0, help="seconds after step 1 to send SIGINT")
    parser.add_argument("--pace-steps", type=int, default=8, help="steps of the run that measures the step time")
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        step_s = step_time(args, work)
        print(f"step time {step_s:.2f} s", flush=True)
        result = stop(args, work)
    print(
        f"SIGINT {args.delay:g} s after step 1: exited {result['exit_s']:.1f} s later (exit status "
        f"{result['returncode']}), stopped at step {result['stopped_at']}",
        flush=True,
    )
    if "save_s" in result:
        print(
            f"signal to save {result['landing_s']:.2f} s, save {result['save_s']:.2f} s, commit to exit "
            f"{result['after_s']:.2f} s",
            flush=True,
        )
    print(
        json.dumps(
            {
                "bench": "stop_latency",
                "exit_over_step": round(result["exit_s"] / step_s, 2),
                "exit_s": round(result["exit_s"], 2),
                "step_s": round(step_s, 3),
                **{k: round(result[k], 2) for k in ("landing_s", "save_s", "after_s") if k in result},
                "stopped_at": result["stopped_at"],
                "returncode": result["returncode"],
                "delay_s": args.delay,
                "hidden": args.hidden,
                "depth": args.depth,
                "batch": args.batch,
            }
        )
    )


if __name__ == "__main__":
    main()
