"""One writer per run directory: a second dew-train on a busy run directory is refused at once,
naming the holder's host and PID; a holder killed with SIGKILL leaves no lock behind, and the run
resumes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dew.commandline.exits import EXIT_BUSY
from dew.contract.lock import holder
from dew.launching.stop_exit import EXIT_MAX_TIME
from tests.conftest import SUITE_CACHE, dew
from tests.training.conftest import TINY, dew_train, fast_env

# Long enough to still be running while the second start is refused.
ARGS = [
    *TINY,
    "trainer.name=r",
    "trainer.steps=1000000",
    "trainer.log_every=100",
    "trainer.eval_every=null",
    "trainer.checkpoint_every=2",
    "trainer.checkpoint_dir=ck",
]


def _wait(condition, first: threading.Thread, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert first.is_alive(), "the first run ended"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_second_writer_is_refused_and_a_killed_holder_leaves_no_lock(workdir: Path):
    run = workdir / "ck" / "r"
    # The first from the warm interpreter too (tests/warm.py, through dew_train in a thread): what
    # is tested is the lock it holds, not its start (a cold start's imports, ~1.5 CPU-s, spared). Its
    # pid is the one its lock names.
    ended: list[subprocess.CompletedProcess | None] = []
    first = threading.Thread(target=lambda: ended.append(dew_train(*ARGS, cwd=workdir)), daemon=True)
    first.start()
    pid = None
    try:
        _wait(lambda: (run / "2").is_dir(), first)  # it holds the lock and has a checkpoint
        pid = holder(run)["pid"]
        # Stopped, it keeps its flock (holder() asks for a live process, not a running one) and trains
        # no further while the second starts: it had trained through the second's whole start.
        os.kill(pid, signal.SIGSTOP)
        assert holder(run) == {"host": socket.gethostname(), "pid": pid, "started": holder(run)["started"]}

        started = time.monotonic()
        # From the warm interpreter: the refusal comes after the start, which it does not test. A
        # second that waited for the lock (or for the stopped first) would run into the timeout.
        second = dew(*ARGS, cwd=workdir, env=fast_env(), timeout=300)
        elapsed = time.monotonic() - started
        assert first.is_alive()  # refused while the first still holds it, not after orbax's barrier
        assert second.returncode == EXIT_BUSY, second.stderr
        assert f"is in use by process {pid} on {socket.gethostname()}" in second.stderr
        assert "Traceback" not in second.stderr and "orbax-checkpoint-tmp" not in second.stderr
        print(f"the second dew-train was refused {elapsed:.2f} s after it started (Hydra and the config)")
    finally:
        pid = pid or (holder(run) or {}).get("pid")  # never leave the first behind
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        first.join(300)  # dew_train SIGKILLs a run past its timeout (300 s)
    assert ended and ended[0] is not None and ended[0].returncode == -signal.SIGKILL, ended
    assert holder(run) is None  # the kernel released the lock with the process

    # The resume stops itself at its first step boundary (a resume may change max_time): from the warm
    # server, where SIGKILLing it once its log said so took a cold start (~1.5 CPU-s).
    resumed = dew_train(*ARGS, "trainer.max_time=0.01", cwd=workdir)
    assert resumed.returncode == EXIT_MAX_TIME, resumed.stdout[-3000:]  # it took the lock and resumed
    assert "resuming r from step" in (run / "train.log").read_text()


def test_run_config_train_refuses_a_held_run_directory(tmp_path: Path):
    """A library user's RunConfig.train takes the lock too: a held directory is refused, naming the
    holder, with no record written."""
    from dew.contract.lock import RunLockedError
    from tests.training.conftest import train_tiny

    run = tmp_path / "ck" / "run"
    holding = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from dew.contract.lock import RunLock; "
            f"RunLock({str(run)!r}).acquire(); print('held', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holding.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError, match=f"{run} is in use by process {holding.pid} on"):
            train_tiny(tmp_path, "trainer.steps=2")
        assert sorted(p.name for p in run.iterdir()) == [".lock"]
    finally:
        os.kill(holding.pid, signal.SIGKILL)
        holding.wait()


# ---------------------------------------------------------------------------------------------
# The lease: the lock where flock fails (Lustre without -o flock: ENOSYS; NFS without a lock
# manager: ENOLCK). In this process fcntl.flock is patched to fail; other processes run on the
# simulated filesystem of tests/fs_sim (a sitecustomize that makes their flock fail the same way).


def _no_flock(code: int):
    def flock(fd, operation):
        raise OSError(code, os.strerror(code))

    return flock


@pytest.fixture(params=["ENOSYS", "ENOLCK"])
def no_flock(request, monkeypatch) -> str:
    """This process on a filesystem whose flock fails with the parameter's errno (its name)."""
    import errno
    import fcntl

    monkeypatch.setattr(fcntl, "flock", _no_flock(getattr(errno, request.param)))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("DEW_LEASE_STALE_S", raising=False)
    return request.param


