"""Several processes, one run: two processes of 4 simulated CPU devices against one of 8, a run
moved from one process to two (each process loading its programs from the compilation cache), a
killed rank, and a signal as the loop ends. Processes are found and killed by PID. (A sweep's job
of 2 tasks preempted and requeued by submitit: tests/cli/test_interrupts.py.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dew.contract.journal import read_journal
from dew.launching.pool import free_ports
from tests import warm
from tests.cli.slow_first_start import slow_first_start
from tests.conftest import SUITE_CACHE
from tests.runs.ledger_checks import check_journal_ledger
from tests.training.conftest import TINY, fast_env, losses

pytestmark = pytest.mark.slow

STEPS = 24
RUN = [
    *TINY,
    f"trainer.steps={STEPS}",
    "trainer.eval_every=null",
    "trainer.checkpoint_every=null",
    "trainer.checkpoint_dir=ck",
]


def start(args: list[str], cwd: Path, env: dict[str, str], log: str) -> subprocess.Popen | warm.Started:
    """``dew-train args`` in ``cwd``, its output appended to ``log`` there, used as a ``Popen``:
    forked from the suite's warm interpreter (tests/warm.py: the ranks' JAX_NUM_CPU_DEVICES and
    coordinator set as a cold start reads them), cold where it cannot be (a ``PYTHONPATH`` hook)."""
    if (started := warm.start("dew.cli.train", args, cwd, env, cwd / log)) is not None:
        return started
    out = open(cwd / log, "a")
    return subprocess.Popen(
        [sys.executable, "-m", "dew.cli.train", *args],
        cwd=cwd,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
    )


def pool(
    args: list[str], cwd: Path, tasks: int, devices: int, log: str = "rank", **extra: str
) -> list[subprocess.Popen | warm.Started]:
    """``tasks`` dew-train processes in one pool, told their places as submitit's local executor
    tells its tasks, each writing to ``<log><rank>.out``."""
    (port,) = free_ports(1).values()
    return [
        start(
            args,
            cwd,
            fast_env(
                SUBMITIT_EXECUTOR="local",
                SUBMITIT_LOCAL_JOB_ID=str(port),
                SUBMITIT_LOCAL_NTASKS=str(tasks),
                SUBMITIT_LOCAL_GLOBALID=str(i),
                SUBMITIT_LOCAL_LOCALID=str(i),
                SUBMITIT_LOCAL_NODEID="0",
                SUBMITIT_LOCAL_JOB_NUM_NODES="1",
                JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                JAX_NUM_CPU_DEVICES=str(devices),
                **extra,
            ),
            f"{log}{i}.out",
        )
        for i in range(tasks)
    ]


def wait(procs: list[subprocess.Popen | warm.Started], timeout: float = 600) -> list[int]:
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            assert time.monotonic() < deadline, f"processes still running after {timeout}s"
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
    return [p.returncode for p in procs]


def logged(path: Path, step: int) -> bool:
    return path.exists() and f'"step": {step},' in path.read_text()


def until(condition, timeout: float = 600, every_s: float = 0.02) -> None:
    """Wait for ``condition``, asked every ``every_s``: conditions glob and read logs, and a test
    asking hundreds of times a second takes CPU from the processes it waits for."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every_s)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def host_params(run: Path, step: int) -> dict[str, np.ndarray]:
    """The parameters saved at ``step``, read as NumPy arrays whatever devices wrote them (this
    process has one; ``load_params`` restores onto the devices the checkpoint names)."""
    import jax
    import orbax.checkpoint as ocp
    from etils import epath

    path = epath.Path(run / str(step) / "state")
    tree = ocp.PyTreeCheckpointHandler().metadata(path).tree
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    restored = ocp.PyTreeCheckpointer().restore(path, args=ocp.args.PyTreeRestore(restore_args=args))
    flat = jax.tree_util.tree_flatten_with_path(restored["params"])[0]
    return {jax.tree_util.keystr(p): np.asarray(leaf) for p, leaf in flat}


def events(journal: list[dict]) -> list[tuple[str, int]]:
    """The journal's stops, resumes and ends, with their steps."""
    return [(r["event"], r["step"]) for r in journal if r.get("event") in ("start", "stop", "resume", "end")]


