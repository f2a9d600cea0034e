"""Ctrl-C at any moment of a local multi-process sweep (``dew-train -m hydra/launcher=local``, 2
tasks): no traceback, status 130, one line per job, the newest complete checkpoint kept (the stop
checkpoint added once the tasks trained a step), and the run resumed to the end of a run that was
never interrupted, bit for bit.

Ten moments, each a separate launch, as a terminal sends Ctrl-C (SIGINT to the process group),
half of them followed by a second one 0.2 s later. To keep it cheap, the moments are one run's,
interrupted ten times in a row (every launch resumes what the one before saved) while a run that
is never interrupted trains beside it: a moment is a fixed delay after the launching process took
the signals (its first lines: a Ctrl-C before them meets Python's own start, as for any Python
command) while it imports or composes, before any task starts, or the first line of the launch's
rank-0 task log that marks a phase (the task's set-up, its compilation, a step, a checkpoint, an
evaluation, the run's end)."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from dew.contract.journal import read_journal
from tests.cli.test_sweep_launch import finish, in_its_own_group
from tests.training.conftest import TINY, losses
from tests.training.test_multiprocess import host_params

STEPS, CKPT, EVAL = 240, 20, 40  # room for the stops: one lands up to ~50 steps after its Ctrl-C
LOCAL = [
    "-m",
    "hydra/launcher=local",
    "hydra.launcher.tasks_per_node=2",
    *TINY,
    f"trainer.steps={STEPS}",
    f"trainer.eval_every={EVAL}",
    f"trainer.checkpoint_every={CKPT}",
    "trainer.checkpoint_dir=ck",
]  # the suite's compilation cache (TINY's): later launches load what the first compiled

# (phase, trigger, second Ctrl-C): a trigger is seconds after the launch, or what the launch's rank-0
# log shows: a line, "+k" (k steps after the step it resumed from), "ckpt"/"eval" (the line of the
# next step that saves / evaluates, written just before it does), "end" (the last step's line).
MOMENTS = [
    ("before the pool", 0.3, True),
    ("set-up", "Loading pickle", False),
    ("compilation", "compiling the train step", True),
    ("mid-step", "+3", False),
    ("set-up", "joined the JAX process pool", True),
    ("checkpoint", "ckpt", False),
    ("evaluation", "eval", True),
    ("compilation", "compiling the train step", False),  # a resumed run's
    ("checkpoint", "ckpt", True),
    ("end", "end", False),
]


def launch(workdir: Path, name: str, log: Path) -> subprocess.Popen:
    """The sweep launched as from a terminal: its own process group, the foreground job."""
    return in_its_own_group([*LOCAL, f"trainer.name={name}"], workdir, log)


def task_logs(workdir: Path, name: str) -> dict[Path, str]:
    return {p: p.read_text() for p in log_paths(workdir, name)}


def log_paths(workdir: Path, name: str) -> list[Path]:
    return list((workdir / "ck").glob(f"{name}-sweep-*/.submitit/*/*_log.*"))


class Tail:
    """The text of the files ``find()`` lists, read as they grow: each look reads only what was
    appended, and lists the files again at most every 0.2 s. Globbing and reading the whole logs at
    each look (every 10 ms) took 6.6 CPU-s of the test's own process run alone, against 3.0 now
    (2026-12-04; 16.8 in a loaded suite run), CPU the tasks it waits for need."""

    def __init__(self, find: Callable[[], list[Path]]) -> None:
        self.find, self.listed = find, 0.0
        self.texts: dict[Path, bytes] = {}

    def read(self) -> str:
        if time.monotonic() - self.listed >= 0.2:
            self.listed = time.monotonic()
            for path in self.find():
                self.texts.setdefault(path, b"")
        for path, data in self.texts.items():
            with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
                f.seek(len(data))
                self.texts[path] = data + f.read()
        return b"".join(self.texts.values()).decode(errors="replace")


def takes_the_signals(pid: int) -> bool:
    """Whether process ``pid`` installed dew's handler: it catches SIGTERM (Python alone does not)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def reached(trigger: float | str, began: float | None, rank0: str) -> bool:
    """Whether ``trigger`` came: ``began`` is when the launching process took the signals."""
    if isinstance(trigger, float):
        return began is not None and time.monotonic() - began >= trigger
    steps = [int(s) for s in re.findall(rf"step (\d+)/{STEPS}  loss", rank0)]
    start = int(m.group(1)) if (m := re.search(r"resuming \S+ from step (\d+)", rank0)) else 0
    every = {"ckpt": CKPT, "eval": EVAL, "end": STEPS}
    if trigger in every:
        at = (start // every[trigger] + 1) * every[trigger]
        return at in steps
    if trigger.startswith("+"):
        return bool(steps) and max(steps) >= start + int(trigger)
    return trigger in rank0


def interrupt(workdir: Path, name: str, n: int, trigger: float | str, double: bool) -> tuple[int, str, str, bool]:
    """One launch, Ctrl-C at ``trigger``: (status, its output, what the rank-0 log showed then,
    whether a second Ctrl-C reached it: a launch stopped before its pool may have ended first)."""
    second = False
    before = set(log_paths(workdir, name))
    log = workdir / f"{name}{n}.out"
    proc, began, rank0 = launch(workdir, name, log), None, ""
    logs = Tail(lambda: [p for p in log_paths(workdir, name) if p not in before and p.name.endswith("_0_log.out")])
    try:
        while proc.poll() is None:
            if began is None and takes_the_signals(proc.pid):
                began = time.monotonic()
            if reached(trigger, began, rank0):
                break
            time.sleep(0.01)
            rank0 = logs.read()  # this launch's rank 0 (its job's, a requeue's)
        with contextlib.suppress(ProcessLookupError):  # a launch that ended first fails below
            os.killpg(proc.pid, signal.SIGINT)
            if double:
                time.sleep(0.2)
                # Python runs a signal's handler once for all the deliveries that came before it ran: a
                # second Ctrl-C while the main thread is still in C code (an import, XLA) joins the
                # first. The second is sent once the first was answered, so it is a second to Python.
                waited = time.monotonic() + 30
                while proc.poll() is None and "dew-train: Ctrl-C:" not in log.read_text():
                    assert time.monotonic() < waited, "the first Ctrl-C was not answered in 30 s"
                    time.sleep(0.01)
                # A launch that printed its last line is ending (its threads, its atexit handlers, then
                # os._exit): a Ctrl-C then may find it gone before its handler runs, and needs no answer.
                if second := proc.poll() is None and not ended(log.read_text()):
                    os.killpg(proc.pid, signal.SIGINT)
        return finish(proc), log.read_text(), rank0, second
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def ended(out: str) -> bool:
    """Whether the launch printed its last line: a job's stop, or the stop before any job."""
    return any(
        line.startswith("dew-train: job 0 (") or "interrupted before the launch" in line for line in out.splitlines()
    )


def landed(rank0: str) -> str:
    """Where the tasks were when the signal came, from the rank-0 log."""
    if not rank0:
        return "before the pool"
    if not re.search(r"the train step (from the compilation cache )?and ran step", rank0):  # compiled or loaded
        return "compilation" if "compiling the train step" in rank0 else "set-up"
    last = [int(s) for s in re.findall(rf"step (\d+)/{STEPS}  loss", rank0)][-1]
    if last == STEPS:
        return "end"
    return "evaluation" if last % EVAL == 0 else "checkpoint" if last % CKPT == 0 else "mid-step"


def chain(workdir: Path, name: str, failures: list[str], phases: collections.Counter) -> None:
    try:
        interrupt_at_every_moment(workdir, name, failures, phases)
    except Exception as err:
        failures.append(f"{name}: {type(err).__name__}: {err}")


def interrupt_at_every_moment(workdir: Path, name: str, failures: list[str], phases: collections.Counter) -> None:
    for n, (phase, trigger, double) in enumerate(MOMENTS):
        run = next((workdir / "ck").glob(f"{name}-sweep-*/0*"), None)
        newest = max((int(p.name) for p in run.iterdir() if p.name.isdigit()), default=None) if run else None
        code, out, rank0, second = interrupt(workdir, name, n, trigger, double)
        phases[landed(rank0)] += 1
        where = f"{name}{n} ({phase}, landed {landed(rank0)}, {'twice' if double else 'once'})"
        logs = task_logs(workdir, name)
        outputs = [out, *logs.values()]
        lines = [line for line in out.splitlines() if line.startswith("dew-train:")]
        if code == 0 and newest == STEPS and not any("Traceback" in text for text in outputs):
            # The launch before stopped at the last step: this one resumes a finished run, which ends
            # before a Ctrl-C can reach it (nothing is left to interrupt); the end is still compared.
            continue
        if code != 130 or any("Traceback" in text for text in outputs):
            raised = [
                f"{p}:\n{t[max(0, t.index('Traceback') - 500) :][:3000]}" for p, t in logs.items() if "Traceback" in t
            ]
            failures.append(f"{where}: status {code}\n{out[-3000:]}\n" + "\n".join(raised))
            continue
        if not (lines[-1].startswith("dew-train: job 0 (") or "interrupted before the launch" in lines[-1]):
            failures.append(f"{where}: last line {lines[-1]!r}")
        if second and not any("again: ignored" in line for line in lines):
            failures.append(f"{where}: the second Ctrl-C was not answered: {lines}")
        run = next((workdir / "ck").glob(f"{name}-sweep-*/0*"), None)
        steps = sorted(int(p.name) for p in run.iterdir() if p.name.isdigit()) if run else []
        if [p.name for p in run.iterdir() if "tmp" in p.name] if run else []:
            failures.append(f"{where}: an unfinished checkpoint in {sorted(os.listdir(run))}")
        if newest is not None and (not steps or steps[-1] < newest):
            failures.append(f"{where}: the newest checkpoint {newest} is gone: {steps}")
        if landed(rank0) not in ("before the pool", "set-up", "compilation") and newest is None and not steps:
            failures.append(f"{where}: the tasks trained but saved no checkpoint")


def test_the_launching_process_answers_every_signal_with_one_line_and_never_raises(tmp_path, capfd):
    from dew.launching import interrupts

    before = signal.getsignal(signal.SIGINT)  # Python's own; SIG_IGN in a process started with it ignored
    signals = interrupts.LaunchInterrupts().install()
    try:
        os.kill(os.getpid(), signal.SIGINT)  # before any job starts: recorded, no KeyboardInterrupt
        assert signals.received == signal.SIGINT and signals.status == 130
        stop_file = tmp_path / "stop"
        stop_file.write_text("left by a launch that was killed\n")
        signals.watch(str(stop_file))  # jobs start now: the signal that came is theirs
        assert stop_file.read_text() == f"{int(signal.SIGINT)}\n"
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):
            os.kill(os.getpid(), signum)
        signals.ended()
        os.kill(os.getpid(), signal.SIGINT)
    finally:
        signals.hand_back()
    assert signal.getsignal(signal.SIGINT) is before
    assert signals.count == 5 and signals.received == signal.SIGINT
    err = capfd.readouterr().err.splitlines()
    assert err[0] == "dew-train: Ctrl-C: stopping before any job starts"
    assert err[1].startswith("dew-train: Ctrl-C again: ignored; a save is in progress: every job is writing")
    assert err[2].startswith("dew-train: SIGTERM again: ignored; a save is in progress")
    assert err[4] == "dew-train: Ctrl-C again: ignored; the command is already stopping" and len(err) == 5