def _lease(run: Path) -> dict:
    import json

    return json.loads((run / ".lock").read_text())


def _write_lease(run: Path, **fields) -> None:
    import json

    run.mkdir(parents=True, exist_ok=True)
    record = {
        "host": "node-17",
        "pid": 4242,
        "started": time.time() - 3600,
        "slurm_job_id": None,
        "lease": "theirs",
        "stale_after": 60.0,
        "heartbeat": time.time(),
        **fields,
    }
    (run / ".lock").write_text(json.dumps(record))


def test_lease_is_taken_held_and_released_where_flock_fails(tmp_path: Path, no_flock, monkeypatch):
    from dew.contract.lock import RunLock

    monkeypatch.setenv("SLURM_JOB_ID", "991")
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text("")  # what a failed flock left behind before the lease
    assert holder(run) is None  # not running (it read as "in use by process ? on ?")
    lock = RunLock(run).acquire()
    lease = _lease(run)
    assert (lease["host"], lease["pid"], lease["slurm_job_id"]) == (socket.gethostname(), os.getpid(), "991")
    assert abs(lease["heartbeat"] - time.time()) < 5 and "released" not in lease
    assert holder(run) == lease  # running
    lock.release()
    assert "released" in _lease(run) and holder(run) is None  # finished
    assert sorted(p.name for p in run.iterdir()) == [".lock"]  # no temporary file left
    RunLock(run).acquire().release()  # a released lease refuses nobody


def test_lease_is_released_when_the_block_raises(tmp_path: Path, no_flock):
    from dew.contract.lock import RunLock

    with pytest.raises(KeyError), RunLock(tmp_path):
        assert holder(tmp_path) is not None
        raise KeyError("the run failed")
    assert holder(tmp_path) is None


def test_a_second_process_is_refused_by_a_live_lease(tmp_path: Path, no_flock):
    from dew.contract.lock import RunLock
    from tests.fs_sim import noflock_env

    code = (
        "import sys; from dew.contract.lock import RunLock, RunLockedError\n"
        "try: RunLock(sys.argv[1]).acquire()\nexcept RunLockedError as err: sys.exit(str(err))"
    )
    with RunLock(tmp_path):
        other = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)],
            capture_output=True,
            text=True,
            env=noflock_env(dict(os.environ), no_flock),
            timeout=60,
        )
    assert other.returncode == 1 and "Traceback" not in other.stderr, other.stderr
    assert f"{tmp_path} is in use by process {os.getpid()} on {socket.gethostname()}" in other.stderr
    # and the other way round: a lease held by another process refuses this one
    holding = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from dew.contract.lock import RunLock; "
            "RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(600)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=noflock_env(dict(os.environ), no_flock),
    )
    try:
        assert holding.stdout.readline().strip() == "held"
        assert holder(tmp_path)["pid"] == holding.pid
        with pytest.raises(RuntimeError, match=f"in use by process {holding.pid} on {socket.gethostname()}"):
            RunLock(tmp_path).acquire()
    finally:
        os.kill(holding.pid, signal.SIGKILL)
        holding.wait()
    # SIGKILLed: its lease stays, but its process is gone from this host, so it is taken at once
    assert holder(tmp_path) is None
    RunLock(tmp_path).acquire().release()


def test_a_stale_lease_is_taken_over_with_a_line(tmp_path: Path, no_flock, caplog):
    from dew.contract.lock import RunLock

    _write_lease(tmp_path, heartbeat=time.time() - 120)
    assert holder(tmp_path) is None  # stale reads as not running
    with caplog.at_level("WARNING", logger="dew"), RunLock(tmp_path):
        assert _lease(tmp_path)["pid"] == os.getpid()
    assert (
        "taking over the run lock of process 4242 on node-17" in caplog.text
        and "heartbeat is 120 s old (a lease is stale after 60 s" in caplog.text
    )
    # a fresh one from another host is not
    _write_lease(tmp_path, heartbeat=time.time() - 30)
    with pytest.raises(RuntimeError, match="in use by process 4242 on node-17"):
        RunLock(tmp_path).acquire()


