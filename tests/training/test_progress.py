"""What the console shows while a run trains (dew.training.reporting.progress): lines at the first
steps (the 1-2-5 ladder) and then every ``log_every``, each with an ETA; a line at the end of its
step once steps are long, not one step late; on a terminal a live line, never in train.log."""

from __future__ import annotations

import logging
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dew.training.hooks import At, Started
from dew.training.reporting.progress import Progress, duration, ladder, on_a_terminal
from tests.training.conftest import TINY, fast_env, slow_steps


def test_the_ladder_runs_1_2_5_below_log_every():
    assert ladder(100) == [1, 2, 5, 10, 20, 50]
    assert ladder(1000) == [1, 2, 5, 10, 20, 50, 100, 200, 500]
    assert ladder(6) == [1, 2, 5] and ladder(2) == [1] and ladder(1) == []


def _at(step: int, loss: float, last: bool = False) -> At:
    return At(step, step * 32, None, {"train/loss": loss, "train/lr": 1e-3}, last)  # type: ignore[arg-type]


def test_lines_at_the_ladder_then_the_cadence_with_an_eta(caplog, monkeypatch):
    clock = iter(float(t) for t in range(100, 10_000, 2))  # each reading 2 s after the one before
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    progress = Progress(every=100, total_steps=1000)
    progress.start(Started(None, None, None, step=300, total_steps=1000, request_stop=lambda r: None))  # type: ignore[arg-type]
    # resumed at 300: the ladder counts from there, the cadence is the journal's (every 100 steps)
    due = [s for s in range(301, 1001) if progress.due(s, last=s == 1000)]
    assert due == [301, 302, 305, 310, 320, 350, 400, 500, 600, 700, 800, 900, 1000]
    caplog.set_level(logging.INFO, logger="dew.progress")
    progress.on_step(_at(301, 2.5))  # the first step's time (compiling) is not a rate
    progress.on_step(_at(302, 2.4))  # 2 s later: 2 s/step, 698 steps left
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "step 301/1000  loss 2.5  lr 0.001  elapsed 2.0 s"
    assert lines[1] == "step 302/1000  loss 2.4  lr 0.001  2 s/step  elapsed 4.0 s  eta 23.3 min"
    progress.before(302)  # the loop dispatches step 303; the live line, 2 s into it:
    assert progress.status() == "step 303/1000 running 2.0 s  elapsed 8.0 s  2 s/step  eta 23.2 min  loss 2.4  lr 0.001"
    progress.on_eval(400, {}, None)  # type: ignore[arg-type]  # nothing evaluated: no line
    assert len(caplog.records) == 2
    assert [duration(s) for s in (5, 600, 36_000)] == ["5.0 s", "10.0 min", "10.0 h"]


def test_the_live_line_is_for_a_terminal_of_a_run_of_its_own(monkeypatch):
    leader, follower = pty.openpty()
    progress = logging.getLogger("dew.progress")
    with open(follower, "w") as tty, open(os.devnull, "w") as devnull:
        monkeypatch.setattr(progress, "level", logging.INFO)
        monkeypatch.setenv("TERM", "xterm")
        for var in ("SLURM_JOB_ID", "SUBMITIT_EXECUTOR"):
            monkeypatch.delenv(var, raising=False)
        assert on_a_terminal(tty) and not on_a_terminal(devnull)
        monkeypatch.setenv("SLURM_JOB_ID", "7")  # a SLURM job's output is a file read later
        assert not on_a_terminal(tty)
        monkeypatch.delenv("SLURM_JOB_ID")
        monkeypatch.setenv("TERM", "dumb")
        assert not on_a_terminal(tty)
        monkeypatch.setenv("TERM", "xterm")
        console = logging.StreamHandler(tty)
        console.setLevel(logging.WARNING)  # +hydra.job_logging.handlers.console.level=WARNING
        logging.getLogger().addHandler(console)
        try:
            assert not on_a_terminal(tty)
        finally:
            logging.getLogger().removeHandler(console)
        progress.setLevel(logging.WARNING)  # the progress lines turned down: no live line either
        assert not on_a_terminal(tty)
    os.close(leader)


SLOW = 1.0
"""Seconds a step takes at least (the slow_steps plugin's sleep: tests/training/conftest.py)."""


def _on_a_terminal(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[str, dict[int, float]]:
    """Run dew-train with a terminal (a pty) as its console: what it wrote, and when each progress
    line for a step (not an evaluation) arrived."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dew.cli.train", *args],
        cwd=cwd,
        env=env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    out, seen, deadline = b"", {}, time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not select.select([leader], [], [], 0.05)[0]:
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            now, out = time.time(), out + chunk
            for m in re.finditer(rb"\[dew\.progress\]\[INFO\] step (\d+)/\d+  loss ", out):
                seen.setdefault(int(m.group(1)), now)
        proc.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    assert proc.returncode == 0, out.decode(errors="replace")[-3000:]
    return out.decode(errors="replace"), seen


@pytest.mark.slow
def test_a_slow_run_shows_each_early_step_at_its_end_and_moves_on_a_terminal(tmp_path: Path):
    ends = tmp_path / "step_ends.txt"
    # A plugin's hook makes each step SLOW seconds long and writes down when each step ended.
    pythonpath, hook = slow_steps(tmp_path / "site", SLOW, str(ends))
    env = fast_env(PYTHONPATH=pythonpath, TERM="xterm")
    for var in ("SLURM_JOB_ID", "SUBMITIT_EXECUTOR"):
        env.pop(var, None)
    args = [
        *TINY,
        "trainer.steps=7",
        "trainer.log_every=6",  # the ladder 1, 2, 5; then 6 (the cadence) and 7 (the last)
        "trainer.eval_every=null",
        "trainer.checkpoint_every=null",
        f"trainer.checkpoint_dir={tmp_path / 'ck'}",
        "trainer.name=slow",
        hook,
    ]
    console, arrived = _on_a_terminal(args, tmp_path, env, timeout=120)
    ended = {int(s): float(t) for s, t in (line.split() for line in ends.read_text().splitlines())}
    assert sorted(arrived) == [1, 2, 5, 6, 7]
    for step in (1, 2, 5, 6):
        # The line for a step came within 5 s of its end (the plugin writes it down after the
        # progress line) and before half of the next step had passed: not one step late.
        late = arrived[step] - ended[step]
        assert late < 5 and late < (ended[step + 1] - ended[step]) / 2, (step, late, ended)
    eta = r"[\d.]+ s/step  elapsed [\d.]+ s  eta [\d.]+ s"
    assert re.search(rf"step 2/7  loss \S+  grad_norm \S+  lr \S+  {eta}", console)
    assert re.search(r"\x1b\[2Kstep 3/7 running [\d.]+ s  elapsed", console)  # the live line, moving
    log = (tmp_path / "ck" / "slow" / "train.log").read_text()
    assert "\x1b" not in log and "running" not in log  # a file gets the lines, plain, never the live one
    assert [int(s) for s in re.findall(r"\[dew\.progress\]\[INFO\] step (\d+)/7  loss", log)] == [1, 2, 5, 6, 7]
