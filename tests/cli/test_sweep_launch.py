"""What dew's launchers do with a sweep's job list before and after its jobs run: every job's config
checked before any is queued (nothing submitted, exit 2), a sweep whose jobs are alive refused
rather than submitted twice (exit 4), and, under the local launcher, a stop that never loses the
agreed checkpoint: Ctrl-C in the terminal, a scheduler's SIGTERM (one line per stopped job), and a
SIGUSR2 that reached one rank only (rank 0 requeues)."""

from __future__ import annotations

import contextlib
import os
import pickle
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dew.commandline.exits import EXIT_BAD_INPUT, EXIT_BUSY
from dew.contract.journal import read_journal
from dew.contract.lock import holder
from dew.launching.sweep_lock import SWEEP_LOCK_DIR
from tests import warm
from tests.conftest import dew, tree
from tests.training.conftest import TINY, fast_env
from tests.training.test_multiprocess import descendants, events, logged, until

pytestmark = pytest.mark.slow

RECORDER = """#!/bin/bash
# {name} stand-in: record that it was called, submit nothing.
echo "{name} $*" >> "{calls}"
echo "Submitted batch job 1"
"""


def recording_slurm(bin_dir: Path) -> Path:
    """``sbatch`` and ``srun`` on PATH that only record their calls (in the returned file)."""
    bin_dir.mkdir()
    calls = bin_dir / "calls"
    for name in ("sbatch", "srun"):
        (bin_dir / name).write_text(RECORDER.format(name=name, calls=calls))
        (bin_dir / name).chmod(0o755)
    return calls


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_a_bad_job_submits_nothing(workdir: Path):
    calls = recording_slurm(workdir.parent / "bin")
    env = fast_env(PATH=f"{calls.parent}{os.pathsep}{os.environ['PATH']}")
    began, cpu = time.monotonic(), _children_cpu()
    bad = dew(
        "-m",
        "hydra/launcher=slurm",
        *TINY,
        "trainer.checkpoint_dir=ck",
        "model.dtype=float33",
        "optim.learning_rate=0.001,0.002",
        cwd=workdir,
        env=env,
    )
    took, cpu = time.monotonic() - began, _children_cpu() - cpu
    print(f"refused in {took:.1f} s ({cpu:.1f} s of CPU)")
    assert bad.returncode == EXIT_BAD_INPUT and "Traceback" not in bad.stderr, bad.stderr
    lines = bad.stderr.strip().splitlines()
    assert lines[0].startswith("dew-train: error: job 0 (") and "optim.learning_rate=0.001" in lines[0]
    assert "model.dtype: expected one of 'float32', 'bfloat16', 'float16', found str 'float33'" in lines[0]
    assert lines[1].startswith("dew-train: error: job 1 (") and lines[-1].endswith("2 of 2 jobs would fail")
    assert not calls.exists() and tree(workdir) == []
    assert cpu < 5 and took < 20  # under 5 s on a quiet machine; the wall time grows with other work

    # The mesh against the devices the job asks for: 1 node x 8 GPUs splits no batch of 36.
    odd = dew(
        "-m",
        "hydra/launcher=slurm",
        *TINY,
        "trainer.checkpoint_dir=ck",
        "trainer.batch_size=32,36",
        cwd=workdir,
        env=env,
    )
    assert odd.returncode == EXIT_BAD_INPUT and not calls.exists() and tree(workdir) == [], odd.stderr
    assert "job 1 (" in odd.stderr and "job 0 (" not in odd.stderr
    assert "trainer.batch_size: a batch of 36 (per micro-batch) does not divide over the 8 devices" in odd.stderr

    # The batch's rows against the processes the job starts: 2 nodes x 2 tasks of one GPU each. With
    # tensor=2 a row sits on two tasks' GPUs, which would each fill it with their own records.
    rows = dew(
        "-m",
        "hydra/launcher=slurm",
        "hydra.launcher.nodes=2",
        "hydra.launcher.gpus_per_node=2",
        "hydra.launcher.tasks_per_node=2",
        *TINY,
        "trainer.checkpoint_dir=ck",
        "trainer.mesh.tensor=2,1",
        "trainer.multi_host=null,false",  # false: 4 processes, each its own copy of one run directory
        cwd=workdir,
        env=env,
    )
    assert rows.returncode == EXIT_BAD_INPUT and not calls.exists() and tree(workdir) == [], rows.stderr
    refused = {
        int(line.split()[3]): line for line in rows.stderr.splitlines() if line.startswith("dew-train: error: job")
    }
    assert sorted(refused) == [0, 1, 3] and rows.stderr.strip().endswith("3 of 4 jobs would fail"), rows.stderr
    assert (
        "trainer.mesh.tensor=2 trainer.multi_host=null" in refused[0]
        and "trainer.mesh={'data': 2, 'fsdp': 1, 'tensor': 2}: the batch splits over data x fsdp (2 devices), "
        "so processes [0, 1, 2, 3] hold the same rows of it"
        in refused[0]
    ), refused[0]
    for job in (1, 3):
        assert "trainer.multi_host=false: each of the job's 4 processes would train its own copy" in refused[job]

    # The basic launcher runs its jobs here one after another: job 1's mistake stops job 0 too.
    basic = dew(
        "-m",
        *TINY,
        "trainer.checkpoint_dir=ck",
        "trainer.steps=2",
        "optim.learning_rate=0.001,-1",
        cwd=workdir,
        env=env,
    )
    assert basic.returncode == EXIT_BAD_INPUT and tree(workdir) == [], basic.stderr
    assert "job 1 (" in basic.stderr and "optim.learning_rate" in basic.stderr and "Traceback" not in basic.stderr