def test_a_requeued_job_takes_over_its_own_lease_at_once(tmp_path: Path, no_flock, monkeypatch, caplog):
    from dew.contract.lock import RunLock
    from dew.training.run_directory import refuse_if_held

    _write_lease(tmp_path, slurm_job_id="77")  # fresh: renewed a moment ago by the job's earlier run
    monkeypatch.setenv("SLURM_JOB_ID", "78")
    with pytest.raises(RuntimeError, match="in use by process 4242 on node-17 in SLURM job 77"):
        refuse_if_held(tmp_path)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert holder(tmp_path) is not None  # a reader (dew-runs) still sees it held
    refuse_if_held(tmp_path)  # the writer of the same job is not refused
    with caplog.at_level("WARNING", logger="dew"), RunLock(tmp_path):
        assert _lease(tmp_path)["pid"] == os.getpid()
    assert "it was held by an earlier run of this SLURM job (77), now requeued" in caplog.text


def test_the_heartbeat_is_renewed(tmp_path: Path, no_flock, monkeypatch):
    from dew.contract.lock import RunLock

    monkeypatch.setenv("DEW_LEASE_STALE_S", "0.6")  # renewed every 0.1 s
    with RunLock(tmp_path):
        first = _lease(tmp_path)["heartbeat"]
        time.sleep(1.5)  # well past the bound: only renewals keep it live
        assert _lease(tmp_path)["heartbeat"] > first + 1
        assert holder(tmp_path) is not None
    assert holder(tmp_path) is None


def test_a_bad_bound_is_named_and_the_default_used(monkeypatch, caplog):
    from dew.contract.lock import STALE_S, stale_after

    monkeypatch.setenv("DEW_LEASE_STALE_S", "-5")
    with caplog.at_level("WARNING", logger="dew"):
        assert stale_after() == STALE_S == 60
    assert "DEW_LEASE_STALE_S='-5' is not a positive number of seconds: using 60" in caplog.text
    monkeypatch.setenv("DEW_LEASE_STALE_S", "90")
    assert stale_after() == 90


def test_flock_respects_a_live_lease(tmp_path: Path, monkeypatch):
    """A node that can flock the directory is refused while a node that cannot holds its lease."""
    from dew.contract.lock import RunLock

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    _write_lease(tmp_path)
    with pytest.raises(RuntimeError, match="in use by process 4242 on node-17"):
        RunLock(tmp_path).acquire()
    _write_lease(tmp_path, released=time.time())
    RunLock(tmp_path).acquire().release()


@pytest.mark.slow
def test_dew_train_on_a_filesystem_whose_flock_fails(workdir: Path):
    """dew-train on a simulated Lustre without -o flock: the run takes a lease; SIGKILLed, it leaves
    the lease behind, which neither refuses the same command's resume nor reads as running."""
    from tests.conftest import dew
    from tests.fs_sim import noflock_env

    env = noflock_env(fast_env())
    args = [
        *TINY,
        "trainer.name=r",
        "trainer.steps=20",
        "trainer.eval_every=null",
        "trainer.checkpoint_every=10",
        "trainer.checkpoint_dir=ck",
        f"trainer.compilation_cache_dir={SUITE_CACHE}",
    ]  # the resume loads
    run = workdir / "ck" / "r"
    assert dew_train(*args, cwd=workdir, env=env, kill_when=lambda w: (run / "10").is_dir()) is None
    killed = _lease(run)
    assert "released" not in killed and killed["host"] == socket.gethostname()  # a lease, not a flock record
    listed = dew("ck", cwd=workdir, env=env, script="dew.cli.runs", timeout=120)
    assert listed.returncode == 0 and " running " not in listed.stdout, listed.stdout + listed.stderr

    resumed = dew_train(*args, cwd=workdir, env=env)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "resuming r from step 10" in resumed.stdout and "Traceback" not in resumed.stdout
    assert f"taking over the run lock of process {killed['pid']} on {killed['host']}" in resumed.stdout
    assert "released" in _lease(run)
    listed = dew("ck", cwd=workdir, env=env, script="dew.cli.runs", timeout=120)
    row = listed.stdout.splitlines()[1].split()
    assert row[:3] == ["r", "finished", "20/20"], listed.stdout


