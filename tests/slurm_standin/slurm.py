"""A SLURM stand-in for the tests: ``sbatch``, ``srun``, ``scontrol``, ``squeue``, ``sacct`` and
``scancel`` on this machine, as submitit and dew meet them on a cluster.

Every command is this file, called as ``python slurm.py <command> <args>`` by a wrapper of the
command's name (``install`` in ``tests/slurm_standin/__init__.py`` writes them). The controller's
state is a directory, ``$SLURM_STANDIN_DIR``: one JSON record per job (``jobs/<id>.json``), read and
written under a lock. The cluster has two nodes, ``127.0.0.1`` and ``127.0.0.2`` (node list
``127.0.0.[1-2]``): every loopback address is this machine, so the first node, where JAX puts the
coordinator of an ``srun`` step, is reachable without a hosts file.

- ``sbatch script`` reads the script's ``#SBATCH`` lines, gives the job (each task of an
  ``--array``) an id, prints ``Submitted batch job <id>`` (the id alone with ``--parsable``) and runs
  the script for real in the background under a small controller (``_run``): the variables sbatch
  sets, ``--output`` opened in append mode, ``--export=NONE`` honoured (only ``SLURM_*`` kept). The
  script's bytes as sbatch read them are kept in ``scripts/<id>.sh``; with ``SLURM_STANDIN_HOLD=1``
  (``sbatch --hold``'s effect) the job stays PENDING and never runs.
- ``srun command`` inside the script starts ``nodes x ntasks-per-node`` tasks on this machine with
  the variables ``srun`` sets (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``,
  ``SLURM_STEP_*``, ``CUDA_VISIBLE_DEVICES`` from the GPU options), pins each task to its CPUs as
  Slurm 22.05-23.02 does (``--cpus-per-task`` or ``SRUN_CPUS_PER_TASK``, never sbatch's value) and
  forwards SIGINT, SIGTERM, SIGUSR1 and SIGUSR2 to its tasks.
- ``scontrol show config`` prints ``MaxArraySize`` (``SLURM_STANDIN_MAX_ARRAY_SIZE``, 1001 by default, as
  Slurm's), and ``sbatch`` refuses an array with an index at or above it, as Slurm does.
- ``scontrol requeue <id>`` ends the running job (SIGTERM to all its processes, SIGKILL after
  ``SLURM_STANDIN_KILL_WAIT`` seconds, 30 by default, Slurm's KillWait) and runs the script again
  under the same id with ``SLURM_RESTART_COUNT`` one higher. With ``SLURM_STANDIN_JOB_REQUEUE=0`` (a
  site's ``JobRequeue=0``) it is refused unless the job was submitted with ``--requeue``.
  ``scontrol show job <id>`` prints the record, its ``SubmitTime`` (the submission, or the end of
  the run before the last requeue, as Slurm resets it) and ``StartTime`` (the current run's).
- ``sacct -o JobID,State,NodeList --parsable2 -j <id>`` and ``squeue`` report the states submitit's
  watcher reads: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED.
- ``scancel [--signal=SIG] <id>`` signals the job's tasks, or cancels the job.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

NODES = ["127.0.0.1", "127.0.0.2"]
NODELIST = "127.0.0.[1-2]"
STATE_ENV = "SLURM_STANDIN_DIR"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


# ---------------------------------------------------------------- state
def state_dir() -> Path:
    return Path(os.environ[STATE_ENV])


@contextlib.contextmanager
def locked():
    with open(state_dir() / "lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def record_path(key: str) -> Path:
    return state_dir() / "jobs" / f"{key}.json"


def load(key: str) -> dict:
    return json.loads(record_path(key).read_text())


def save(job: dict) -> None:
    tmp = record_path(job["key"]).with_suffix(".tmp")
    tmp.write_text(json.dumps(job, indent=1))
    tmp.replace(record_path(job["key"]))


def update(key: str, **changes) -> dict:
    with locked():
        job = load(key)
        job.update(changes)
        save(job)
        return job


def keys_of(job_id: str) -> list[str]:
    """The records a job id names: ``N_i`` one array task (or ``N`` a plain job), ``N`` an array's all."""
    jobs = state_dir() / "jobs"
    if (jobs / f"{job_id}.json").exists():
        return [job_id]
    return sorted(p.stem for p in jobs.glob(f"{job_id}_*.json"))


