"""Ctrl-C at any moment of a local multi-process sweep (``dew-train -m hydra/launcher=local``, 2
tasks): no traceback, status 130, one line per job, the newest complete checkpoint kept (the stop
checkpoint added once the tasks trained a step), and the run resumed to the end of a run that was
never interrupted, bit for bit.

Seven moments, each a separate launch, as a terminal sends Ctrl-C (SIGINT to the process group),
five of them followed by a second one 0.2 s later; and two stops that are not a terminal's: SIGUSR2
to rank 1 alone while it sets up (a requeue that rank 0 learns of from JAX's notifier: the job
requeues and resumes, then takes a Ctrl-C) and SIGTERM to every task (a scheduler's stop, no
requeue: status 143, one line). To keep it cheap, the moments are one run's, interrupted nine
times in a row (every launch resumes what the one before saved) while the run never interrupted
trains beside it (one process of the job's two devices: the same batches and gradient sums). A
moment is a fixed delay after the launching process took the signals (its first lines: a Ctrl-C
before them meets Python's own start, as for any Python command) while it imports or composes,
before any task starts, or the first line of the launch's rank-0 task log (rank 1's for its SIGUSR2)
that marks a phase (the task's set-up, its compilation, a step, a checkpoint, an evaluation, the
run's end)."""

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
from tests import warm
from tests.cli.test_sweep_launch import finish, in_its_own_group, tasks
from tests.training.conftest import TINY, dew_train, fast_env, losses
from tests.training.test_multiprocess import events, host_params

# Room for the stops: one lands up to ~60 steps after its signal, more on a quiet machine, whose
# steps are fast (~60 a second) beside the signal's way to the tasks and JAX's agreement on the step.
# An evaluation every 20 steps and a checkpoint every 10 let the evaluation and checkpoint moments
# wait at most 20 and 10 steps for their step. Under load (the suite's other worker, or a third
# 2-task launch beside the chain until 2026-12-07) the checkpoint stop landed at step 70-71 (load
# 10, 10 and 3); alone on a quiet machine it landed at 201 and 100, and once the SIGTERM moment
# began at step 160 of the 180 the run had until then, too late for the run to take it.
# 300 steps cost little: a step of a 2-process run ~0.1 CPU-s (the test alone 139-144 CPU-s with
# 180, 147 with 300); a save or an evaluation of this model costs too little to measure beside it
# (a 240-step launch saving every 20 steps or once: 35.3 against 35.6 CPU-s at load 12).
STEPS, CKPT, EVAL = 300, 10, 20
RUN = [
    *TINY,
    f"trainer.steps={STEPS}",
    f"trainer.eval_every={EVAL}",
    f"trainer.checkpoint_every={CKPT}",
    "trainer.checkpoint_dir=ck",
]  # the suite's compilation cache (TINY's): later launches load what the first compiled
LOCAL = ["-m", "hydra/launcher=local", "hydra.launcher.tasks_per_node=2", *RUN]

# (phase, trigger, second Ctrl-C): a trigger is seconds after the launch, or what the launch's rank-0
# log shows: a line, "+k" (k steps after the step it resumed from), "ckpt"/"eval" (the line of the
# next step that saves / evaluates, written just before it does), "end" (the last step's line).
# The stop is a Ctrl-C unless the moment names another: "usr2" (SIGUSR2 to rank 1 alone, at rank 1's
# line; the requeued job takes a Ctrl-C two steps after it resumed) or "term" (SIGTERM to every task).
MOMENTS = [
    ("before the pool", 0.3, True),
    ("compilation", "compiling the train step", True),
    ("mid-step", "+3", False),
    ("set-up", "joined the JAX process pool", True),
    ("set-up", "joined the JAX process pool", "usr2"),
    ("evaluation", "eval", True),
    ("mid-step", "+3", "term"),
    # A checkpoint's Ctrl-C once is the first of these two: a launch of its own for it (once before
    # 2026-12-06) stopped the run at the same point, ~12 CPU-s of launcher and two cold tasks.
    ("checkpoint", "ckpt", True),
    ("end", "end", False),
]


