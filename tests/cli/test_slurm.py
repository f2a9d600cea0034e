"""dew on SLURM as clusters run it, through the stand-in (tests/slurm_standin): ``dew-train -m
hydra/launcher=slurm`` submits a job array to the stand-in's ``sbatch``, whose jobs run the script
submitit wrote, whose ``srun`` starts 2 nodes x 2 tasks on this machine.

One sweep serves every check: two jobs of the same config (``trainer.seed=0,0``), submitted with
``--export=NONE`` (the job sees no variable of the launching shell: what it needs comes from
``setup``) on a site whose ``JobRequeue=0`` refuses a requeue the job did not ask for. Job 1 is
preempted (SIGUSR2 to each of its tasks) and requeued; job 0 runs through, the twin the requeued job
must end on bit for bit. (That several processes train the run one process of as many devices trains
is tests/training/test_multiprocess.py's check, 2 x 4 against 1 x 8.) Where the run lock's filesystem
simulation exists (tests/fs_sim), the jobs run on a filesystem whose ``flock`` fails: the preempted
job is requeued and resumes under the lock's lease.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dew.contract.journal import read_journal
from tests import warm
from tests.cli.slow_first_start import slow_first_start
from tests.conftest import REPO, dew, tree
from tests.runs.ledger_checks import check_slurm_queue
from tests.slurm_standin import slurm_cluster, task_view  # noqa: F401 - the fixture
from tests.training.conftest import TINY, fast_env, losses
from tests.training.test_multiprocess import events, host_params, logged, until, wait

STEPS = 16
RUN = [
    *TINY,
    f"trainer.steps={STEPS}",
    "trainer.eval_every=null",
    "trainer.checkpoint_every=null",
    "trainer.checkpoint_dir=ck",
]
SLURM = [
    "hydra/launcher=slurm",
    "hydra.launcher.nodes=2",
    "hydra.launcher.tasks_per_node=2",
    "hydra.launcher.gpus_per_node=0",
    "hydra.launcher.cpus_per_task=2",
    "hydra.launcher.timeout_min=60",
    "+hydra.launcher.additional_parameters.export=NONE",
]


def setup_lines(env: dict[str, str], *more: str) -> str:
    """``hydra.launcher.setup``: the exports a job under ``--export=NONE`` needs (this checkout on
    the path, CPU devices, the tests' compiler flags), as a user writes them for a real cluster,
    then the shell lines ``more``."""
    wanted = {
        k: env[k]
        for k in ("PYTHONPATH", "XLA_FLAGS", "JAX_PLATFORMS", "WANDB_MODE", "HOME", "DEW_SIM_FLOCK_ERRNO")
        if k in env
    }
    wanted |= {"JAX_NUM_CPU_DEVICES": "1", "DEW_HEARTBEAT_TIMEOUT_S": "30"}
    lines = [f"export {k}={shlex.quote(v)}" for k, v in wanted.items()]
    return "hydra.launcher.setup=[{}]".format(",".join(f'"{line}"' for line in [*lines, *more]))


def no_flock(env: dict[str, str]) -> dict[str, str] | None:
    """``env`` on a filesystem whose ``flock`` fails (ENOSYS, as Lustre without ``-o flock``), where
    the simulation (tests/fs_sim, the run lock's tests) exists; None where it does not."""
    if importlib.util.find_spec("tests.fs_sim") is None:
        return None
    from tests.fs_sim import noflock_env

    return noflock_env(env)


@pytest.mark.slow
def test_two_nodes_of_two_tasks_train_preempt_requeue_and_resume(workdir: Path, slurm_cluster):
    # The suite's compilation cache (TINY's) for every start: job 1's batch script waits (a line of
    # its setup) until job 0 has compiled and run its first step, so that job 1, at its first start
    # as after its requeue, loads what job 0 compiled (started together, each job's 4 tasks compiled
    # every program). With every program loaded a step takes milliseconds: a plugin's hook makes
    # each step of a first start 0.3 s long, so that the preemption, sent at step 3, reaches job 1
    # before its last step; the requeued start's steps run at their own pace.
    pythonpath, hook = slow_first_start(workdir / "site", 0.3)
    env = fast_env(SLURM_STANDIN_JOB_REQUEUE="0", SLURM_STANDIN_KILL_WAIT="20", PYTHONPATH=pythonpath)
    env = slurm_cluster.env(no_flock(env) or env)
    compiled = workdir / "job0-compiled"
    gate = f"[ $SLURM_ARRAY_TASK_ID != 1 ] || until [ -e {shlex.quote(str(compiled))} ]; do sleep 0.2; done"
    sweep = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dew.cli.train",
            "-m",
            *SLURM,
            setup_lines(env, gate),
            *RUN,
            hook,
            "trainer.name=sl",
            "trainer.seed=0,0",
        ],
        cwd=workdir,
        env=env,
        stdout=open(workdir / "sweep.out", "w"),
        stderr=subprocess.STDOUT,
    )
    try:

        def journal(n: int) -> Path | None:
            return next(iter(sorted((workdir / "tracking").glob(f"sl-sweep-*/{n}-*/journal.jsonl"))), None)

        # (Every 0.1 s: a step takes 0.3 s, and the preemption has 13 steps to reach job 1 in.)
        until(lambda: (journal(0) is not None and logged(journal(0), 1)) or sweep.poll() is not None, 400, 0.1)
        compiled.touch()
        until(lambda: (journal(1) is not None and logged(journal(1), 3)) or sweep.poll() is not None, 400, 0.1)
        (job1,) = [j["key"] for j in slurm_cluster.jobs() if j["key"].endswith("_1")]
        sent = slurm_cluster.preempt(job1)
        until(lambda: len(slurm_cluster.job(job1)["starts"]) == 2 or sweep.poll() is not None, 300, 0.1)
        restarted = slurm_cluster.job(job1)["starts"][-1] - sent
        until(
            lambda: ("resume" in [e for e, _ in events(read_journal(journal(1)))]) or sweep.poll() is not None,
            300,
            0.1,
        )
        resumed = time.time() - sent
        assert wait([sweep], timeout=600) == [0], (workdir / "sweep.out").read_text()
    finally:
        wait([sweep], timeout=1)
    print(
        f"SIGUSR2 to the requeued job's script starting again: {restarted:.1f} s; to its resume event: {resumed:.1f} s"
    )

    # The sweep's directory and job names are the launching process's, though no variable of its
    # environment reached the jobs (--export=NONE).
    (sweep_dir,) = (workdir / "ck").glob("sl-sweep-*")
    runs = sorted(p.parent for p in sweep_dir.rglob("run.json"))
    assert [r.name for r in runs] == ["0-seed=0", "1-seed=0"], runs

    # (No run of one process of 4 devices beside the sweep to compare job 0 with: that N processes
    # train the run one process of as many devices trains is checked by
    # tests/training/test_multiprocess.py::test_one_run_across_processes_preempted_and_resumed_on_two,
    # 2 x 4 against 1 x 8; here the pool is SLURM's, formed from srun's variables: the lines below.
    # That reference was 14 of this test's 135 CPU-s.)
    uninterrupted, requeued = (read_journal(j) for j in (journal(0), journal(1)))
    assert losses(uninterrupted).keys() == set(range(1, STEPS + 1)), losses(uninterrupted)
    # Every task joined one pool of 4, with the 2 CPUs the job asked for (srun was told: SRUN_CPUS_PER_TASK).
    logs = "".join(p.read_text() for p in sweep_dir.glob(".submitit/*_0/*_log.out"))
    for rank in range(4):
        assert f"joined the JAX process pool: process {rank} of 4 (local devices JAX's choice, 2 CPUs)" in logs

    # The preempted job saved, was requeued (the site refuses requeues without --requeue, which the
    # profile asks for), resumed and ended bit for bit where the uninterrupted one did.
    stopped = [s for kind, s in events(requeued) if kind == "stop"]
    assert len(stopped) == 1 and events(requeued)[-2:] == [("resume", stopped[0]), ("end", STEPS)], events(requeued)
    until(lambda: slurm_cluster.job(job1)["state"] != "RUNNING", timeout=60)  # its processes may still be exiting
    assert slurm_cluster.job(job1)["restarts"] == 1 and slurm_cluster.job(job1)["state"] == "COMPLETED"
    check_slurm_queue(
        read_journal(journal(1), raw=True), slurm_cluster.job(job1)
    )  # queued/allocated recorded, the ledger adds up
    assert losses(requeued) == losses(uninterrupted)
    pa, pb = host_params(runs[0], STEPS), host_params(runs[1], STEPS)
    assert pa.keys() == pb.keys() and all(np.array_equal(pa[k], pb[k]) for k in pa)
    if "DEW_SIM_FLOCK_ERRNO" in env:  # where flock fails, the run lock was a lease of the SLURM job
        lease = json.loads((runs[1] / ".lock").read_text())
        assert lease["slurm_job_id"] == str(slurm_cluster.job(job1)["job_id"]), lease


