"""A stuck rank costs one ``trainer.stall_timeout``, not the allocation: a 2-process run under the
local launcher (``hydra/launcher=local``, 2 tasks) whose process 1 is stopped (SIGSTOP: alive, and
running nothing, as a frozen node or a process stuck in the kernel) mid-run. Process 0, held in the
step's collective, says within the timeout which process is not running and where its own threads
are, ends the stopped one and requeues the job (the local executor's status 144); both tasks start
again, resume from the last checkpoint and finish the run."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from dew.contract.journal import read_journal
from dew.runs.goodput import ledger
from dew.training.watchdog import WATCHDOG_DIR, heartbeat_name
from tests.cli.slow_first_start import slow_first_start
from tests.cli.test_interrupts import Tail
from tests.cli.test_sweep_launch import finish, in_its_own_group
from tests.training.conftest import TINY
from tests.training.test_multiprocess import until

STEPS, CKPT, STOP_AT, TIMEOUT_S, SLOW_S = 60, 20, 22, 10, 0.2
LOCAL = [
    "-m",
    "hydra/launcher=local",
    "hydra.launcher.tasks_per_node=2",
    *TINY,
    f"trainer.steps={STEPS}",
    "trainer.eval_every=null",
    f"trainer.checkpoint_every={CKPT}",
    "trainer.checkpoint_dir=ck",
    f"trainer.stall_timeout={TIMEOUT_S}",
    "trainer.name=stuck",
]


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_stopped_process_is_named_ended_and_the_job_requeued_and_finished(workdir: Path):
    # Every program is in the suite's compilation cache: a plugin's hook makes each step of the first
    # start SLOW_S long, so that the run is still training when the test stops one of its processes
    # after step STOP_AT (38 steps, 7.6 s of margin); the resumed start's 40 steps run at their own
    # pace. A step of a 2-process run costs ~0.1 CPU-s however long it sleeps (the step's own work,
    # its all-reduces over gloo: py-spy finds ~4 ms of it in Python), so the margin is bought with
    # slower steps rather than more of them: the run was 100 steps of 0.1 s, whose resumed start
    # trained 80 steps and saved 4 checkpoints.
    pythonpath, hook = slow_first_start(workdir / "site", SLOW_S)
    proc = in_its_own_group([*LOCAL, hook], workdir, workdir / "out.log", PYTHONPATH=pythonpath)
    rank0 = Tail(lambda: list((workdir / "ck").glob("stuck-sweep-*/.submitit/*/*_0_log.*")))
    try:
        # Past step STOP_AT, with the checkpoint of step CKPT committed (both processes' shards and
        # the metadata after them: a save that one stopped process holds back is never complete).
        def past_a_checkpoint() -> bool:
            committed = any((workdir / "ck").glob(f"stuck-sweep-*/*/{CKPT}/_CHECKPOINT_METADATA"))
            return committed and bool(re.search(rf"step {STOP_AT}/{STEPS}  loss", rank0.read()))

        until(lambda: proc.poll() is not None or past_a_checkpoint(), 300)
        assert proc.poll() is None, (workdir / "out.log").read_text()[-3000:]
        [beats] = (workdir / "ck").glob(f"stuck-sweep-*/*/{WATCHDOG_DIR}")
        until(lambda: (beats / heartbeat_name(1)).exists() and (beats / heartbeat_name(0)).exists(), 60)
        stopped = json.loads((beats / heartbeat_name(1)).read_text())["pid"]
        first = json.loads((beats / heartbeat_name(0)).read_text())["pid"]
        os.kill(stopped, signal.SIGSTOP)
        at = time.monotonic()
        until(lambda: not alive(stopped) and not alive(first), TIMEOUT_S + 60)  # both ended
        ended_s = time.monotonic() - at
        assert finish(proc) == 0, (workdir / "out.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            finish(proc, timeout=0)
    log = rank0.read()
    said = re.search(
        r"stalled: process 0 of 2 made no progress for (\d+) s \(trainer.stall_timeout=10 s\), after "
        r"step (\d+), in step \d+; process 1 is not running",
        log,
    )
    assert said, log[-5000:]
    assert TIMEOUT_S <= int(said.group(1)) <= TIMEOUT_S + 10
    assert ended_s <= TIMEOUT_S + 60, ended_s
    stalled_at = int(said.group(2))
    assert STOP_AT <= stalled_at < STEPS
    assert re.search(rf"process 1 \(pid {stopped} on \S+\): not running \(stopped, frozen or gone\)", log)
    assert "the threads of process 0" in log and "Thread MainThread" in log and 'File "' in log  # its stacks
    assert f"ending process 1 (pid {stopped}): it is not running" in log
    assert "requeued the job: it resumes from its last checkpoint" in log
    journal = read_journal(next((workdir / "tracking").glob("stuck-sweep-*/*/journal.jsonl")), raw=True)
    lifecycle = [(r["event"], r["step"]) for r in journal if r.get("event") in ("start", "stop", "resume", "end")]
    assert [e for e, _ in lifecycle] == ["start", "stop", "resume", "end"], lifecycle
    (_, resumed), (_, ended) = lifecycle[2], lifecycle[3]
    assert lifecycle[1] == ("stop", stalled_at) and ended == STEPS
    assert resumed % CKPT == 0 and 0 < resumed <= stalled_at  # from a checkpoint saved before the stall
    [stop] = [r for r in journal if r.get("event") == "stop"]
    assert (stop["reason"], stop["stuck"], stop["requeued"]) == ("stalled", [1], True)
    # The goodput ledger of the 2-process run: its buckets add up to its wall time, the steps past the
    # checkpoint it resumed from are lost, and the stall itself (no step for the timeout) is train time
    # its stop event counted.
    led = ledger("stuck", journal)
    assert sum(led.seconds.values()) == pytest.approx(led.wall, rel=0.01)
    assert (led.starts, led.lost_steps, led.final_step) == (2, stalled_at - resumed, STEPS)
    assert led.seconds["lost"] > 0 and led.seconds["train"] >= TIMEOUT_S
