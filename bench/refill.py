"""What refilling a search's slots saves (``hydra.sweeper.refill``, ``dew.launching.refill``): the same
study run in Hydra's batch mode (``refill=false``: ``n_jobs`` trials asked at once, launched together,
the next batch once the slowest of them has ended) and with each slot given the next trial the moment
its trial ends (``refill=true``, the default), side by side, on the local launcher
(``hydra/launcher=local``: processes on this machine) and on the SLURM stand-in (tests/slurm_standin:
``hydra/launcher=slurm`` submitting to a fake ``sbatch`` that runs the jobs on this machine).

The study: 16 trials, 4 at a time (``--trials``, ``--slots``), of the digits experiment's tiny model
(depth 1, width 32, 2 heads, batches of 32); a searched run length ``trainer.steps=choice(L, 2L, 3L,
4L)`` (trials 1x to 4x long, ``--length L``, 4000) and learning rate ``choice(3e-3, 1e-6)``; the
threshold pruner (``upper`` 1.2, ``--threshold``), which stops every trial of the bad rate (its loss
stays at 1.70) at its first evaluation and none of the good one's (0.62 at step 500); an evaluation
every 500 steps (``--eval-every``), no checkpoint but the last; one compilation cache for every run,
filled by one run before the rounds (a trial loads its programs, it does not compile them). The
sampler is Optuna's random sampler, seeded (``--sampler tpe`` for TPE): every trial's parameters are
drawn without looking at any result, so both modes run the same 16 trials; the record says whether they
did (``same_draws``). The threshold pruner judges a trial by its own values alone, so the same trials
train the same steps in both modes (a median pruner judges against the trials completed so far, and
when they complete differs between the modes: it made the two modes' work differ by up to 6%).

The slots (``--slot-cpus``): each job runs in a slot of its own, a cgroup whose CPU time is capped at
0.9 x cores / slots (0.45 of a core for 4 slots on 2 cores), as a job on a cluster has its own GPU or
node: a slot that a batch leaves idle gives no other trial its CPU. ``--slot-cpus 0`` runs the jobs
as plain processes sharing the machine's cores, where the wall time follows the CPU time whatever
the order (docs/performance.md measures both). Each command runs in a directory of its own; in each
round every launcher runs both modes, one after the other, the order alternating from round to round.

A job's start and end are its own process's, from submitit's lines in the job's log
(``<sweep dir>/.submitit/<id>/<id>_0_log.out``): "Starting with JobEnvironment" once the process is up
(the interpreter started, submitit imported), "Exiting after ..." once its result is written (submitit
sees a SLURM job done from then on, when the result file is there; a local job when its process and
the process watching it have exited). Its submission is its pickle's time (``<id>_submitted.pkl``).
Not Optuna's trial times: under refill a trial's ``datetime_start`` is when the sweeper asked for it,
before its job was composed, checked and submitted, and in batch mode every trial's
``datetime_complete`` is when the sweeper told the study, after the batch's last trial ended. Nor the
journals' ``start`` and ``end`` events: they leave out the job's start-up (imports, composing, building
the run), which is the job's own time, not the slot's idle time. Per command:

- ``wall_s``: the ``dew-train -m`` command's wall time; ``cpu_s``: the CPU time (user + system) of it and
  every process of its jobs (``REAPER``), ``own_share`` that over the machine's cores for the wall time,
  and ``machine_busy_share`` the share of the machine's CPU time busy meanwhile (``/proc/stat``: every
  process's, another session's too);
- ``idle_share``: ``1 - sum(job durations) / (slots x span)``, the span from the first job's start to
  the last job's end (``idle_share_of_wall``: over the command's wall time instead, its own start-up
  and study set-up included);
- ``waiting_idle_share``: the slot time that stood empty while a trial waited to start (the sum of
  ``gaps_s``) over ``slots x span``: ``idle_share`` less the time no trial was left to start (the
  last trials' tail, where a cluster's slot is a job that has ended and its node someone else's);
- ``gaps_s``: the time a slot stood empty before each job after the first ``slots``, the k-th job's
  start less the (k - slots)-th job end (in order of time): in batch mode the wait for the batch's
  slowest trial, under refill what refilling takes (``end_to_submit_s``: the launching process's part,
  from the end to the next job's submission: seeing the job done, telling the study, asking,
  composing and checking the next job, pickling it; ``submit_to_start_s``: from the pickle to the
  job's process up);
- ``run_share``: the runs' own time (their journals' ``start`` to ``end`` event: loading the programs,
  training, evaluating) over the jobs' (the rest is the job's start-up and its samples at the end);
- trials ``complete``, ``pruned``, ``fail``, and the ``steps`` each trial trained (a pruned trial's
  step where it stopped);
- ``jobs_in_slots``, ``jobs_held_for_a_slot`` and ``held_s`` (a job whose process came while every slot's
  last job was still tearing down, held stopped until one had exited, as a cluster starts a job on a
  node once the last one's processes there are gone: the wait counts as the slot's gap; formerly it
  joined the emptiest slot, its 0.45 core shared with the job tearing down) and ``throttled_s``
  (the time the cap held the slots' processes back), with
  ``--slot-cpus`` above 0;
- ``dedicated_*``: the same trials (the steps each trained) on slots that share nothing, each taking
  what a lone run of the model takes before the rounds (``lone_run``: its start-up and its time per
  step, in a slot as capped as the trials'), nothing between jobs: the batches' and the refilled
  slots' makespans, a model to set the measurement beside.

    JAX_PLATFORMS=cpu python bench/refill.py [--launcher local|slurm|both] [--rounds 2] [--length 4000]
    JAX_PLATFORMS=cpu python bench/refill.py --slot-cpus 0    # the slots share the machine's cores
    JAX_PLATFORMS=cpu python bench/refill.py --smoke    # 3 trials, 2 slots, L=40, one round, no warm-up: the test's

The last line printed is JSON: {"bench": "refill", "local": {"wall_ratio": ..., "refill_idle_share": ...,
...}, "slurm": {...}, "targets": {"local": {"refill_idle_share_met": ..., "wall_ratio_met": ...}, ...}, ...}.
``wall_ratio`` is the median over the rounds of the refill command's wall time over the batch
command's in the same round; the targets are ``refill_idle_share <= 0.2`` and ``wall_ratio <= 0.7``
for each launcher.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import heapq
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODES = ("batch", "refill")
LAUNCHERS = ("local", "slurm")
TINY = [
    "experiment=digits",
    "model.config.depth=1",
    "model.config.hidden_size=32",
    "model.config.num_heads=2",
    "trainer.batch_size=32",
    "optim.schedule.warmup_steps=1",
    "flow_matching.samples_per_class=1",
    "flow_matching.sample_steps=1",
    "trainer.checkpoint_every=null",
]
RATES = "choice(3e-3,1e-6)"
"""A good rate and one the pruner stops: the bad rate's evaluation loss stays at 1.70 (1.703 at step
500, 1.694 at 2000), the good one's is 0.62 at step 500 and 0.50 at 2000."""
LAUNCHER_ARGS = {
    "local": ["hydra/launcher=local", "hydra.launcher.tasks_per_node=1"],
    "slurm": [
        "hydra/launcher=slurm",
        "hydra.launcher.gpus_per_node=0",
        "hydra.launcher.tasks_per_node=1",
        "hydra.launcher.cpus_per_task=2",  # the stand-in's srun pins each task to this many cores: both, here
        "hydra.launcher.timeout_min=60",
    ],
}
TARGETS = {"refill_idle_share": 0.2, "wall_ratio": 0.7}
"""The issue's targets, for each launcher: at most these."""
SUBMITIT_LINE = re.compile(r"^submitit \w+ \((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\) - (.*)$", re.M)
RUN_START = re.compile(r"\] run \S+?/(\d+)-\S*: starting")


CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


def cgroup_root() -> tuple[Path, int] | None:
    """Where this machine lets the benchmark make CPU-capped cgroups, and its version: a cgroup v2
    hierarchy whose root hands its children the ``cpu`` controller, or cgroup v1's ``cpu``
    controller; None where neither is writable (not root, or a container without them)."""
    control = CGROUP_V2 / "cgroup.subtree_control"
    if control.exists() and "cpu" in control.read_text().split() and os.access(CGROUP_V2, os.W_OK):
        return CGROUP_V2, 2
    if (CGROUP_V1 / "cpu.cfs_quota_us").exists() and os.access(CGROUP_V1, os.W_OK):
        return CGROUP_V1, 1
    return None


class Slots:
    """``n`` slots that share nothing, as a cluster's are: each a cgroup whose CPU time is capped at
    ``cpus`` cores (the kernel's CFS quota), and every job process of the command (a process running
    ``submitit.core._submit`` on a folder under ``marker``) moved into a slot no other job holds the
    moment it appears (polled every 20 ms; a process moved takes its threads, and any process it
    starts later, along). A slot's CPU is its own: a trial never runs faster because a slot beside
    it stands empty, which is what makes an idle slot cost wall time, as a GPU or a node does that a
    batch leaves waiting. Without it the four slots are four processes on this machine's cores, and a
    slot a batch leaves idle hands its cores to the trials still running.

    Written here, not taken from a library: a benchmark's scaffolding for one process tree, where
    SLURM's ``task/cgroup`` plugin or ``systemd-run -p CPUQuota`` would need a daemon this machine
    does not run."""

    def __init__(self, n: int, cpus: float, marker: str | None):
        """``marker``: the folder under which the command's job processes run; None for a command
        whose one process the caller puts in a slot itself (``enter``): then nothing is watched."""
        import threading

        found = cgroup_root()
        if found is None:
            raise SystemExit(
                "bench/refill.py: no writable cgroup cpu controller here (/sys/fs/cgroup/cpu or cgroup v2 "
                "with cpu); run it as root, or with --slot-cpus 0 (the slots then share this machine's cores)"
            )
        root, self.version = found
        self.marker = None if marker is None else marker.encode()
        self.parent = root / f"dew-bench-refill-{os.getpid()}-{next(Slots._made)}"
        self.parent.mkdir()
        # The whole command (the launching process and its jobs) before anything else on the machine
        # (another session's work, a test run beside it), as a cluster's own nodes would be: ten times
        # a process's weight; within it the jobs' slots capped, the launching side (``home``) not.
        if self.version == 1:
            (self.parent / "cpu.shares").write_text("10240")
        else:
            (self.parent / "cpu.weight").write_text("1000")
            (self.parent / "cgroup.subtree_control").write_text("+cpu")
        self.home = self.parent / "home"
        self.home.mkdir()
        self.paths = []
        for i in range(n):
            path = self.parent / f"slot{i}"
            path.mkdir()
            if self.version == 1:
                (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (path / "cpu.cfs_quota_us").write_text(str(int(cpus * PERIOD_US)))
            else:
                (path / "cpu.max").write_text(f"{int(cpus * PERIOD_US)} {PERIOD_US}")
            self.paths.append(path)
        self.placed: dict[int, int] = {}
        """Each job process moved: its slot."""
        self.jobs = 0
        """Jobs moved into a slot (a job's processes under its first follow it)."""
        self.held = 0
        """Jobs that found no empty slot (the last job of each still tearing down) and were held,
        stopped, until one emptied: as a cluster starts a job on a node once the last job's
        processes there have exited."""
        self.held_s = 0.0
        """The time those jobs were held."""
        self.waiting: list[tuple[int, float]] = []
        """Jobs held for a slot (pid, since when), in the order they came."""
        self.followers: dict[int, list[int]] = {}
        """Each held process: the processes of its job (one list, shared by them all)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        if self.marker is not None:
            self._thread.start()

    _made = itertools.count()

    def join_home(self) -> None:
        """Put the calling process (a command about to start, in its ``preexec_fn``) in the command's
        uncapped cgroup: it and what it starts run with the command's priority."""
        (self.home / "cgroup.procs").write_text(str(os.getpid()))

    def procs(self, slot: int) -> list[int]:
        return [int(x) for x in (self.paths[slot] / "cgroup.procs").read_text().split()]

    def enter(self, slot: int, pid: int) -> None:
        (self.paths[slot] / "cgroup.procs").write_text(str(pid))

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit() or int(entry.name) in self.placed:
                    continue
                try:
                    cmdline = Path(entry.path, "cmdline").read_bytes()
                except OSError:
                    continue
                if b"submitit.core._submit" not in cmdline or not self._ours(entry.path, cmdline):
                    continue
                pid = int(entry.name)
                if pid in self.followers:
                    continue
                parent = self._parent(entry.path)
                if parent in self.placed:  # a job's process under its wrapper (the stand-in's srun): its slot
                    self._place(pid, self.placed[parent])
                elif parent in self.followers:  # under a held job: held with it
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGSTOP)
                    self.followers[pid] = self.followers[parent]
                    self.followers[parent].append(pid)
                else:
                    self.jobs += 1
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGSTOP)  # until a slot is empty
                    self.followers[pid] = [pid]
                    self.waiting.append((pid, time.monotonic()))
            self._start_waiting()

    def _start_waiting(self) -> None:
        """Give each held job, in order, a slot whose processes have all exited."""
        while self.waiting:
            empty = [i for i in range(len(self.paths)) if not self.procs(i)]
            if not empty:
                return
            pid, since = self.waiting.pop(0)
            waited = time.monotonic() - since
            if waited > 0.1:  # more than the watcher's own look: a slot was still tearing down
                self.held += 1
                self.held_s += waited
            for member in self.followers[pid]:  # the job's processes, its first one's and any under it
                self._place(member, empty[0])
                with contextlib.suppress(OSError):
                    os.kill(member, signal.SIGCONT)

    def _place(self, pid: int, slot: int) -> None:
        try:
            self.enter(slot, pid)
        except OSError:  # it exited meanwhile
            return
        self.placed[pid] = slot

    @staticmethod
    def _parent(proc: str) -> int | None:
        try:
            return int(Path(proc, "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def _ours(self, proc: str, cmdline: bytes) -> bool:
        """Whether a job process is this command's: its folder (its argument) or its working directory
        under ``marker``."""
        if self.marker in cmdline:
            return True
        try:
            return os.readlink(f"{proc}/cwd").encode().startswith(self.marker)
        except OSError:
            return False

    def throttled_s(self) -> float:
        """The time the slots' processes were held back by their quota (the cap at work)."""
        total = 0.0
        for path in self.paths:
            stat = dict(line.split() for line in (path / "cpu.stat").read_text().splitlines())
            total += (
                int(stat["throttled_time"]) / 1e9
                if "throttled_time" in stat
                else int(stat.get("throttled_usec", 0)) / 1e6
            )
        return total

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        for pid, _ in self.waiting:  # held still (a command that failed): never left stopped
            for member in self.followers[pid]:
                with contextlib.suppress(OSError):
                    os.kill(member, signal.SIGCONT)
        for slot in range(len(self.paths)):
            for pid in self.procs(slot):  # none should be left; a command that failed may leave its jobs
                with contextlib.suppress(OSError):
                    (self.parent.parent / "cgroup.procs").write_text(str(pid))
            self.paths[slot].rmdir()
        for pid in (self.home / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (self.parent.parent / "cgroup.procs").write_text(pid)
        self.home.rmdir()
        self.parent.rmdir()


def study_args(args: argparse.Namespace, mode: str, cache: Path) -> list[str]:
    """The ``dew-train -m`` arguments of one command of ``mode`` (the launcher's come after)."""
    length = args.length
    return [
        "hydra/sweeper=optuna",
        f"hydra.sweeper.n_trials={args.trials}",
        f"hydra.sweeper.n_jobs={args.slots}",
        f"hydra/sweeper/sampler={args.sampler}",
        f"hydra.sweeper.sampler.seed={args.seed}",
        "hydra/sweeper/pruner=threshold",
        f"hydra.sweeper.pruner.upper={args.threshold}",
        f"hydra.sweeper.refill={str(mode == 'refill').lower()}",
        *TINY,
        f"trainer.steps=choice({','.join(str(k * length) for k in (1, 2, 3, 4))})",
        f"optim.learning_rate={RATES}",
        f"trainer.eval_every={args.eval_every}",
        "trainer.checkpoint_dir=ck",
        f"trainer.compilation_cache_dir={cache}",
    ]


def stamp(text: str) -> float:
    """A log line's local time as seconds since the epoch."""
    return datetime.datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def jobs_of(sweep: Path) -> list[dict[str, Any]]:
    """Every job of a sweep: its trial number, submission, start and end (seconds since the epoch),
    from submitit's job folders."""
    jobs = []
    for submitted in sorted(sweep.glob(".submitit/*/*_submitted.pkl")):
        folder = submitted.parent
        logs = sorted(folder.glob("*_0_log.*"))
        text = "".join(p.read_text(errors="replace") for p in logs)
        lines = [(stamp(t), what) for t, what in SUBMITIT_LINE.findall(text)]
        started = [t for t, what in lines if what.startswith("Starting with JobEnvironment")]
        if not started:
            raise SystemExit(f"job {folder.name} of {sweep} never started: {[str(p) for p in logs]}")
        ends = [t for t, what in lines if what.startswith("Exiting after")]
        end = max(ends) if ends else max(p.stat().st_mtime for p in [*logs, *folder.glob("*_result.pkl")])
        trial = RUN_START.search(text)
        jobs.append(
            {
                "id": folder.name,
                "trial": int(trial.group(1)) if trial else None,
                "submitted": submitted.stat().st_mtime,
                "start": min(started),
                "end": end,
            }
        )
    return jobs


def runs_of(tracking: Path) -> dict[int, tuple[float, float, int]]:
    """Each trial's run: (its journal's ``start`` event time, its last ``end`` or ``stop`` event's
    time and step: the steps it trained)."""
    from dew.contract.journal import read_journal

    runs = {}
    for path in tracking.glob("*/*/journal.jsonl"):
        number = int(path.parent.name.split("-", 1)[0])
        events = [r for r in read_journal(path) if "event" in r]
        starts = [r for r in events if r["event"] == "start"]
        ends = [r for r in events if r["event"] in ("end", "stop")]
        if starts and ends:
            runs[number] = (starts[0]["time"], ends[-1]["time"], ends[-1]["step"])
    return runs


def study_of(sweep: Path) -> list[dict[str, Any]]:
    """The study's trials in number order: state and parameters."""
    import optuna

    from dew.runs.study_storage import journal

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=sweep.name, storage=journal(str(sweep / "study.journal")))
    return [{"number": t.number, "state": t.state.name, "params": t.params} for t in study.trials]


def figures(jobs: list[dict[str, Any]], slots: int, wall: float) -> dict[str, Any]:
    """Slot idle shares and gaps of one command's jobs."""
    busy = sum(j["end"] - j["start"] for j in jobs)
    span = max(j["end"] for j in jobs) - min(j["start"] for j in jobs)
    later = sorted(jobs, key=lambda j: j["start"])[slots:]
    ends = sorted(j["end"] for j in jobs)
    return {
        "idle_share": 1 - busy / (slots * span),
        "idle_share_of_wall": 1 - busy / (slots * wall),
        "span_s": span,
        "waiting_idle_share": sum(j["start"] - e for j, e in zip(later, ends)) / (slots * span),
        "gaps_s": [round(j["start"] - e, 2) for j, e in zip(later, ends)],
        "end_to_submit_s": [round(j["submitted"] - e, 2) for j, e in zip(later, ends)],
        "submit_to_start_s": statistics.median(j["start"] - j["submitted"] for j in jobs),
    }


def dedicated(steps: list[int], slots: int, lone: dict[str, float]) -> dict[str, float]:
    """The makespans of trials that trained ``steps`` (in trial order) on ``slots`` slots sharing
    nothing, each taking what a lone run takes (``lone``: its start-up and its time per step), with no
    time between jobs: in batches of ``slots``, each as long as its longest; and refilled (each next
    trial on the slot that frees first)."""
    took = [lone["startup_s"] + lone["step_s"] * n for n in steps]
    batch = sum(max(took[i : i + slots]) for i in range(0, len(took), slots))
    free = [0.0] * slots
    for t in took:
        heapq.heappush(free, heapq.heappop(free) + t)
    return {"batch_s": batch, "refill_s": max(free), "busy_s": sum(took)}


def drawn_steps(seed: int, trials: int, length: int, eval_every: int) -> list[int]:
    """The steps each trial of the study trains, without training it: the parameters Optuna's random
    sampler seeded ``seed`` draws from the study's space (``trainer.steps``, then the rate, as the
    sweeper asks for them: the benchmark checks that the rounds drew the same), a trial of the bad
    rate stopped by the pruner at its first evaluation."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = {
        "trainer.steps": optuna.distributions.CategoricalDistribution([k * length for k in (1, 2, 3, 4)]),
        "optim.learning_rate": optuna.distributions.CategoricalDistribution([3e-3, 1e-6]),
    }
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    steps = []
    for _ in range(trials):
        trial = study.ask(space)
        steps.append(trial.params["trainer.steps"] if trial.params["optim.learning_rate"] == 3e-3 else eval_every)
        study.tell(trial, 0.0)
    return steps


def over_seeds(args: argparse.Namespace, lone: dict[str, float], seeds: int) -> dict[str, Any]:
    """The model (``dedicated``) of the study drawn with each of the sampler's seeds 0 to ``seeds - 1``:
    how the refilled slots' idle share and the wall ratio spread over the draws, how many draws meet
    the targets, and the seed whose idle share is the median (``--seed median`` runs that one). The
    idle share left with refilling is the tail (the last trials running while no trial is left to
    start), and how long it is depends on which trials the sampler drew last."""
    rows = []
    for seed in range(seeds):
        model = dedicated(drawn_steps(seed, args.trials, args.length, args.eval_every), args.slots, lone)
        idle = 1 - model["busy_s"] / (args.slots * model["refill_s"])
        rows.append((idle, model["refill_s"] / model["batch_s"], seed))
    deciles = {
        name: [round(q, 3) for q in statistics.quantiles([r[i] for r in rows], n=10)]
        for i, name in enumerate(("refill_idle_share", "wall_ratio"))
    }
    ranked = sorted(rows)
    return {
        "seeds": seeds,
        "deciles": deciles,  # the 10th, 20th, ..., 90th percentiles
        "share_meeting_targets": round(
            sum(i <= TARGETS["refill_idle_share"] and w <= TARGETS["wall_ratio"] for i, w, _ in rows) / seeds, 3
        ),
        "median_seed": ranked[(seeds - 1) // 2][2],
        "by_seed": {str(s): [round(i, 3), round(w, 3)] for i, w, s in rows if s in (0, ranked[(seeds - 1) // 2][2])},
    }


def one_command(args: argparse.Namespace, launcher: str, mode: str, work: Path, cache: Path) -> dict[str, Any]:
    """Run one ``dew-train -m`` command of ``mode`` on ``launcher`` in the fresh directory ``work``; its figures."""
    work.mkdir(parents=True)
    env = command_env()
    cluster = None
    if launcher == "slurm":
        from tests.slurm_standin import install

        cluster = install(work / "slurm")
        env = cluster.env(env)
    argv = [sys.executable, "-m", "dew.cli.train", "-m", *study_args(args, mode, cache), *LAUNCHER_ARGS[launcher]]
    slots = Slots(args.slots, args.slot_cpus, str(work)) if args.slot_cpus else None
    machine = busy_jiffies()
    try:
        reaped = subprocess.run(
            [sys.executable, "-c", REAPER, json.dumps(argv), str(work / "out.log")],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            preexec_fn=slots.join_home if slots else None,
        )
    finally:
        if cluster is not None:
            cluster.kill_all()  # none should be left; a command that failed may leave its jobs
        confined = {"jobs_in_slots": None, "jobs_held_for_a_slot": None, "held_s": None, "throttled_s": None}
        if slots is not None:
            confined = {
                "jobs_in_slots": slots.jobs,
                "jobs_held_for_a_slot": slots.held,
                "held_s": round(slots.held_s, 2),
                "throttled_s": round(slots.throttled_s(), 1),
            }
            slots.close()
    if reaped.returncode != 0:
        raise SystemExit(f"the reaper of {launcher} {mode} failed:\n{reaped.stderr[-3000:]}")
    ran = json.loads(reaped.stdout.strip().splitlines()[-1])
    code, wall = ran["code"], ran["wall_s"]
    busy = busy_jiffies()
    machine_busy = round((busy[0] - machine[0]) / (busy[1] - machine[1]), 3) if machine and busy else None
    if code != 0:
        log = work / "out.log"
        raise SystemExit(f"{launcher} {mode} exited {code} ({log}):\n{log.read_text()[-3000:]}")
    (sweep,) = (work / "ck").glob("*-sweep-*")
    jobs, trials, runs = jobs_of(sweep), study_of(sweep), runs_of(work / "tracking")
    if len(jobs) != args.trials or len(runs) != args.trials:
        raise SystemExit(f"{launcher} {mode}: {len(jobs)} jobs, {len(runs)} runs for {args.trials} trials in {sweep}")
    states = [t["state"] for t in trials]
    return {
        "wall_s": wall,
        "cpu_s": ran["cpu_s"],
        "own_share": ran["cpu_s"] / (wall * (os.cpu_count() or 1)),
        "machine_busy_share": machine_busy,
        **figures(jobs, args.slots, wall),
        "run_share": sum(e - s for s, e, _ in runs.values()) / sum(j["end"] - j["start"] for j in jobs),
        **confined,
        "trials": {s.lower(): states.count(s) for s in ("COMPLETE", "PRUNED", "FAIL")},
        "steps": [runs[t["number"]][2] for t in trials],
        "draws": [[t["params"].get("trainer.steps"), t["params"].get("optim.learning_rate")] for t in trials],
    }


REAPER = """
import ctypes, json, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: the jobs sbatch leaves orphaned end here
argv, log = json.loads(sys.argv[1]), sys.argv[2]
with open(log, "w") as out:
    began = time.time()
    main = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
cpu, code, wall, deadline = 0.0, None, None, None
while deadline is None or time.time() < deadline:
    try:
        pid, status, usage = os.wait4(-1, os.WNOHANG)
    except ChildProcessError:
        break
    if pid == 0:
        time.sleep(0.05)
        continue
    cpu += usage.ru_utime + usage.ru_stime
    if pid == main.pid:
        main.returncode = code = os.waitstatus_to_exitcode(status)
        wall, deadline = time.time() - began, time.time() + 60
print(json.dumps({"code": code, "wall_s": wall, "cpu_s": cpu}))
"""
"""Runs a command and prints its exit status, wall time and CPU time (user + system), its own and
every descendant's: the local launcher's jobs are its children's children, and the jobs the SLURM
stand-in's ``sbatch`` starts (in sessions of their own, orphaned when it returns) are reparented to
this process, a child subreaper, which reaps them."""


def busy_jiffies() -> tuple[int, int] | None:
    """The machine's busy and total CPU time so far (``/proc/stat``, every process's), or None."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def command_env() -> dict[str, str]:
    """A dew command's environment: this one's on the CPU, each command's journals in its own
    directory (``./tracking``), without pytest's and Hydra's variables (the smoke test runs it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "PYTEST_", "DEW_TRACKING_DIR"))}
    return env | {"JAX_PLATFORMS": "cpu", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def lone_run(
    args: argparse.Namespace, root: Path, cache: Path, name: str, steps: int, confine: bool = False
) -> dict[str, float]:
    """One run of the trials' model alone (the first fills ``cache``): its wall time, and the time
    its journal puts between its first and last training record, per step; ``confine``: in a slot
    (``--slot-cpus``) of its own, as the trials run."""
    from dew.contract.journal import read_journal

    argv = [
        sys.executable,
        "-m",
        "dew.cli.train",
        *TINY,
        f"trainer.steps={steps}",
        f"trainer.eval_every={args.eval_every}",
        f"trainer.log_every={max(steps // 10, 1)}",
        f"trainer.checkpoint_dir={root / 'lone'}",
        f"trainer.compilation_cache_dir={cache}",
        f"trainer.name={name}",
    ]
    # No marker: the run's one process is put in the slot as it starts (``preexec_fn``), and a
    # watcher would take any other command's job processes on the machine for this one's.
    slot = Slots(1, args.slot_cpus, None) if confine and args.slot_cpus else None
    began = time.time()
    try:
        done = subprocess.run(
            argv,
            cwd=root,
            env=command_env(),
            capture_output=True,
            text=True,
            preexec_fn=(lambda: slot.enter(0, os.getpid())) if slot else None,
        )
    finally:
        if slot is not None:
            slot.close()
    wall = time.time() - began
    if done.returncode != 0:
        raise SystemExit(f"the lone run {name} exited {done.returncode}:\n{done.stderr[-3000:]}")
    trained = [r for r in read_journal(root / "tracking" / name / "journal.jsonl") if "train/loss" in r]
    step_s = (trained[-1]["time"] - trained[0]["time"]) / max(trained[-1]["step"] - trained[0]["step"], 1)
    return {"wall_s": wall, "step_s": step_s, "startup_s": wall - step_s * steps}


def summary(rounds: list[dict[str, dict[str, Any]]], slots: int, lone: dict[str, float]) -> dict[str, Any]:
    """One launcher's figures over the rounds: medians, each round's values, and the same trials on
    slots that share nothing (``dedicated``)."""
    ratios = [r["refill"]["wall_s"] / r["batch"]["wall_s"] for r in rounds]
    out: dict[str, Any] = {"wall_ratio": statistics.median(ratios), "wall_ratios": [round(x, 3) for x in ratios]}
    for mode in MODES:
        runs = [r[mode] for r in rounds]
        out[f"{mode}_wall_s"] = round(statistics.median(x["wall_s"] for x in runs), 1)
        out[f"{mode}_cpu_s"] = round(statistics.median(x["cpu_s"] for x in runs), 1)
        for key in ("idle_share", "idle_share_of_wall", "waiting_idle_share", "run_share"):
            out[f"{mode}_{key}"] = round(statistics.median(x[key] for x in runs), 3)
            out[f"{mode}_{key}s"] = [round(x[key], 3) for x in runs]
        gaps = [g for x in runs for g in x["gaps_s"]]
        out[f"{mode}_gap_s"] = {"median": statistics.median(gaps), "max": max(gaps)} if gaps else None
        out[f"{mode}_steps"] = [sum(x["steps"]) for x in runs]
    latency = [g for r in rounds for g in r["refill"]["end_to_submit_s"]]
    out["refill_end_to_submit_s"] = {"median": statistics.median(latency), "max": max(latency)} if latency else None
    out["submit_to_start_s"] = round(statistics.median(r[m]["submit_to_start_s"] for r in rounds for m in MODES), 2)
    out["same_draws"] = all(r["batch"]["draws"] == r["refill"]["draws"] for r in rounds)
    out["draws_matching"] = [sum(a == b for a, b in zip(r["batch"]["draws"], r["refill"]["draws"])) for r in rounds]
    model = [
        (dedicated(r["batch"]["steps"], slots, lone), dedicated(r["refill"]["steps"], slots, lone)) for r in rounds
    ]
    out["dedicated_wall_ratio"] = round(statistics.median(re["refill_s"] / ba["batch_s"] for ba, re in model), 3)
    out["dedicated_batch_idle_share"] = round(
        statistics.median(1 - ba["busy_s"] / (slots * ba["batch_s"]) for ba, _ in model), 3
    )
    out["dedicated_refill_idle_share"] = round(
        statistics.median(1 - re["busy_s"] / (slots * re["refill_s"]) for _, re in model), 3
    )
    out["rounds"] = [
        {
            mode: {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r[mode].items() if k != "draws"}
            for mode in MODES
        }
        for r in rounds
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launcher", choices=[*LAUNCHERS, "both"], default="both")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--slots", type=int, default=4, help="hydra.sweeper.n_jobs")
    parser.add_argument("--length", type=int, default=4000, help="L: a trial trains L, 2L, 3L or 4L steps")
    parser.add_argument("--eval-every", type=int, default=500, help="trainer.eval_every: where the pruner judges")
    parser.add_argument("--threshold", type=float, default=1.2, help="the threshold pruner's upper bound on eval/loss")
    parser.add_argument(
        "--slot-cpus",
        type=float,
        default=None,
        help="each slot's CPU cap in cores (a cgroup's quota; default: 0.9 x cores / slots where a cgroup cpu "
        "controller is writable, else 0); 0: the slots share this machine's cores",
    )
    parser.add_argument("--sampler", choices=["random", "tpe"], default="random")
    parser.add_argument(
        "--seed",
        default="0",
        help="the sampler's; 'median': the seed whose draws the model (over seeds 0 to --model-seeds, with this "
        "machine's lone run) gives the median idle share with refilling: many seeds lie near it, so which one "
        "varies with the lone run's timing (docs/performance.md names the seed it ran)",
    )
    parser.add_argument("--model-seeds", type=int, default=200, help="the seeds the model is run over")
    parser.add_argument("--smoke", action="store_true", help="3 trials, 2 slots, L=40, one round, --no-warm-up")
    parser.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="no warm-up run before the lone run: the lone run fills the compilation cache itself (the trials "
        "still load their programs), its start-up then holding what it compiled",
    )
    parser.add_argument("--keep", type=Path, default=None, help="work in this directory and keep it")
    parser.add_argument(
        "--compilation-cache",
        type=Path,
        default=None,
        help="the compilation cache every run uses (default: a fresh one in the work directory); the warm-up "
        "run (with --no-warm-up the lone run) fills what it lacks either way (the smoke test gives the test "
        "suite's, where its tiny runs' programs are already)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.trials, args.slots, args.length, args.eval_every, args.rounds = 3, 2, 40, 10, 1
        args.threshold = 1.6  # the bad rate: 1.71 at step 10, the good one: 1.46
        # A smoke run checks that the bench runs and records, not its figures: the warm-up is a cold
        # dew-train of its own (~4 CPU-s of the smoke test's ~53, whatever the cache holds).
        args.warm_up = False
    if args.slot_cpus is None:
        args.slot_cpus = round(0.9 * (os.cpu_count() or 1) / args.slots, 3) if cgroup_root() else 0.0
    launchers = list(LAUNCHERS) if args.launcher == "both" else [args.launcher]
    results: dict[str, list[dict[str, dict[str, Any]]]] = {name: [] for name in launchers}
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # tests.slurm_standin
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        cache = args.compilation_cache or root / "xla"
        if args.warm_up:  # compiles every program the trials load (else the lone run does)
            lone_run(args, root, cache, "warm-up", args.eval_every)
        lone = lone_run(args, root, cache, "lone", args.length, confine=True)
        print(
            f"a lone run of {args.length} steps: {lone['wall_s']:.1f} s, {lone['step_s'] * 1e3:.2f} ms a step, "
            f"{lone['startup_s']:.1f} s besides",
            flush=True,
        )
        seeds = over_seeds(args, lone, args.model_seeds)
        args.seed = seeds["median_seed"] if args.seed == "median" else int(args.seed)
        modelled = drawn_steps(args.seed, args.trials, args.length, args.eval_every)
        print(
            f"the model over {args.model_seeds} seeds: refilled idle share deciles "
            f"{seeds['deciles']['refill_idle_share']}, wall ratio deciles {seeds['deciles']['wall_ratio']}; "
            f"seed {args.seed} draws {modelled}",
            flush=True,
        )
        for r in range(args.rounds):
            for launcher in launchers:
                row = {}
                for mode in MODES if r % 2 == 0 else MODES[::-1]:
                    row[mode] = x = one_command(args, launcher, mode, root / f"{launcher}-{mode}-{r}", cache)
                    print(
                        f"round {r}: {launcher:5s} {mode:6s} wall {x['wall_s']:6.1f} s  idle {x['idle_share']:.3f} "
                        f"(of wall {x['idle_share_of_wall']:.3f})  steps {sum(x['steps'])}  trials {x['trials']}  "
                        f"CPU {x['cpu_s']:.0f} s (of the cores {x['own_share']:.2f}, busy {x['machine_busy_share']})",
                        flush=True,
                    )
                results[launcher].append(row)
    record: dict[str, Any] = {"bench": "refill"}
    for launcher in launchers:
        record[launcher] = summary(results[launcher], args.slots, lone)
        if args.sampler == "random":  # the rounds trained what drawn_steps says
            record[launcher]["modelled_draws"] = all(
                r[mode]["steps"] == modelled for r in results[launcher] for mode in MODES
            )
    record["targets"] = {f"{key}_at_most": limit for key, limit in TARGETS.items()} | {
        launcher: {f"{key}_met": record[launcher][key] <= limit for key, limit in TARGETS.items()}
        for launcher in launchers
    }
    record |= {
        "lone_run": {k: round(v, 6) for k, v in lone.items()},
        "trials": args.trials,
        "slots": args.slots,
        "length": args.length,
        "eval_every": args.eval_every,
        "threshold": args.threshold,
        "warm_up": args.warm_up,
        "slot_cpus": args.slot_cpus,
        "sampler": args.sampler,
        "seed": args.seed,
        "over_seeds": seeds,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
    }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