@pytest.mark.slow
def test_outside_an_srun_step_a_process_trains_alone_or_says_how_to_launch(workdir: Path):
    """A batch script that runs dew-train itself, or an salloc shell: SLURM_NTASKS > 1, no step."""
    batch = fast_env(
        SLURM_JOB_ID="41",
        SLURM_NTASKS="4",
        SLURM_JOB_NUM_NODES="2",
        SLURM_PROCID="0",
        SLURM_LOCALID="0",
        SLURM_NODEID="0",
        SLURM_JOB_NODELIST="127.0.0.[1-2]",
    )
    refused = dew(*RUN, "trainer.steps=1", "trainer.name=refused", "trainer.multi_host=true", cwd=workdir, env=batch)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        "dew-train: error: trainer.multi_host=true: this process runs in SLURM job 41 of 4 tasks but outside an "
        "srun step; JAX finds the other processes only inside `srun`: run `srun dew-train ...` in the "
        "allocation, or submit with `dew-train -m hydra/launcher=slurm ...`"
    )
    assert not (workdir / "ck" / "refused").exists()
    alone = dew(*RUN, "trainer.steps=1", "trainer.name=alone", cwd=workdir, env=batch)
    assert alone.returncode == 0, alone.stderr
    said = (workdir / "ck" / "alone" / "train.log").read_text() + alone.stderr
    assert "outside an srun step: training alone in this process" in said