def test_the_same_sweep_twice_is_refused_while_its_jobs_are_alive(workdir: Path):
    args = [
        "-m",
        *TINY,
        "trainer.checkpoint_dir=ck",
        "trainer.name=twice",
        "trainer.steps=100000",
        "trainer.eval_every=null",
        "optim.learning_rate=0.001,0.002",
    ]
    first = subprocess.Popen(
        [sys.executable, "-m", "dew.cli.train", *args],
        cwd=workdir,
        env=fast_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        held = lambda: any(holder(p / SWEEP_LOCK_DIR) for p in (workdir / "ck").glob("twice-sweep-*"))  # noqa: E731
        until(lambda: held() or first.poll() is not None, 300)
        # Stopped while the second command runs: its flock stays held (the lock asks for a live
        # holder, not a running one), and it trains nothing meanwhile (it trained a core's worth
        # through the second command's start).
        os.kill(first.pid, signal.SIGSTOP)
        again = dew(*args, cwd=workdir, env=fast_env())
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    assert again.returncode == EXIT_BUSY and "Traceback" not in again.stderr, again.stderr
    (sweep,) = (workdir / "ck").glob("twice-sweep-*")
    assert f"the sweep ck/{sweep.name} is being run by process {first.pid} on " in again.stderr
    assert "the same command run again would start them twice" in again.stderr


# Each signal goes 2 logged steps after a resume; its stop lands where JAX's preemption sync point
# agrees, a few steps later on a loaded machine (stops measured at steps 1, 9, 19 and 1, 10, 22 at
# load 10-23) but tens of steps later on a quiet one, where these tiny steps take milliseconds (with
# 40 steps a fresh-clone CI run reached the end before the Ctrl-C's stop landed; with 100, a fresh
# clone on 2026-12-02 stopped at 54 and 87, and its third launch ended before the SIGTERM's stop did).
# 300 steps cost a few seconds more where steps are that fast.
STEPS = 300
LOCAL = [
    "-m",
    "hydra/launcher=local",
    "hydra.launcher.tasks_per_node=2",
    *TINY,
    f"trainer.steps={STEPS}",
    "trainer.eval_every=null",
    "trainer.checkpoint_every=null",
    "trainer.checkpoint_dir=ck",
]  # the suite's compilation cache (TINY's): later launches load what the first compiled


def in_its_own_group(
    args: list[str], workdir: Path, log: Path, cold: bool = False, **env: str
) -> subprocess.Popen | warm.Started:
    """``dew-train args`` with 1 CPU device a task, in its own process group (as a terminal's
    foreground job), its output appended to ``log``; ``env``: more variables of its environment.
    Forked from the suite's warm interpreter (tests/warm.py, in a session of its own) where a cold
    start reads nothing else; ``cold``: started as a new interpreter whatever the environment (a
    signal timed from the start meets the imports a user's command spends its first second in)."""
    env = fast_env(JAX_NUM_CPU_DEVICES="1", **env)
    if not cold and (started := warm.start("dew.cli.train", args, workdir, env, log, session=True)) is not None:
        return started
    return subprocess.Popen(
        [sys.executable, "-m", "dew.cli.train", *args],
        cwd=workdir,
        env=env,
        stdout=open(log, "a"),
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def launch(workdir: Path, name: str, log: str, *extra: str) -> subprocess.Popen | warm.Started:
    """``dew-train -m`` under the local launcher, 2 tasks of 1 CPU device, in its own process group."""
    return in_its_own_group([*LOCAL, f"trainer.name={name}", *extra], workdir, workdir / log)


def finish(proc: subprocess.Popen | warm.Started, timeout: float = 600) -> int:
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def tasks(proc: subprocess.Popen | warm.Started) -> list[int]:
    """The job's task processes, by rank."""
    found = {}
    for pid in descendants(proc.pid):
        if b"submitit.core._submit" in Path(f"/proc/{pid}/cmdline").read_bytes():
            env = dict(v.split(b"=", 1) for v in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in v)
            found[int(env[b"SUBMITIT_LOCAL_GLOBALID"])] = pid
    return [found[rank] for rank in sorted(found)]


def test_a_job_whose_parameters_span_its_tasks_ends_and_hands_back_only_its_run_directory(workdir: Path):
    """Every parameter split over the job's two tasks (FSDP over two processes): the job ends with
    status 0, and each task hands the launching process its run directory (submitit pickles Hydra's
    ``JobReturn``, which holds what the task function returned, into ``.submitit/``), not the
    trained state: a ``jax.Array`` over another process's devices cannot be pickled (the job failed
    at its end), and a replicated one was written there once a task."""
    split = ["trainer.steps=2", "trainer.mesh.data=1", "trainer.mesh.fsdp=2", "trainer.layout.min_shard_size=0"]
    code, out = finish(launch(workdir, "split", "split.out", *split)), (workdir / "split.out").read_text()
    assert code == 0 and "Traceback" not in out, out[-3000:]
    run = next((workdir / "ck").glob("split-sweep-*/0*"))
    results = sorted((workdir / "ck").glob("split-sweep-*/.submitit/*/*_result.pkl"))
    returned = [pickle.loads(p.read_bytes()) for p in results]  # ("success", Hydra's JobReturn)
    assert [(status, job.return_value) for status, job in returned] == [("success", str(run))] * 2, returned


def test_a_job_its_own_processes_refuse_ends_with_their_line_not_a_traceback(workdir: Path):
    """What only a job's processes can check, once they see their devices (here the launcher cannot
    know them: no JAX_NUM_CPU_DEVICES): both tasks refuse the run with dew's one line, and the
    command ends with it, naming the job and the task log, status 1, instead of submitit's
    ``UncompletedJobError`` traceback; no run directory is left."""
    env = {k: v for k, v in fast_env().items() if k != "JAX_NUM_CPU_DEVICES"}
    odd = dew(*LOCAL, "trainer.name=odd", "trainer.batch_size=33", cwd=workdir, env=env)
    lines = odd.stderr.strip().splitlines()
    assert odd.returncode == 1 and "Traceback" not in odd.stderr, odd.stderr[-3000:]
    assert lines[-2].startswith("dew-train: error: job 0 (") and lines[-1] == (
        "dew-train: 1 of 1 jobs ended with the error above"
    ), lines
    assert "trainer.batch_size: a batch of 33 (per micro-batch) does not divide over the 2 devices" in lines[-2]
    assert lines[-2].endswith("_0_log.out)")
    for log in (workdir / "ck").glob("odd-sweep-*/.submitit/*/*_log.out"):  # rank 1 refused too
        assert "dew-train: error: trainer.batch_size" in log.read_text(), log.read_text()[-2000:]
    assert not list((workdir / "ck").glob("odd-sweep-*/0*")) and not list((workdir / "ck").rglob("*_result.pkl"))


def test_a_killed_launcher_takes_its_local_tasks_with_it(workdir: Path):
    proc, ranks = launch(workdir, "orphan", "orphan.out", "trainer.steps=100000"), []
    journal = lambda: next((workdir / "tracking").glob("orphan-sweep-*/*/journal.jsonl"), None)  # noqa: E731
    try:
        until(lambda: (journal() is not None and logged(journal(), 2)) or proc.poll() is not None)
        ranks = tasks(proc)
        os.kill(proc.pid, signal.SIGKILL)  # the launching process alone
        proc.wait()
        killed = time.monotonic()
        until(lambda: not any(Path(f"/proc/{pid}").exists() and _state(pid) != b"Z" for pid in ranks), 300)
        print(f"tasks gone {time.monotonic() - killed:.1f} s after the launcher")
    finally:
        for pid in [proc.pid, *ranks]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    (run,) = (p.parent for p in (workdir / "ck").rglob("run.json"))
    assert holder(run) is None  # nothing holds the run's lock
    stop = [s for kind, s in events(read_journal(journal())) if kind == "stop"]
    assert len(stop) == 1 and (run / str(stop[0])).is_dir()  # the tasks saved before they ended


def _state(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return b"Z"