@pytest.mark.parametrize("no_flock", ["ENOSYS"], indirect=True)
def test_one_of_several_racing_processes_takes_a_stale_lease(tmp_path: Path, no_flock):
    """Four processes released at the same instant at one stale lease: exactly one takes it, the
    others are refused naming the winner."""
    from tests.fs_sim import noflock_env

    run, go = tmp_path / "run", tmp_path / "go"
    _write_lease(run, heartbeat=time.time() - 120)
    code = (
        "import os, sys, time; from dew.contract.lock import RunLock, RunLockedError\n"
        "while not os.path.exists(sys.argv[2]): time.sleep(0.001)\n"
        "try: RunLock(sys.argv[1]).acquire()\n"
        "except RunLockedError as err: print('refused', err, flush=True); sys.exit(0)\n"
        "print('took', flush=True); sys.stdin.read()"
    )  # held until every process has answered
    env = noflock_env(dict(os.environ), no_flock)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(run), str(go)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(4)
    ]
    try:
        time.sleep(0.3)  # most started and waiting (one that starts late finds the winner's lease)
        go.touch()
        outs = [p.stdout.readline() for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    winners = [p.pid for p, out in zip(procs, outs, strict=True) if out.startswith("took")]
    assert len(winners) == 1, outs
    assert all(f"in use by process {winners[0]} on" in out for out in outs if out.startswith("refused")), outs


def _write_takeover(run: Path, age: float) -> None:
    import json

    (run / ".lock.takeover").write_text(json.dumps({"host": "node-18", "pid": 5151, "heartbeat": time.time() - age}))


@pytest.mark.parametrize("no_flock", ["ENOSYS"], indirect=True)
def test_a_taker_waits_while_another_judges_the_stale_lease(tmp_path: Path, no_flock):
    """CI once saw two takers interleave: one moved aside the lease another had just linked in the
    stale one's place. Takers now judge and remove one at a time: while another's takeover file is
    there, this process waits, then reads what that taker left (here its live lease) and is refused."""
    import threading

    from dew.contract.lock import RunLock

    _write_lease(tmp_path, heartbeat=time.time() - 120)
    _write_takeover(tmp_path, age=0)

    def other_taker_finishes():
        time.sleep(0.3)
        _write_lease(tmp_path, host="node-18", pid=5151, lease="the other taker's")
        (tmp_path / ".lock.takeover").unlink()

    finishing = threading.Thread(target=other_taker_finishes)
    finishing.start()
    try:
        with pytest.raises(RuntimeError, match="in use by process 5151 on node-18"):
            RunLock(tmp_path).acquire()
    finally:
        finishing.join()
    assert _lease(tmp_path)["lease"] == "the other taker's"


@pytest.mark.parametrize("no_flock", ["ENOSYS"], indirect=True)
def test_a_takeover_file_a_dead_taker_left_is_removed_with_a_line(tmp_path: Path, no_flock, caplog):
    from dew.contract.lock import TAKEOVER_STALE_S, RunLock

    _write_lease(tmp_path, heartbeat=time.time() - 120)
    _write_takeover(tmp_path, age=TAKEOVER_STALE_S + 5)
    with caplog.at_level("WARNING", logger="dew"), RunLock(tmp_path):
        assert _lease(tmp_path)["pid"] == os.getpid()
    assert "removing the takeover file a process left 15 s ago" in caplog.text
    assert "taking over the run lock of process 4242 on node-17" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]


def test_a_requeued_job_takes_over_a_flock_its_earlier_run_left(tmp_path: Path, monkeypatch, caplog):
    """NFS can keep a dead node's flock: a requeued job (same SLURM job id) sets that file aside and
    locks a new one; another job is still refused. (The earlier run here is alive, holding its flock
    as a dead node's lock manager would.)"""
    from dew.contract.lock import RunLock, RunLockedError
    from dew.training.run_directory import refuse_if_held

    run = tmp_path / "run"
    holding = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from dew.contract.lock import RunLock; "
            "RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(600)",
            str(run),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "SLURM_JOB_ID": "55"},
    )
    try:
        assert holding.stdout.readline().strip() == "held"
        monkeypatch.setenv("SLURM_JOB_ID", "56")
        with pytest.raises(RunLockedError, match=f"in use by process {holding.pid} on .* in SLURM job 55"):
            refuse_if_held(run)
        with pytest.raises(RunLockedError, match=f"in use by process {holding.pid} on .* in SLURM job 55"):
            RunLock(run).acquire()
        monkeypatch.setenv("SLURM_JOB_ID", "55")
        refuse_if_held(run)
        assert holder(run)["pid"] == holding.pid  # a reader still sees the earlier run
        with caplog.at_level("WARNING", logger="dew"), RunLock(run):
            assert holder(run)["pid"] == os.getpid()
            assert (
                f"taking over the run lock of process {holding.pid} on {socket.gethostname()} in SLURM job 55"
                in caplog.text
                and "an earlier run of this SLURM job, now requeued, whose flock outlived it" in caplog.text
            )
            monkeypatch.setenv("SLURM_JOB_ID", "56")
            with pytest.raises(RunLockedError, match=f"in use by process {os.getpid()} on"):
                RunLock(run).acquire()
        assert holder(run) is None and sorted(p.name for p in run.iterdir()) == [".lock"]
    finally:
        os.kill(holding.pid, signal.SIGKILL)
        holding.wait()