LATE_CTRL_C = """
import atexit, os, signal, sys, time
from dew.launching import interrupts

interrupts.install_for_sweep(["-m"])


class TornDownLast:
    def __del__(self):  # while the interpreter tears its modules down, as a Ctrl-C can land then
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)


torn_down_last = TornDownLast()
atexit.register(os.kill, os.getpid(), signal.SIGINT)  # a Ctrl-C during the exit handlers


@interrupts.ends_at_once
def main():
    os.kill(os.getpid(), signal.SIGINT)
    interrupts.stop_before_start()


main()
"""


def test_a_ctrl_c_while_the_command_ends_still_meets_its_handler():
    """Python puts SIGINT back to its default action before tearing its modules down; a sweep's
    command ends before that (``interrupts.ends_at_once``), so a late Ctrl-C cannot kill it."""
    done = subprocess.run([sys.executable, "-c", LATE_CTRL_C], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done
    assert done.stderr.splitlines() == [
        "dew-train: Ctrl-C: stopping before any job starts",
        "dew-train: interrupted before the launch: no job was started; the same command starts them",
        "dew-train: Ctrl-C again: ignored; the command is already stopping",
    ]


@pytest.mark.slow
def test_ctrl_c_at_ten_moments_then_resume_bit_for_bit(workdir: Path):
    began = time.monotonic()
    whole = launch(workdir, "whole", workdir / "whole.out")
    failures: list[str] = []
    phases: collections.Counter = collections.Counter()
    cut = threading.Thread(target=chain, args=(workdir, "cut", failures, phases))
    cut.start()
    assert finish(whole) == 0, (workdir / "whole.out").read_text()[-3000:]
    cut.join()
    print(f"{len(MOMENTS)} Ctrl-Cs in {time.monotonic() - began:.0f} s; landed: {dict(phases)}")
    assert not failures, "\n".join(failures)

    reference = next((workdir / "ck").glob("whole-sweep-*/0*"))
    expected = losses(read_journal(next((workdir / "tracking").glob("whole-sweep-*/*/journal.jsonl"))))
    assert len(expected) == STEPS
    journal = next((workdir / "tracking").glob("cut-sweep-*/*/journal.jsonl"))
    if read_journal(journal)[-1]["event"] != "end":  # the last Ctrl-C came before the end took place
        out = workdir / "cut-last.out"
        assert finish(launch(workdir, "cut", out)) == 0, out.read_text()[-3000:]
    records = read_journal(journal)
    assert records[-1]["event"] == "end" and losses(records) == expected
    a, b = host_params(reference, STEPS), host_params(next((workdir / "ck").glob("cut-sweep-*/0*")), STEPS)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    print(f"resumed bit for bit; {time.monotonic() - began:.0f} s in all")