def test_one_run_across_processes_preempted_and_resumed_on_two(workdir: Path):
    # Every start below shares the suite's compilation cache: the model's initialisation, the
    # evaluation and the sampling compile once, the pool's step once for the sweep's job 0 and the
    # requeued tasks (and not at all where another test of the suite compiled them first). With every
    # program loaded a step takes milliseconds: a plugin's hook makes each step of a start from step
    # 0 take 0.1 s, so that the signal below, sent at step 3, reaches the run before its last step.
    # The resumed 2-process start steps at its own pace: nothing signals it, and a pool's steps cost
    # CPU on both processes while they sleep (tests/cli/slow_first_start.py).
    pythonpath, hook = slow_first_start(workdir / "site", 0.1)
    run_args = [*RUN, f"trainer.compilation_cache_dir={SUITE_CACHE}", hook]
    # (1) One process of 8 devices, stopped by SIGUSR2: a checkpoint at the step, status 128 + 12.
    ref_journal = workdir / "tracking" / "ref" / "journal.jsonl"
    alone = start(
        [*run_args, "trainer.name=ref"], workdir, fast_env(JAX_NUM_CPU_DEVICES="8", PYTHONPATH=pythonpath), "ref.out"
    )
    until(lambda: logged(ref_journal, 3) or alone.poll() is not None)
    os.kill(alone.pid, signal.SIGUSR2)
    assert wait([alone]) == [128 + signal.SIGUSR2], (workdir / "ref.out").read_text()
    stop = [r for r in read_journal(ref_journal) if r.get("event") == "stop"]
    assert (
        len(stop) == 1 and stop[0]["reason"] == "preempted" and (workdir / "ck" / "ref" / str(stop[0]["step"])).is_dir()
    )

    # (2) The same run resumed by two processes of 4 devices: the process count may change. The
    # samples at its end are drawn by process 0 from the model both processes gathered.
    resumed = [*run_args, "trainer.name=ref", "trainer.final_samples=true"]
    assert wait(pool(resumed, workdir, tasks=2, devices=4, PYTHONPATH=pythonpath)) == [0, 0], (
        workdir / "rank0.out"
    ).read_text() + (workdir / "rank1.out").read_text()
    ref = read_journal(ref_journal)
    check_journal_ledger(ref_journal, "ref")  # the goodput ledger of a run resumed by 2 processes adds up
    assert events(ref)[-3:] == [("stop", stop[0]["step"]), ("resume", stop[0]["step"]), ("end", STEPS)]
    run = workdir / "ck" / "ref"
    assert sorted(p.name for p in run.iterdir()) == sorted(
        [str(stop[0]["step"]), str(STEPS), ".hydra", ".lock", "run.json", "samples.png", "train.log"]
    )  # process 0 wrote alone

    # (3) The same run trained by two processes of 4 devices from the start, never stopped: the same
    # losses and parameters as 1 x 8 stopped then 2 x 4, up to the order of the gradient sums. (A
    # sweep's job of 2 tasks stopped and requeued by submitit: tests/cli/test_interrupts.py, whose
    # rank 1 alone takes a SIGUSR2, and tests/training/test_stall.py.)
    twin_logs = [workdir / "twin0.out", workdir / "twin1.out"]
    twin_pool = pool([*run_args[:-1], "trainer.name=twin"], workdir, tasks=2, devices=4, log="twin")
    assert wait(twin_pool) == [0, 0], twin_logs[0].read_text() + twin_logs[1].read_text()
    # Every process of the pool loaded every program from the cache, process 1 too: (2) wrote them on
    # the same 2 x 4 devices (on the CPU, JAX alone writes process 0's entries, and process 1's key
    # differs from process 0's: dew.compat.cache_from_every_cpu_process).
    twin = read_journal(workdir / "tracking" / "twin" / "journal.jsonl")
    check_journal_ledger(workdir / "tracking" / "twin" / "journal.jsonl", "twin")
    for rank in (0, 1):
        counts = re.findall(r"compilation cache \S+: (\d+) hits, (\d+) misses", twin_logs[rank].read_text())
        assert counts and all(int(hits) > 0 and misses == "0" for hits, misses in counts), (rank, counts)
    assert events(twin) == [("start", 0), ("end", STEPS)]
    assert not (workdir / "ck" / "twin" / "samples.png").exists()  # trainer.final_samples=false (TINY's)
    a, b = losses(ref), losses(twin)
    assert a.keys() == b.keys() and all(abs(a[s] - b[s]) <= 1e-5 * abs(a[s]) for s in a), (a, b)
    pa, pb = host_params(run, STEPS), host_params(workdir / "ck" / "twin", STEPS)
    assert pa.keys() == pb.keys() and all(np.allclose(pa[k], pb[k], rtol=1e-5, atol=1e-6) for k in pa)
    print("bit for bit:", all(np.array_equal(pa[k], pb[k]) for k in pa))


