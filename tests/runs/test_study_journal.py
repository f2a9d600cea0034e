"""A search's study in Optuna's journal file storage (``dew.runs.study_storage.journal``) written by
several processes at once on a filesystem without ``flock`` (Lustre without ``-o flock``: the suite's
stand-in, ``tests.fs_sim.noflock_env``): eight processes writing one study (200 trials in all, each
with parameters, intermediate values, a user attribute and a final state) lose or corrupt no record.

The writers contend for the journal's lock file (``O_EXCL``; the test counts the waits). On a local
filesystem a one-line append under ``O_APPEND`` is whole even without a lock; the lock is what keeps
appends whole on NFS, where ``O_APPEND`` is not atomic across clients: this test shows it taken and
released by every writer with ``flock`` failing, nothing lost, nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

WRITERS = 8
TRIALS_EACH = 25
STUDY = "contended"
TIMEOUT_S = 120

# One writer: checks that flock fails here, opens the journal, waits at the barrier, then races the
# others to create the study (create_study(load_if_exists=True): the journal keeps the first
# CREATE_STUDY line and each later writer loads that study) and runs its trials by ask and tell. What
# it told is written to told-<writer>.json for the test to compare with what the journal holds.
WRITER = """
import errno, fcntl, json, os, sys, time

writer, root, trials = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
with open(os.path.join(root, f"flock-{writer}"), "w") as f:
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    except OSError as err:
        flock_errno = errno.errorcode[err.errno]
    else:
        sys.exit("fcntl.flock worked: this is not the flock-less filesystem")

import optuna
from optuna.storages.journal import JournalFileOpenLock
from optuna.trial import TrialState

from dew.runs.study_storage import journal


class CountingTime:  # the lock's acquire sleeps (its module's time.sleep) only when another writer holds it
    waits = 0

    def __getattr__(self, name):
        return getattr(time, name)

    def sleep(self, seconds):
        CountingTime.waits += 1
        time.sleep(seconds)


sys.modules[JournalFileOpenLock.__module__].time = CountingTime()
optuna.logging.set_verbosity(optuna.logging.WARNING)
storage = journal(os.path.join(root, "study.journal"))
open(os.path.join(root, f"ready-{writer}"), "w").close()
while not os.path.exists(os.path.join(root, "go")):
    time.sleep(0.001)

study = optuna.create_study(
    study_name=sys.argv[4],
    storage=storage,
    direction="minimize",
    sampler=optuna.samplers.RandomSampler(seed=writer),
    load_if_exists=True,
)
told = []
for index in range(trials):
    trial = study.ask()
    x = trial.suggest_float("x", -10.0, 10.0)
    n = trial.suggest_int("n", 1, 100)
    trial.set_user_attr("writer", [writer, index])
    steps = {0: x * x, 1: x * x + n}
    for step, value in steps.items():
        trial.report(value, step)
    state = ("FAIL", "PRUNED", "COMPLETE", "COMPLETE", "COMPLETE")[(writer + index) % 5]
    value = x * x + n / 100 if state == "COMPLETE" else None
    if value is not None:
        study.tell(trial, value)
    else:
        study.tell(trial, state=TrialState[state])
    told.append({"writer": writer, "index": index, "number": trial.number, "state": state, "value": value,
                 "params": {"x": x, "n": n}, "intermediate_values": steps})
with open(os.path.join(root, f"told-{writer}.partial"), "w") as f:
    json.dump({"flock": flock_errno, "lock_waits": CountingTime.waits, "trials": told}, f)
