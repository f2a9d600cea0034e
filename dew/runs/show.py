"""``dew-runs show RUN``: one run in full: its record, checkpoints, events and sample files."""

from __future__ import annotations

import time
from typing import Any

import yaml
from etils import epath

from dew.contract.rundir import SAMPLE_PREFIX, human
from dew.runs.status import BEST_METRIC, Run
from dew.runs.table import duration, number, status_text


def size(path: epath.Path) -> int:
    """Bytes under ``path``, every file counted."""
    if not path.is_dir():
        return path.stat().length
    return sum(size(child) for child in path.iterdir())


def _event_line(event: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event["time"])) if "time" in event else "-"
    details = {k: v for k, v in event.items() if k not in ("event", "step", "time", "journal")}
    text = "  ".join(
        f"{k}={v if isinstance(v, str) else number(v)}"
        for k, v in details.items()
        if k != "changed" and not k.startswith("eval/")
    )
    for change in event.get("changed", []):
        text += f"\n      changed {change}"
    return f"  {when}  step {event['step']:>7}  {event['event']:<10} {text}".rstrip()


def show_text(run: Run) -> str:
    s = run.summary
    out = [f"run {s.name}: {status_text(s)}", f"  directory: {s.path}", f"  journal:   {s.journal or 'none found'}"]
    if s.reason:
        out.append(f"  reason:    {s.reason}")
    progress = "-" if s.step is None else f"{s.step}/{s.total_steps}" if s.total_steps else str(s.step)
    out.append(
        f"  step {progress}  train/loss {number(s.train_loss)}  best {BEST_METRIC} "
        f"{number(s.best)} @{number(s.best_step)}  wall {duration(s.wall_time)}  "
        f"examples/s {number(s.examples_per_sec)}"
    )

    evals = dict(zip(*run.journal.series(BEST_METRIC))) if run.journal is not None else {}
    scored = {step: evals[step] for step in s.checkpoints if step in evals}
    best = min(scored, key=scored.__getitem__) if scored else None
    out.append("\ncheckpoints:" if s.checkpoints else "\ncheckpoints: none")
    for step in s.checkpoints:
        metric = f"{BEST_METRIC} {number(evals[step])}" if step in evals else ""
        mark = "  (best)" if step == best else ""
        out.append(f"  {step:>7}  {human(size(run.path / str(step))):>9}  {metric}{mark}")

    if run.journal is not None:
        kept = [e for e in run.journal.events if e["event"] not in ("eval", "checkpoint")]
        counts = {k: sum(e["event"] == k for e in run.journal.events) for k in ("eval", "checkpoint")}
        out.append(f"\nevents ({counts['eval']} evaluations and {counts['checkpoint']} checkpoints not listed):")
        out += [_event_line(e) for e in kept]
        if run.journal.partial_tail:
            out.append("  (the journal's last line was cut off mid-write and is skipped)")

    samples = sorted(p for p in run.path.iterdir() if p.name.startswith(SAMPLE_PREFIX)) if run.path.is_dir() else []
    out.append("\nsamples:" if samples else "\nsamples: none")
    out += [f"  {p}  {human(size(p))}" for p in samples]

    out.append("\nrecord (run.json):")
    if run.record is None:
        out.append("  unreadable")
    else:
        out.append("  " + yaml.safe_dump(run.record, sort_keys=False, width=100).rstrip().replace("\n", "\n  "))
    return "\n".join(out)