# ---------------------------------------------------------------- sbatch
def sbatch_options(script: str) -> dict[str, str]:
    """The ``#SBATCH --key=value`` lines of a batch script (a bare flag is ``"true"``)."""
    options = {}
    for line in script.splitlines():
        if m := re.match(r"#SBATCH\s+--([\w-]+)(?:[= ](.*))?$", line.strip()):
            options[m.group(1)] = (m.group(2) or "true").strip().strip("'\"")
    return options


def gpus_per_node(options: dict[str, str]) -> int:
    if "gpus-per-node" in options:
        return int(options["gpus-per-node"].rsplit(":", 1)[-1])
    if m := re.match(r"gpu(?::\w+)?:(\d+)$", options.get("gres", "")):
        return int(m.group(1))
    if "gpus-per-task" in options:
        return int(options["gpus-per-task"]) * int(options.get("ntasks-per-node", 1))
    return 0


def free_job_id(count: int) -> int:
    """A job id whose JAX coordinator ports (``SLURM_JOB_ID % 4096 + 61440``, jax's SLURM cluster)
    are free for the ``count`` jobs it starts: tests of other people run at the same time."""
    for _ in range(1000):
        first = random.randrange(100_000, 900_000)
        with contextlib.ExitStack() as stack:
            try:
                for i in range(count):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", (first + i) % 4096 + 61440))
            except OSError:
                continue
        if not any(state_dir().joinpath("jobs").glob(f"{first}*")):
            return first
    raise SystemExit("sbatch: error: no free job id")


def max_array_size() -> int:
    """The site's ``MaxArraySize`` (``SLURM_STANDIN_MAX_ARRAY_SIZE``; Slurm's default, 1001)."""
    return int(os.environ.get("SLURM_STANDIN_MAX_ARRAY_SIZE", "1001"))


def sbatch(args: list[str]) -> None:
    parsable = "--parsable" in args
    path = Path(next(a for a in args if not a.startswith("--"))).resolve()
    received = path.read_bytes()
    options = sbatch_options(received.decode())
    array = re.match(r"(\d+)-(\d+)", options.get("array", ""))
    indices = list(range(int(array.group(1)), int(array.group(2)) + 1)) if array else [None]
    if array and int(array.group(2)) >= max_array_size():  # Slurm's check: every index below MaxArraySize
        raise SystemExit("sbatch: error: Batch job submission failed: Invalid job array specification")
    first = free_job_id(len(indices))
    (state_dir() / "jobs").mkdir(exist_ok=True)
    (state_dir() / "scripts").mkdir(exist_ok=True)
    (state_dir() / "scripts" / f"{first}.sh").write_bytes(received)
    for n, index in enumerate(indices):
        key = str(first) if index is None else f"{first}_{index}"
        job = {
            "key": key,
            "job_id": first + n,
            "array_job_id": first if array else None,
            "array_task_id": index,
            "array_count": len(indices),
            "script": str(path),
            "options": options,
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "state": "PENDING",
            "submitted": time.time(),
            "restarts": 0,
            "requeue": False,
            "starts": [],
            "pgid": None,
            "tasks": [],
            "steps": 0,
            "exit_code": None,
        }
        with locked():
            save(job)
        if os.environ.get("SLURM_STANDIN_HOLD") == "1":
            continue
        subprocess.Popen(
            [sys.executable, "-I", __file__, "_run", key],
            start_new_session=True,
            env=os.environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    print(first if parsable else f"Submitted batch job {first}", flush=True)


def batch_env(job: dict) -> dict[str, str]:
    """The batch script's environment: the submitter's (or, with ``--export=NONE``, its ``SLURM_*``
    variables alone) plus what sbatch sets."""
    options, env = job["options"], dict(job["env"])
    if options.get("export", "ALL").upper() == "NONE":
        env = {k: v for k, v in env.items() if k.startswith("SLURM_")}
        env.update(PATH=f"{state_dir() / 'bin'}{os.pathsep}{os.defpath}", HOME=job["env"].get("HOME", "/"))
    nodes, per_node = int(options.get("nodes", 1)), int(options.get("ntasks-per-node", 1))
    env.update(
        SLURM_JOB_ID=str(job["job_id"]),
        SLURM_JOBID=str(job["job_id"]),
        SLURM_JOB_NAME=options.get("job-name", Path(job["script"]).name),
        SLURM_JOB_NUM_NODES=str(nodes),
        SLURM_NNODES=str(nodes),
        SLURM_JOB_NODELIST=node_list(nodes),
        SLURM_NODELIST=node_list(nodes),
        SLURM_NTASKS=str(nodes * per_node),
        SLURM_NPROCS=str(nodes * per_node),
        SLURM_NTASKS_PER_NODE=str(per_node),
        SLURM_TASKS_PER_NODE=tasks_per_node(nodes, per_node),
        SLURM_NODEID="0",
        SLURM_PROCID="0",
        SLURM_LOCALID="0",
        SLURMD_NODENAME=NODES[0],
        SLURM_SUBMIT_DIR=job["cwd"],
        SLURM_CLUSTER_NAME="standin",
    )
    if "cpus-per-task" in options:
        env["SLURM_CPUS_PER_TASK"] = options["cpus-per-task"]
    if gpus := gpus_per_node(options):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(gpus)))
        env["SLURM_GPUS_ON_NODE"] = str(gpus)
    for option in ("gpus-per-node", "gpus-per-task", "gpu-bind"):
        if option in options:
            env[f"SLURM_{option.upper().replace('-', '_')}"] = options[option]
    if job["array_job_id"] is not None:
        env.update(
            SLURM_ARRAY_JOB_ID=str(job["array_job_id"]),
            SLURM_ARRAY_TASK_ID=str(job["array_task_id"]),
            SLURM_ARRAY_TASK_COUNT=str(job["array_count"]),
        )
    if job["restarts"]:
        env["SLURM_RESTART_COUNT"] = str(job["restarts"])
    return env