@pytest.mark.slow
@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"slurm_gres": "gpu:4", "tasks_per_node": 2}, [[0, 1], [2, 3], [0, 1], [2, 3]]),  # --gres, 2 GPUs a task
        ({"gpus_per_node": 2, "tasks_per_node": 1}, [[0, 1], [0, 1]]),  # one task per node: all its GPUs
        ({"gpus_per_node": 2, "tasks_per_node": 2}, [[0], [1], [0], [1]]),  # one task per GPU
        ({"slurm_gpus_per_task": 1, "tasks_per_node": 2}, [[0], [0], [0], [0]]),  # each sees its own, as 0
    ],
)
def test_each_task_gets_its_own_gpus_through_the_stand_in(
    slurm_cluster,
    monkeypatch,
    tmp_path,
    options,
    expected,
):
    """The variables the stand-in's srun sets for each GPU option, read by dew's mapping in each task."""
    import submitit

    for key, value in slurm_cluster.env(fast_env()).items():
        monkeypatch.setenv(key, value)
    executor = submitit.AutoExecutor(folder=tmp_path / "log" / "%j", cluster="slurm")
    executor.update_parameters(nodes=2, timeout_min=5, **options)
    views = executor.submit(task_view).results()
    assert views == [(rank, len(expected), devices) for rank, devices in enumerate(expected)]


def test_the_profile_real_sites_need():
    from dew.launching.slurm_launcher import slurm_parameters
    from tests.cli.test_launch import launcher

    composed = launcher("hydra/launcher=slurm", "hydra.launcher.gpus_per_node=null", "hydra.launcher.gres=gpu:8")
    assert (composed.gpus_per_node, composed.gres, composed.tasks_per_node) == (None, "gpu:8", None)
    assert (composed.wckey, composed.requeue, composed.dry_run, composed.name) == (None, True, False, None)

    base = {
        "nodes": 2,
        "gpus_per_node": 8,
        "tasks_per_node": None,
        "cpus_per_task": 8,
        "gres": None,
        "wckey": None,
        "requeue": True,
        "name": None,
        "setup": ["module load cuda"],
        "additional_parameters": {},
        "dry_run": False,
    }
    default = slurm_parameters(base, "/ck/lm-sweep-abc")
    assert (default["gpus_per_node"], default["tasks_per_node"], default["name"]) == (8, 8, "lm-sweep-abc")
    assert default["additional_parameters"] == {"requeue": True} and default["wckey"] is None
    assert default["setup"] == ["export SRUN_CPUS_PER_TASK=8", "module load cuda"] and "dry_run" not in default
    gres = slurm_parameters({**base, "gres": "gpu:a100:4"}, "/ck/s")
    assert "gpus_per_node" not in gres and gres["tasks_per_node"] == 4 and gres["gres"] == "gpu:a100:4"
    cpu = slurm_parameters({**base, "gpus_per_node": None}, "/ck/s")
    assert cpu["gpus_per_node"] is None and cpu["tasks_per_node"] == 1
    chosen = slurm_parameters({**base, "tasks_per_node": 1, "requeue": False, "wckey": "proj", "name": "mine"}, "/ck/s")
    assert (chosen["tasks_per_node"], chosen["wckey"], chosen["name"]) == (1, "proj", "mine")
    assert chosen["additional_parameters"] == {"no-requeue": True}


