"""``dew-eval RUN --follow``: every checkpoint of a run evaluated once, as it appears, until the run
ends (docs/eval.md, "Following a run").

The follower polls the run directory every ``--poll`` seconds for finished steps (a step directory
orbax has finalised: ``rundir.STEP_FINISHED``), evaluates each new one as ``dew-eval RUN --step N``
does (the same overrides, ``--tasks-only`` too) and writes its results file, then notes the step in
its record, ``RUN/eval/follow-<digest of the overrides>.json``, written whole (a temporary file
renamed over it). It ends once the run's journal says the run ended (the last of its ``start``,
``resume``, ``stop`` and ``end`` events is an ``end``) and every step saved before is evaluated. A
run stopped or killed and resumed is followed on: a stop is not an end.

One follower a run: it holds ``RUN/eval/.lock`` (``dew.contract.lock.RunLock``: an OS lock, or a
lease where the filesystem has none, taken over by a requeue of the same SLURM job) from the moment
the run's record exists, and a second is refused naming the first. As a job of its own under a
launch profile (``--launch``: ``dew.launching.followers``), ``FollowJob`` is what the job runs.

Resumable: a follower started again (the same command) reads its record and evaluates only the
steps it does not note, so each checkpoint is noted once, with its values. (A follower killed in the
moment between a step's results file and its note evaluates that step again when started again,
replacing the file with the same values.) A step deleted before its turn (the run keeps
``trainer.keep`` latest steps and the best) is noted as skipped, with why. Nothing of the run is
written but ``RUN/eval/``. One process follows: the steps appear to each process at its own moment.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from etils import epath

from dew.contract import lock
from dew.contract.journal import JournalError, read
from dew.contract.rundir import RUN_RECORD, STEP_FINISHED, is_step
from dew.inference import evaluating
from dew.inference.composing import EvalError
from dew.runs.discover import find_journal

ENDS = ("start", "resume", "stop", "end")
"""The journal's events that say whether a run is going on: it has ended when the last is ``end``."""


def record_path(run: str, overrides: list[str], tasks_only: bool) -> str:
    """Where the follower of ``run`` with these ``overrides`` notes the steps it evaluated."""
    key = " ".join([*overrides, *(["--tasks-only"] if tasks_only else [])])
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return os.path.join(run, evaluating.EVAL_DIR, f"follow-{digest}.json")


def finished_steps(run: str) -> list[int]:
    """The run's steps orbax has finished saving, oldest first."""
    if not os.path.isdir(run):
        return []
    return sorted(int(n) for n in os.listdir(run) if is_step(n) and os.path.exists(os.path.join(run, n, STEP_FINISHED)))


def ended(run: str) -> bool:
    """Whether the run's journal says it ended (its last lifecycle event an ``end``)."""
    journal = find_journal(epath.Path(run))
    if journal is None:
        return False
    try:
        events = [e["event"] for e in read(journal).events if e.get("event") in ENDS]
    except JournalError:
        return False  # a line still being written: read it at the next poll
    return bool(events) and events[-1] == "end"


def read_record(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {"steps": {}}
    with open(path) as fh:
        return json.load(fh)


def write_record(path: str, record: dict[str, Any]) -> None:
    """``record`` at ``path``, whole: a temporary file beside it, renamed."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.tmp-{os.getpid()}"
    with open(partial, "w") as fh:
        json.dump(record, fh, indent=2)
        fh.write("\n")
    os.replace(partial, path)


def follow(args: argparse.Namespace, *, sleep: Callable[[float], None] = time.sleep, out: Any = None) -> dict[str, Any]:
    """Evaluate every checkpoint of ``args.run`` once until the run ends; the follower's record.
    ``out`` (where its lines go) is the standard output at the call, not at the import."""
    out = sys.stdout if out is None else out
    run = os.path.abspath(args.run)
    tasks_only = bool(getattr(args, "tasks_only", False))
    path = record_path(run, list(args.overrides), tasks_only)
    record = read_record(path)
    record.update(run=run, overrides=list(args.overrides), tasks_only=tasks_only)
    while not os.path.isfile(os.path.join(run, RUN_RECORD)):  # the run has not started yet
        sleep(args.poll)
    holding = held(run)
    try:
        return follow_held(args, run, path, record, sleep, out)
    finally:
        holding.release()


def held(run: str) -> lock.RunLock:
    """The follower's lock on ``run`` (``RUN/eval/.lock``), or ``followed``'s error."""
    try:
        return lock.RunLock(os.path.join(run, evaluating.EVAL_DIR)).acquire()
    except lock.RunLockedError:
        raise followed(run) or EvalError(f"--follow: {run} is already followed") from None


def followed(run: str) -> EvalError | None:
    """The error naming the live follower of ``run``, if one holds it (reads only), else None."""
    run = os.path.abspath(run)
    who = lock.holder(os.path.join(run, evaluating.EVAL_DIR))
    if who is None:
        return None
    return EvalError(
        f"--follow: {run} is already followed by {lock.describe(who)}; one follower a run (it evaluates "
        "every checkpoint once): stop that one first"
    )


def follow_held(
    args: argparse.Namespace, run: str, path: str, record: dict[str, Any], sleep: Callable[[float], None], out: Any
) -> dict[str, Any]:
    """``follow``'s loop, the run's record there and the follower's lock held."""
    while True:
        over = ended(run)  # read first: once the run has ended, every step it saved is on disk
        for step in finished_steps(run):
            if str(step) not in record["steps"]:
                note = record["steps"][str(step)] = evaluate_step(args, step)
                write_record(path, record)
                print(f"dew-eval: step {step} {describe(note)}", file=out, flush=True)
        if over:
            print(f"dew-eval: {run} ended; {len(record['steps'])} steps evaluated (record: {path})", file=out)
            return record
        sleep(args.poll)


def evaluate_step(args: argparse.Namespace, step: int) -> dict[str, Any]:
    """Evaluate saved ``step``: its note (the results file and the values)."""
    one = argparse.Namespace(**{**vars(args), "step": step, "latest": False, "out": None, "follow": False})
    try:
        result, written = evaluating.run(one)
    except EvalError as err:
        if step not in finished_steps(os.path.abspath(args.run)):  # the run deleted it meanwhile
            return {"skipped": " ".join(str(err).split())}
        raise
    return {"results": written, "metrics": dict(result.values)}


def describe(note: dict[str, Any]) -> str:
    """A step's note in one line: its values, or why it was skipped."""
    if "skipped" in note:
        return f"skipped: {note['skipped']}"
    return "evaluated: " + " ".join(f"{k}={v:.6g}" for k, v in sorted(note["metrics"].items()))


class FollowJob:
    """The follower as a job of its own (``dew-eval RUN --follow --launch PROFILE``): called in the
    job's process, it follows as ``follow`` does; at SIGUSR2 (the time limit near, or a preemption)
    submitit asks ``checkpoint`` what to run when it requeues the job: the same follower, which
    evaluates only the steps its record lacks."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = argparse.Namespace(**{**vars(args), "run": os.path.abspath(args.run), "launch": None})

    def __call__(self) -> dict[str, Any]:
        return follow(self.args)

    def checkpoint(self) -> object:
        import submitit

        return submitit.helpers.DelayedSubmission(FollowJob(self.args))
