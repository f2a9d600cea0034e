"""One writer per run directory: a second dew-train on a busy run directory is refused at once,
naming the holder's host and PID; a holder killed with SIGKILL leaves no lock behind, and the run
resumes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dew.cli.train import EXIT_BUSY
from dew.training.lock import holder
from tests.training.conftest import TINY, dew_train, fast_env

# Long enough to still be running while the second start is refused.
ARGS = [*TINY, "trainer.name=r", "trainer.steps=1000000", "trainer.log_every=100", "trainer.eval_every=null",
        "trainer.checkpoint_every=20", "trainer.checkpoint_dir=ck"]


def _wait(condition, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the first run ended (status {proc.returncode})"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_second_writer_is_refused_and_a_killed_holder_leaves_no_lock(workdir: Path):
    run = workdir / "ck" / "r"
    log = open(workdir / "first.out", "w")  # noqa: SIM115 - a file, not a pipe: a chatty run never blocks
    first = subprocess.Popen([sys.executable, "-m", "dew.cli.train", *ARGS], cwd=workdir, env=fast_env(),
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: (run / "20").is_dir(), first)  # it holds the lock and has a checkpoint
        assert holder(run) == {"host": socket.gethostname(), "pid": first.pid, "started": holder(run)["started"]}

        started = time.monotonic()
        second = subprocess.run([sys.executable, "-m", "dew.cli.train", *ARGS], cwd=workdir, env=fast_env(),
                                capture_output=True, text=True, timeout=300)
        elapsed = time.monotonic() - started
        assert first.poll() is None  # refused while the first still runs, not after orbax's barrier
        assert second.returncode == EXIT_BUSY, second.stderr
        assert f"is in use by process {first.pid} on {socket.gethostname()}" in second.stderr
        assert "Traceback" not in second.stderr and "orbax-checkpoint-tmp" not in second.stderr
        print(f"the second dew-train was refused {elapsed:.2f} s after it started (Python, Hydra and the config)")
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        log.close()
    assert holder(run) is None  # the kernel released the lock with the process

    resumed = dew_train(*ARGS, cwd=workdir, kill_when=lambda w: "resuming r from step" in _text(run / "train.log"))
    assert resumed is None  # it took the lock and resumed (and was stopped there: the run is long)
    assert "resuming r from step" in (run / "train.log").read_text()


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_run_config_train_refuses_a_held_run_directory(tmp_path: Path):
    """A library user's RunConfig.train takes the lock too: a held directory is refused, naming the
    holder, with no record written."""
    from dew.training.lock import RunLockedError
    from tests.training.conftest import train_tiny

    run = tmp_path / "ck" / "run"
    holding = subprocess.Popen([sys.executable, "-c", "import sys, time; from dew.training.lock import RunLock; "
                                f"RunLock({str(run)!r}).acquire(); print('held', flush=True); time.sleep(600)"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert holding.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError, match=f"{run} is in use by process {holding.pid} on"):
            train_tiny(tmp_path, "trainer.steps=2")
        assert sorted(p.name for p in run.iterdir()) == [".lock"]
    finally:
        os.kill(holding.pid, signal.SIGKILL)
        holding.wait()