@pytest.mark.slow
def test_a_launcher_without_multirun_is_refused_with_the_fix(workdir: Path):
    result = dew("hydra/launcher=slurm", "trainer.steps=2", cwd=workdir)
    assert result.returncode == 2 and result.stderr.strip() == (
        "dew-train: error: hydra/launcher=slurm takes effect only on a multirun: without -m Hydra ignores the "
        "launcher and trains in this process; run: dew-train -m hydra/launcher=slurm trainer.steps=2"
    )
    assert list(workdir.iterdir()) == []


def launch_readme_commands() -> list[str]:
    """Every ``dew-train`` command in a code block of launch/README.md (continuation lines joined)."""
    text = (REPO / "launch" / "README.md").read_text()
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    lines = (line.strip() for block in blocks for line in re.sub(r"\\\n\s*", " ", block).splitlines())
    return [re.split(r"\s#\s", line)[0].strip() for line in lines if line.startswith("dew-train")]


@pytest.mark.slow
def test_the_cluster_guides_slurm_commands_print_their_scripts(workdir: Path):
    """launch/README.md's SLURM commands as dry runs (no cluster here: nothing on PATH answers
    ``sbatch``): the script each prints. (tests/cli/test_docs.py runs every command of the page
    through ``dew-train --check``.)"""
    import numpy as np

    (workdir / "data").mkdir()
    np.random.default_rng(0).integers(0, 256, 200_000).astype("<u2").tofile(workdir / "data" / "corpus.bin")
    # the vocabulary beside it, as dew-prepare writes it (a dry run checks the jobs as a launch does)
    (workdir / "data" / "tokens.json").write_text('{"format": "dew-tokens", "version": 1, "vocab_size": 256}')
    commands, dry_runs = launch_readme_commands(), 0
    assert len(commands) >= 4, commands
    for command in commands:
        args = shlex.split(command)[1:]
        if "hydra/launcher=slurm" in args and "-m" in args:
            dry = args if "hydra.launcher.dry_run=true" in args else [*args, "hydra.launcher.dry_run=true"]
            result = dew(*dry, cwd=workdir)
            assert result.returncode == 0 and result.stdout.startswith("#!/bin/bash"), (command, result.stderr[-3000:])
            assert "# dry run: nothing submitted" in result.stdout and "#SBATCH --requeue" in result.stdout
            assert "--wckey" not in result.stdout and "export SRUN_CPUS_PER_TASK=" in result.stdout
            assert not list(workdir.rglob(".submitit")) and not (workdir / "checkpoints").exists()  # no trace
            if "hydra.launcher.nodes=2" in args and "hydra.launcher.gpus_per_node=8" in args:
                print(f"$ {command}\n{result.stdout}")
                for line in (
                    "#SBATCH --nodes=2",
                    "#SBATCH --ntasks-per-node=8",
                    "#SBATCH --gpus-per-node=8",
                    "#SBATCH --job-name=lm-16gpu-sweep-",
                ):
                    assert line in result.stdout, line
            dry_runs += 1
    assert dry_runs >= 2, commands


def test_a_dry_run_checks_the_jobs_as_a_launch_does(workdir: Path):
    """A dry run of a sweep with a bad job prints no script: exit 2 naming the job and the field, and
    nothing left in the working directory (not even Hydra's multirun.yaml)."""
    bad = dew(
        "-m",
        "hydra/launcher=slurm",
        "experiment=digits",
        "model.dtype=float16,float33",
        "hydra.launcher.dry_run=true",
        cwd=workdir,
    )
    assert bad.returncode == 2 and "#!/bin/bash" not in bad.stdout, bad.stdout + bad.stderr
    assert "job 1 (experiment=digits model.dtype=float33): model.dtype: expected one of" in bad.stderr, bad.stderr
    assert "nothing was started: 1 of 2 jobs would fail" in bad.stderr and not list(workdir.iterdir())