def launch(workdir: Path, name: str, log: Path, cold: bool = False) -> subprocess.Popen | warm.Started:
    """The sweep launched as from a terminal: its own process group, the foreground job; forked
    from the suite's warm interpreter, or ``cold`` (tests.cli.test_sweep_launch.in_its_own_group)."""
    return in_its_own_group([*LOCAL, f"trainer.name={name}"], workdir, log, cold=cold)


def task_logs(workdir: Path, name: str) -> dict[Path, str]:
    return {p: p.read_text() for p in log_paths(workdir, name)}


def log_paths(workdir: Path, name: str) -> list[Path]:
    return list((workdir / "ck").glob(f"{name}-sweep-*/.submitit/*/*_log.*"))


class Tail:
    """The text of the files ``find()`` lists, read as they grow: each look reads only what was
    appended, and lists the files again at most every 0.2 s. Globbing and reading the whole logs at
    each look (every 10 ms) took 6.6 CPU-s of the test's own process run alone, against 3.0
    (2026-12-04; 16.8 in a loaded suite run), CPU the tasks it waits for need; it looks every 20 ms
    since 2026-12-06."""

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


def interrupt(workdir: Path, name: str, n: int, trigger: float | str, how: bool | str) -> tuple[int, str, str, bool]:
    """One launch, stopped at ``trigger`` (``how``: a Ctrl-C, True for a second one after it, or
    "usr2"/"term", MOMENTS says): (status, its output, what the rank-0 log showed then, whether a
    second Ctrl-C reached it: a launch stopped before its pool may have ended first)."""
    second, double = False, how is True
    before = set(log_paths(workdir, name))
    log = workdir / f"{name}{n}.out"
    # A moment timed from the launch's start meets a cold start's imports and composition, as a
    # user's Ctrl-C in the first second does; the others, timed by the tasks' logs, start warm.
    proc, began, rank0, rank1 = launch(workdir, name, log, cold=isinstance(trigger, float)), None, "", ""
    new = lambda rank: [p for p in log_paths(workdir, name) if p not in before and p.name.endswith(f"_{rank}_log.out")]  # noqa: E731
    logs, logs1 = Tail(lambda: new(0)), Tail(lambda: new(1))
    try:
        while proc.poll() is None:
            if began is None and takes_the_signals(proc.pid):
                began = time.monotonic()
            if reached(trigger, began, rank1 if how == "usr2" else rank0):
                break
            time.sleep(0.02)  # a look every 20 ms: a few steps' time at most, and a Ctrl-C lands later still
            rank0 = logs.read()  # this launch's rank 0 (its job's, a requeue's)
            rank1 = logs1.read() if how == "usr2" else ""
        if how in ("usr2", "term"):
            return finish(other_stop(workdir, name, proc, how, rank1)), log.read_text(), rank0, False
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


def other_stop(
    workdir: Path, name: str, proc: subprocess.Popen | warm.Started, how: str, rank1: str
) -> subprocess.Popen | warm.Started:
    """Stop the launch ``proc`` as a scheduler would: SIGTERM to every task ("term"), or SIGUSR2 to
    rank 1 alone while it sets up ("usr2": the job saves, requeues and resumes; two steps later a
    Ctrl-C ends it). Returns ``proc``."""
    if how == "term":
        for pid in tasks(proc):
            os.kill(pid, signal.SIGTERM)
        return proc
    assert "and ran step 1" not in rank1, rank1[-2000:]  # compiled (or loaded) the step and ran it: not yet
    journal = next((workdir / "tracking").glob(f"{name}-sweep-*/*/journal.jsonl"))
    stops = sum(kind == "stop" for kind, _ in events(read_journal(journal)))
    os.kill(tasks(proc)[1], signal.SIGUSR2)

    def resumed_and_trained() -> int | None:  # the step two steps past the requeue's resume, once logged
        kinds = events(read_journal(journal))
        if sum(kind == "stop" for kind, _ in kinds) <= stops or kinds[-1][0] != "resume":
            return None
        return kinds[-1][1] + 2 if f'"step": {kinds[-1][1] + 2},' in journal.read_text() else None

    deadline = time.monotonic() + 300
    while proc.poll() is None and resumed_and_trained() is None:
        assert time.monotonic() < deadline, "the requeued job did not resume"
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    return proc


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
    for n, (phase, trigger, how) in enumerate(MOMENTS):
        run = next((workdir / "ck").glob(f"{name}-sweep-*/0*"), None)
        newest = max((int(p.name) for p in run.iterdir() if p.name.isdigit()), default=None) if run else None
        journal = next((workdir / "tracking").glob(f"{name}-sweep-*/*/journal.jsonl"), None)
        known = len(events(read_journal(journal))) if journal else 0
        code, out, rank0, second = interrupt(workdir, name, n, trigger, how)
        phases[landed(rank0)] += 1
        shown = "twice" if how is True else "once" if how is False else how
        where = f"{name}{n} ({phase}, landed {landed(rank0)}, {shown})"
        logs = task_logs(workdir, name)
        outputs = [out, *logs.values()]
        lines = [line for line in out.splitlines() if line.startswith("dew-train:")]
        if code == 0 and newest == STEPS and not any("Traceback" in text for text in outputs):
            # The launch before stopped at the last step: this one resumes a finished run, which ends
            # before a Ctrl-C can reach it (nothing is left to interrupt); the end is still compared.
            continue
        if code != (128 + signal.SIGTERM if how == "term" else 130) or any(
            "Traceback" in text or "UncompletedJobError" in text for text in outputs
        ):
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
        failures.extend(f"{where}: {said}" for said in stopped_as_said(workdir, name, how, lines, known, run))