os.replace(os.path.join(root, f"told-{writer}.partial"), os.path.join(root, f"told-{writer}.json"))
"""


def _said(root: Path, writer: int) -> str:
    return (root / f"stderr-{writer}").read_text()[-3000:]


def _wait(procs: list[subprocess.Popen], until, what: str, root: Path, deadline: float) -> None:
    """Poll until ``until()`` holds; a writer that fails or a deadline passed fails the test (the
    caller SIGKILLs the writers)."""
    while not until():
        for w, p in enumerate(procs):
            if p.poll() not in (None, 0):
                pytest.fail(f"writer {w} exited {p.returncode} while {what}:\n{_said(root, w)}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {TIMEOUT_S} s while {what}")
        time.sleep(0.005)


def _write_concurrently(root: Path) -> None:
    """Run the writers together: each starts (imports optuna, opens the journal), says it is ready,
    and all begin at once when ``go`` appears. SIGKILLed when past ``TIMEOUT_S``."""
    from tests.fs_sim import noflock_env

    env = noflock_env(os.environ.copy())
    procs = []
    for w in range(WRITERS):
        with open(root / f"stderr-{w}", "w") as err:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", WRITER, str(w), str(root), str(TRIALS_EACH), STUDY],
                    env=env,
                    cwd=root,
                    stdout=err,
                    stderr=subprocess.STDOUT,
                )
            )
    deadline = time.monotonic() + TIMEOUT_S
    try:
        _wait(procs, lambda: all((root / f"ready-{w}").exists() for w in range(WRITERS)), "starting", root, deadline)
        (root / "go").touch()
        _wait(procs, lambda: all(p.poll() is not None for p in procs), "writing", root, deadline)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()
    for w, p in enumerate(procs):
        assert p.returncode == 0, f"writer {w} exited {p.returncode}:\n{_said(root, w)}"


@pytest.mark.slow  # eight Python processes importing optuna and writing: 2-4 s on 2 cores
def test_eight_processes_writing_one_journal_study_without_flock_lose_nothing(tmp_path: Path):
    import optuna

    from dew.runs.study_storage import journal

    _write_concurrently(tmp_path)
    told = [json.loads((tmp_path / f"told-{w}.json").read_text()) for w in range(WRITERS)]
    assert {t["flock"] for t in told} == {"ENOSYS"}  # every writer ran where flock fails
    # and they wrote at once: writers found the journal's lock file held by another, and waited
    assert sum(t["lock_waits"] for t in told) > 0, [t["lock_waits"] for t in told]
    expected = {(r["writer"], r["index"]): r for t in told for r in t["trials"]}
    assert len(expected) == WRITERS * TRIALS_EACH

    # the file: every line whole JSON, one study created (the racing writers' later CREATE_STUDY lines
    # are ignored), no lock file nor a lock's rename left behind
    path = tmp_path / "study.journal"
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    lines = [json.loads(line) for line in raw.decode().splitlines()]
    creates = [line for line in lines if line["op_code"] == 0]
    assert 1 <= len(creates) <= WRITERS and {c["study_name"] for c in creates} == {STUDY}
    assert [p.name for p in tmp_path.iterdir() if ".lock" in p.name or p.name.endswith(".rename")] == []
    # and nothing else: 7 lines a trial (created, two parameters, a user attribute, two intermediate
    # values, its state with its value), and the CREATE_STUDY lines
    assert len(lines) == 7 * WRITERS * TRIALS_EACH + len(creates), len(lines)

    # the study, read back as any reader reads it
    [summary] = optuna.get_all_study_summaries(journal(str(path)))
    study = optuna.load_study(study_name=summary.study_name, storage=journal(str(path)))
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == WRITERS * TRIALS_EACH
    assert sorted(t.number for t in trials) == list(range(WRITERS * TRIALS_EACH))
    by_writer = {tuple(t.user_attrs["writer"]): t for t in trials}
    assert sorted(by_writer) == sorted(expected)  # every (process, index) pair once
    for key, t in by_writer.items():
        want = expected[key]
        assert t.number == want["number"], key  # every writer saw the number the study holds
        assert t.state.name == want["state"], key
        assert t.params == want["params"] and type(t.params["n"]) is int, key  # exact: floats round-trip
        assert t.intermediate_values == {int(k): v for k, v in want["intermediate_values"].items()}, key
        assert t.datetime_complete is not None, key
        if want["state"] == "COMPLETE":
            assert t.value == want["value"], key
        elif want["state"] == "PRUNED":  # Optuna records a pruned trial's last intermediate value
            assert t.value == want["intermediate_values"]["1"], key
        else:
            assert t.value is None, key
        assert set(t.user_attrs) == {"writer"}, key
    states = [t.state.name for t in trials]
    assert states.count("FAIL") == states.count("PRUNED") == WRITERS * TRIALS_EACH // 5
    assert study.best_value == min(r["value"] for r in expected.values() if r["value"] is not None)