# The dry run is the submission: the script the dry run prints is, byte for byte, the one sbatch receives.
HELD = [
    *TINY,
    "trainer.steps=4",
    "trainer.checkpoint_dir=ck",
    "hydra/launcher=slurm",
    "hydra.launcher.gpus_per_node=0",
    "hydra.launcher.timeout_min=5",
]


def printed_script(stdout: str) -> str:
    """The batch script a dry run printed (``print`` adds the newline the split takes)."""
    script = stdout.split("\n# job ", 1)[0]
    assert script.startswith("#!/bin/bash") and script.endswith("\n"), stdout
    return script


def submitted_script(workdir: Path, cluster, *args: str) -> str:
    """Launch ``dew-train -m args`` on the stand-in with its jobs held (never run), and return the
    script sbatch received (every job of a search gets the same); the launcher, waiting on held jobs,
    is killed. It is forked from the worker's warm interpreter (tests/warm.py; cold where it cannot
    be): what is checked is the script it submits, not its start-up (a cold launcher's imports and
    pre-launch check were 2.9-4.6 CPU-s of each of these tests)."""
    env = cluster.env(fast_env(SLURM_STANDIN_HOLD="1"))
    log = workdir.parent / "launcher.out"  # not in workdir, whose tree the dry run's test reads
    launcher = warm.start("dew.cli.train", ["-m", *args], workdir, env, log)
    if launcher is None:
        with log.open("ab") as out:
            launcher = subprocess.Popen(
                [sys.executable, "-m", "dew.cli.train", "-m", *args],
                cwd=workdir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
    try:
        until(lambda: list((cluster.state / "scripts").glob("*.sh")) or launcher.poll() is not None, timeout=120)
    finally:
        # The launcher only submits (held jobs, sbatch returns at once) and then polls the queue:
        # it has no process of its own left to kill once it is.
        if launcher.poll() is None:
            os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
    scripts = {p.read_text() for p in (cluster.state / "scripts").glob("*.sh")}
    assert len(scripts) == 1, log.read_text()[-3000:]  # one array, or a search's jobs alike
    return scripts.pop()


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, args",
    [
        ("one run", ["trainer.name=one"]),
        ("a 4-job array", ["trainer.name=four", "trainer.seed=0,1,2,3", "hydra.launcher.wckey=proj"]),
        (
            "a study's first batch",
            [
                "trainer.name=study",
                "hydra/sweeper=optuna",
                "hydra.sweeper.n_trials=6",
                "hydra.sweeper.n_jobs=2",
                "optim.learning_rate=tag(log, interval(1e-4, 1e-2))",
            ],
        ),
    ],
)
def test_the_dry_run_prints_the_script_sbatch_receives(workdir: Path, slurm_cluster, kind, args):
    env = slurm_cluster.env(fast_env())
    dry = dew("-m", *HELD, *args, "hydra.launcher.dry_run=true", cwd=workdir, env=env)
    assert dry.returncode == 0, dry.stderr[-3000:]
    printed = printed_script(dry.stdout)
    assert tree(workdir) == [] and slurm_cluster.jobs() == [], "a dry run submits and writes nothing"
    jobs = {"one run": 1, "a 4-job array": 4, "a study's first batch": 2}[kind]
    assert dry.stdout.count("\n# job ") == jobs, dry.stdout
    assert ("#SBATCH --wckey=proj" in printed) == (
        "hydra.launcher.wckey=proj" in args
    ) and "--wckey=submitit" not in printed
    assert ("#SBATCH --array=0-3%4" in printed) == (jobs == 4) and ("--array" in printed) == (jobs == 4)
    assert ("# a search: each trial is a job of its own" in dry.stdout) == (kind == "a study's first batch")
    assert submitted_script(workdir, slurm_cluster, *HELD, *args) == printed


def test_a_slurm_launch_without_slurm_is_one_line(workdir: Path):
    result = dew("-m", *HELD, "trainer.name=nowhere", cwd=workdir, env=fast_env(PATH=os.path.dirname(sys.executable)))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip() == (
        "dew-train: error: hydra/launcher=slurm: sbatch and srun not found on PATH: this machine is not a SLURM "
        "login node. Submit from one, or see the batch script with hydra.launcher.dry_run=true"
    )
    assert tree(workdir) == []