def stopped_as_said(
    workdir: Path, name: str, how: bool | str, lines: list[str], known: int, run: Path | None
) -> list[str]:
    """What is wrong with the launch's last line and its journal, for a launch whose tasks stopped
    at a step they saved: the line names that step, its checkpoint and the command that resumes it;
    a SIGUSR2 to rank 1 requeued the job (stopped, resumed, stopped again)."""
    journal = next((workdir / "tracking").glob(f"{name}-sweep-*/*/journal.jsonl"), None)
    kinds = events(read_journal(journal))[known:] if journal else []
    if how == "usr2":
        requeued = [kind for kind, _ in kinds if kind != "start"][-3:] == ["stop", "resume", "stop"]
        logged = "".join(p.read_text() for p in (workdir / "ck").rglob("*_0_log.out"))
        if not requeued or "Requeued job" not in logged:
            return [f"SIGUSR2 to rank 1 did not requeue the job: {kinds}"]
    if not kinds or kinds[-1][0] != "stop" or run is None:
        return []  # stopped before the tasks trained a step of this launch
    stopped, last = kinds[-1][1], lines[-1]
    wanted = [f"stopped at step {stopped}, checkpoint ", f"{run.relative_to(workdir)}/{stopped};"]
    wanted.append("resume with: dew-train -m hydra/launcher=local")
    if not last.startswith("dew-train: job 0 (") or not all(w in last for w in wanted):
        return [f"the last line {last!r} does not say {wanted}"]
    return []


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
def test_ctrl_c_at_seven_moments_a_requeue_and_a_sigterm_then_resume_bit_for_bit(workdir: Path):
    began = time.monotonic()
    failures: list[str] = []
    phases: collections.Counter = collections.Counter()
    cut = threading.Thread(target=chain, args=(workdir, "cut", failures, phases))
    cut.start()
    # The run never interrupted: one process of two CPU devices, the job's two tasks' mesh (data 2)
    # in one process, whose gradient sums (two halves of the batch added) and batches are the tasks'
    # bit for bit; it saves its last step alone and never evaluates (neither moves a step). As a
    # third 2-task launch it took ~60 of the test's ~200 CPU-s (2026-12-07).
    alone = [*RUN, "trainer.eval_every=null", "trainer.checkpoint_every=null", "trainer.name=whole"]
    whole = dew_train(*alone, cwd=workdir, env=fast_env(JAX_NUM_CPU_DEVICES="2"))
    assert whole is not None and whole.returncode == 0, whole and whole.stdout[-3000:]
    cut.join()
    print(f"{len(MOMENTS)} stops in {time.monotonic() - began:.0f} s; landed: {dict(phases)}")
    assert not failures, "\n".join(failures)

    reference = workdir / "ck" / "whole"
    expected = losses(read_journal(workdir / "tracking" / "whole" / "journal.jsonl"))
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