def test_a_killed_rank_stops_the_other(workdir: Path):
    procs = pool(
        [*RUN, "trainer.name=kill", "trainer.steps=100000", "trainer.checkpoint_every=2"],
        workdir,
        tasks=2,
        devices=1,
        DEW_HEARTBEAT_TIMEOUT_S="5",
    )
    until(lambda: (workdir / "ck" / "kill" / "2").is_dir() or procs[0].poll() is not None)  # one whole save
    os.kill(procs[1].pid, signal.SIGKILL)
    killed = time.monotonic()
    (code,) = wait(procs[:1], timeout=120)
    print(f"survivor exited {code} after {time.monotonic() - killed:.1f} s")
    log = (workdir / "rank0.out").read_text()
    assert code != 0 and "stopped sending heartbeats" in log, log[-3000:]
    assert log.split("stopped sending heartbeats")[1].split(":", 1)[1].split()[0] == "1"  # names the dead task
    steps = sorted(int(p.name) for p in (workdir / "ck" / "kill").iterdir() if p.name.isdigit())
    assert steps and host_params(workdir / "ck" / "kill", steps[-1])  # the last complete checkpoint is whole


LATE_SIGNAL = """
import os, signal, sys, time
import jax
from dew.training.preemption import StopSignals

rank, port, settle = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "settle"
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=rank)
stop = StopSignals().install()
for step in (1, 2):  # the boundaries before the last step: nothing to stop
    assert not stop.stop_at(step)
if rank == 0:  # a Ctrl-C during the last step: passed on to JAX's notifier, agreed at no boundary
    os.kill(os.getpid(), signal.SIGINT)
if settle:
    stop.settle(3)
if rank == 1:  # a Ctrl-C once the loop ended: passed on to nobody
    os.kill(os.getpid(), signal.SIGINT)
else:  # what follows the loop (process 0 draws the samples alone) outlasts its notifier's look
    time.sleep(2)
stop.restore()
print("left the loop", flush=True)
"""


def test_a_signal_as_the_loop_ends_does_not_hold_the_pool_at_exit(workdir: Path):
    """A signal that reaches one process of a pool during its last step is passed on to JAX's
    preemption notifier, which no later boundary agrees on: without ``StopSignals.settle`` the
    other process left the pool first, and this one waited 3 minutes at JAX's preemption barrier
    before it could exit (a Ctrl-C on a 2-task sweep as its run ended: tests/cli/test_interrupts.py)."""
    (port,) = free_ports(1).values()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", LATE_SIGNAL, str(rank), str(port), "settle"],
            cwd=workdir,
            env=fast_env(JAX_NUM_CPU_DEVICES="1"),
            stdout=open(workdir / f"late{rank}.out", "w"),
            stderr=subprocess.STDOUT,
        )
        for rank in (0, 1)
    ]
    began = time.monotonic()
    assert wait(procs, timeout=120) == [0, 0]
    took = time.monotonic() - began
    out = [(workdir / f"late{rank}.out").read_text() for rank in (0, 1)]
    assert all("left the loop" in text for text in out), out
    assert "SIGTERM caught" in out[0] and "SIGTERM caught" not in out[1], out  # passed on by rank 0 alone
    assert took < 60, f"the pool took {took:.0f} s to end: {out}"  # JAX's barrier times out after 180 s