def node_list(nodes: int) -> str:
    return NODES[0] if nodes == 1 else NODELIST


def tasks_per_node(nodes: int, per_node: int) -> str:
    return str(per_node) if nodes == 1 else f"{per_node}(x{nodes})"


def output_name(pattern: str, env: dict[str, str], task: int = 0) -> str:
    job = env.get("SLURM_ARRAY_JOB_ID") or env["SLURM_JOB_ID"]
    return (
        pattern.replace("%A", job)
        .replace("%a", env.get("SLURM_ARRAY_TASK_ID", ""))
        .replace("%j", env["SLURM_JOB_ID"])
        .replace("%t", str(task))
        .replace("%N", env.get("SLURMD_NODENAME", ""))
    )


def run(key: str) -> None:
    """The controller of one job: run its script; run it again after each requeue; record the end."""
    while True:
        job = update(key, state="RUNNING", requeue=False, tasks=[])
        env = batch_env(job)
        out = Path(job["cwd"], output_name(job["options"].get("output", "slurm-%j.out"), env))
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "a") as log:
            started = time.time()  # Slurm's StartTime: the allocation, before the script runs
            proc = subprocess.Popen(
                ["bash", job["script"]],
                cwd=job["cwd"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            update(key, pgid=proc.pid, starts=[*job["starts"], started])
            code = proc.wait()
        wait_group_gone(proc.pid)
        job = load(key)
        if job["state"] == "CANCELLED":
            return
        if not job["requeue"]:
            update(key, state="COMPLETED" if code == 0 else "FAILED", exit_code=code, pgid=None)
            return
        # Slurm gives a requeued job a new SubmitTime once its last run has ended (batch_requeue_fini)
        update(key, state="PENDING", restarts=job["restarts"] + 1, pgid=None, submitted=time.time())


def wait_group_gone(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        while True:
            os.killpg(pgid, 0)
            time.sleep(0.05)


def end_job(job: dict) -> None:
    """SIGTERM to every process of the running job, SIGKILL after KillWait, from a helper that
    outlives the caller (``scontrol requeue`` is called by one of the job's own tasks)."""
    if job["pgid"] is None:
        return
    wait = job["env"].get("SLURM_STANDIN_KILL_WAIT", "30")
    subprocess.Popen(
        [sys.executable, "-I", __file__, "_kill", str(job["pgid"]), wait],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def kill(pgid: str, wait: str) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(int(pgid), signal.SIGTERM)
        deadline = time.time() + float(wait)
        while time.time() < deadline:
            os.killpg(int(pgid), 0)
            time.sleep(0.1)
        os.killpg(int(pgid), signal.SIGKILL)


# ---------------------------------------------------------------- srun
SRUN_VALUED = {
    "output": "o",
    "error": "e",
    "cpus-per-task": "c",
    "ntasks": "n",
    "nodes": "N",
    "ntasks-per-node": None,
    "gpus-per-task": None,
    "gpu-bind": None,
    "gres": None,
    "export": None,
    "job-name": "J",
    "kill-on-bad-exit": "K",
}


def srun_options(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """srun's options (``--key=value``, ``--key value``, ``-k value``) and the command after them."""
    short = {v: k for k, v in SRUN_VALUED.items() if v}
    options, i = {}, 0
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        name, _, value = arg.lstrip("-").partition("=")
        name = short.get(name, name) if not arg.startswith("--") else name
        if name in SRUN_VALUED and not value:
            i, value = i + 1, args[i + 1]
        options[name] = value or "true"
        i += 1
    return options, args[i:]


def task_gpus(env: dict[str, str], options: dict[str, str], local: int) -> str | None:
    """CUDA_VISIBLE_DEVICES of one task: every GPU of its node, or, with ``--gpus-per-task`` or
    ``--gpu-bind``, its own GPUs alone, numbered from 0 (the cgroup shows it nothing else)."""
    gpus = int(env.get("SLURM_GPUS_ON_NODE", "0"))
    if not gpus:
        return None
    per_task = options.get("gpus-per-task") or env.get("SLURM_GPUS_PER_TASK")
    if per_task or options.get("gpu-bind") or env.get("SLURM_GPU_BIND"):
        return ",".join(map(str, range(int(per_task or 1))))
    return ",".join(map(str, range(gpus)))


def srun(args: list[str]) -> int:
    options, command = srun_options(args)
    env = dict(os.environ)
    key = (
        env["SLURM_JOB_ID"]
        if "SLURM_ARRAY_JOB_ID" not in env
        else f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    )
    nodes = int(options.get("nodes", env["SLURM_JOB_NUM_NODES"]))
    per_node = int(options.get("ntasks-per-node", env.get("SLURM_NTASKS_PER_NODE", "1")))
    cpus = int(options.get("cpus-per-task") or env.get("SRUN_CPUS_PER_TASK") or 1)  # Slurm 22.05-23.02
    with locked():
        job = load(key)
        step = job["steps"]
        job["steps"] += 1
        save(job)
    if options.get("export", "").upper() == "NONE":
        env = {k: v for k, v in env.items() if k.startswith("SLURM_")} | {"PATH": env["PATH"]}
    ntasks = nodes * per_node
    env.update(
        SLURM_STEP_ID=str(step),
        SLURM_STEPID=str(step),
        SLURM_NTASKS=str(ntasks),
        SLURM_NPROCS=str(ntasks),
        SLURM_STEP_NUM_TASKS=str(ntasks),
        SLURM_STEP_NUM_NODES=str(nodes),
        SLURM_STEP_NODELIST=node_list(nodes),
        SLURM_STEP_TASKS_PER_NODE=tasks_per_node(nodes, per_node),
        SLURM_CPUS_PER_TASK=str(cpus),
    )
    procs = []
    for rank in range(ntasks):
        node, local = divmod(rank, per_node)
        task_env = dict(
            env,
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(local),
            SLURM_NODEID=str(node),
            SLURMD_NODENAME=NODES[node],
            SLURM_TOPOLOGY_ADDR=NODES[node],
        )
        task_env.pop("CUDA_VISIBLE_DEVICES", None)
        if (gpus := task_gpus(env, options, local)) is not None:
            task_env["CUDA_VISIBLE_DEVICES"] = gpus
        log = open(output_name(options.get("output", "slurm-%j.out"), env, rank), "a")
        err = subprocess.STDOUT
        if "error" in options:
            err = open(output_name(options["error"], env, rank), "a")
        cores = sorted(os.sched_getaffinity(0))
        mine = {cores[(local * cpus + c) % len(cores)] for c in range(cpus)}
        procs.append(
            subprocess.Popen(
                command, env=task_env, stdout=log, stderr=err, preexec_fn=lambda m=mine: os.sched_setaffinity(0, m)
            )
        )
    update(key, tasks=[p.pid for p in procs])
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _: [p.send_signal(s) for p in procs if p.poll() is None])
    codes = [p.wait() for p in procs]
    return next((c if c > 0 else 128 - c for c in codes if c != 0), 0)


# ---------------------------------------------------------------- scontrol, sacct, squeue, scancel
def scontrol(args: list[str]) -> int:
    if args[:1] == ["requeue"]:
        for key in (k for ids in args[1].split(",") for k in keys_of(ids)):
            with locked():
                job = load(key)
                if not requeue_allowed(job):
                    print(f"scontrol: error: Requested operation is presently disabled for job {key}", file=sys.stderr)
                    return 1
                job["requeue"] = True
                save(job)
            end_job(job)
        return 0
    if args[:2] == ["show", "config"]:
        print(f"Configuration data as of {time.strftime('%Y-%m-%dT%H:%M:%S')}")
        print(f"MaxArraySize            = {max_array_size()}")
        print("MaxJobCount             = 10000")
        return 0
    if args[:2] == ["show", "job"]:
        for key in keys_of(args[2]):
            job = load(key)
            nodes = int(job["options"].get("nodes", 1))
            started = job["starts"][-1] if job["starts"] and job["state"] != "PENDING" else None
            print(
                f"JobId={job['job_id']} ArrayJobId={job['array_job_id']} ArrayTaskId={job['array_task_id']} "
                f"JobName={job['options'].get('job-name', '')} JobState={job['state']} Restarts={job['restarts']} "
                f"SubmitTime={slurm_time(job.get('submitted'))} StartTime={slurm_time(started)} "
                f"NumNodes={nodes} NodeList={node_list(nodes)}"
            )
        return 0
    print(f"scontrol: error: the stand-in does not know {' '.join(args)!r}", file=sys.stderr)
    return 1


def slurm_time(t: float | None) -> str:
    """A time as scontrol prints it: local time to the second, ``Unknown`` where there is none."""
    return "Unknown" if t is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def requeue_allowed(job: dict) -> bool:
    """``--requeue`` allows it, ``--no-requeue`` forbids it, and without either the site's
    ``JobRequeue`` decides (``SLURM_STANDIN_JOB_REQUEUE``: 1, Slurm's default, or 0)."""
    options = job["options"]
    if "requeue" in options or "no-requeue" in options:
        return "requeue" in options
    return job["env"].get("SLURM_STANDIN_JOB_REQUEUE", "1") == "1"


def job_ids(args: list[str]) -> list[str]:
    ids = [a.split("=", 1)[1] for a in args if a.startswith("--jobs=")]
    ids += [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-j", "--jobs")]
    return [j for i in ids for j in i.split(",")] or [p.stem for p in (state_dir() / "jobs").glob("*.json")]


def sacct(args: list[str]) -> int:
    print("JobID|State|NodeList")
    for key in (k for j in job_ids(args) for k in keys_of(j)):
        job = load(key)
        print(f"{key}|{job['state']}|{node_list(int(job['options'].get('nodes', 1)))}")
    return 0


def squeue(args: list[str]) -> int:
    print("JOBID STATE")
    for key in (k for j in job_ids(args) for k in keys_of(j)):
        if (job := load(key))["state"] in ("PENDING", "RUNNING"):
            print(f"{key} {job['state']}")
    return 0


def scancel(args: list[str]) -> int:
    sig = next((a.split("=", 1)[1] for a in args if a.startswith("--signal=")), None)
    for key in (k for j in args if not j.startswith("-") for k in keys_of(j)):
        job = load(key)
        if sig:
            for pid in job["tasks"]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, getattr(signal, "SIG" + sig.removeprefix("SIG")))
        else:
            update(key, state="CANCELLED")
            end_job(job)
    return 0


COMMANDS = {
    "sbatch": sbatch,
    "srun": srun,
    "scontrol": scontrol,
    "sacct": sacct,
    "squeue": squeue,
    "scancel": scancel,
    "_run": lambda a: run(a[0]),
    "_kill": lambda a: kill(*a),
}

if __name__ == "__main__":
    sys.exit(COMMANDS[sys.argv[1]](sys.argv[2:]) or 0)
