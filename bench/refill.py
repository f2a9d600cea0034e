"""What refilling a search's slots saves (``hydra.sweeper.refill``, ``dew.launching.refill``): the same
study run in Hydra's batch mode (``refill=false``: ``n_jobs`` trials asked at once, launched together,
the next batch once the slowest of them has ended) and with each slot given the next trial the moment
its trial ends (``refill=true``, the default), side by side, on the local launcher
(``hydra/launcher=local``: processes on this machine) and on the SLURM stand-in (tests/slurm_standin:
``hydra/launcher=slurm`` submitting to a fake ``sbatch`` that runs the jobs on this machine).

The study: 16 trials, 4 at a time (``--trials``, ``--slots``), of the digits experiment's tiny model
(depth 1, width 32, 2 heads, batches of 32); a searched run length ``trainer.steps=choice(L, 2L, 3L,
4L)`` (trials 1x to 4x long, ``--length L``) and learning rate ``choice(3e-3, 1e-6)``; the median
pruner (``n_startup_trials=2``), which stops the bad rate's trials at an evaluation once two trials
completed; an evaluation every L/4 steps, no checkpoint but the last; one compilation cache for every
run, filled by one run before the rounds (a trial loads its programs, it does not compile them). The
sampler is Optuna's random sampler, seeded (``--sampler tpe`` for TPE): every trial's parameters are
drawn without looking at any result, so both modes run the same 16 trials; the record says whether they
did (``same_draws``). Each command runs in a directory of its own; in each round every launcher runs
both modes, one after the other, the order alternating from round to round.

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
- ``gaps_s``: the time a slot stood empty before each job after the first ``slots``, the k-th job's
  start less the (k - slots)-th job end (in order of time): in batch mode the wait for the batch's
  slowest trial, under refill what refilling takes (``end_to_submit_s``: the launching process's part,
  from the end to the next job's submission: seeing the job done, telling the study, asking,
  composing and checking the next job, pickling it; ``submit_to_start_s``: from the pickle to the
  job's process up);
- ``run_share``: the runs' own time (their journals' ``start`` to ``end`` event: loading the programs,
  training, evaluating) over the jobs' (the rest is the job's start-up and its samples at the end);
- trials ``complete``, ``pruned``, ``fail``, and the ``steps`` each trial trained (a pruned trial's
  step where it stopped: the pruner judges against the trials completed so far, so the two modes may
  prune differently and train different amounts);
- ``dedicated_*``: the same trials (the steps each trained) on slots that share nothing, each taking
  what a lone run of the model takes before the rounds (``lone_run``: its start-up and its time per
  step), nothing between jobs: the batches' and the refilled slots' makespans, a model of what the
  modes would do where each slot has its own accelerator, not a measurement.

    JAX_PLATFORMS=cpu python bench/refill.py [--launcher local|slurm|both] [--rounds 2] [--length 2000]
    JAX_PLATFORMS=cpu python bench/refill.py --smoke    # 3 trials, 2 slots, L=40, one round: the test's

The last line printed is JSON: {"bench": "refill", "local": {"wall_ratio": ..., "refill_idle_share": ...,
...}, "slurm": {...}, "targets": {"local": {"refill_idle_share_met": ..., "wall_ratio_met": ...}, ...}, ...}.
``wall_ratio`` is the median over the rounds of the refill command's wall time over the batch
command's in the same round; the targets are ``refill_idle_share <= 0.2`` and ``wall_ratio <= 0.7``
for each launcher.
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import json
import os
import re
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
"""A good rate and one the median pruner stops."""
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


def study_args(args: argparse.Namespace, mode: str, cache: Path) -> list[str]:
    """The ``dew-train -m`` arguments of one command of ``mode`` (the launcher's come after)."""
    length = args.length
    return [
        "hydra/sweeper=optuna",
        f"hydra.sweeper.n_trials={args.trials}",
        f"hydra.sweeper.n_jobs={args.slots}",
        f"hydra/sweeper/sampler={args.sampler}",
        f"hydra.sweeper.sampler.seed={args.seed}",
        "hydra/sweeper/pruner=median",
        "hydra.sweeper.pruner.n_startup_trials=2",
        f"hydra.sweeper.refill={str(mode == 'refill').lower()}",
        *TINY,
        f"trainer.steps=choice({','.join(str(k * length) for k in (1, 2, 3, 4))})",
        f"optim.learning_rate={RATES}",
        f"trainer.eval_every={max(length // 4, 1)}",
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
    machine = busy_jiffies()
    try:
        reaped = subprocess.run(
            [sys.executable, "-c", REAPER, json.dumps(argv), str(work / "out.log")],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
    finally:
        if cluster is not None:
            cluster.kill_all()  # none should be left; a command that failed may leave its jobs
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


def lone_run(args: argparse.Namespace, root: Path, cache: Path, name: str, steps: int) -> dict[str, float]:
    """One run of the trials' model alone (the first fills ``cache``): its wall time, and the time
    its journal puts between its first and last training record, per step."""
    from dew.contract.journal import read_journal

    argv = [
        sys.executable,
        "-m",
        "dew.cli.train",
        *TINY,
        f"trainer.steps={steps}",
        f"trainer.eval_every={max(args.length // 4, 1)}",
        f"trainer.log_every={max(steps // 10, 1)}",
        f"trainer.checkpoint_dir={root / 'lone'}",
        f"trainer.compilation_cache_dir={cache}",
        f"trainer.name={name}",
    ]
    began = time.time()
    done = subprocess.run(argv, cwd=root, env=command_env(), capture_output=True, text=True)
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
        for key in ("idle_share", "idle_share_of_wall", "run_share"):
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
    parser.add_argument("--length", type=int, default=2000, help="L: a trial trains L, 2L, 3L or 4L steps")
    parser.add_argument("--sampler", choices=["random", "tpe"], default="random")
    parser.add_argument("--seed", type=int, default=0, help="the sampler's")
    parser.add_argument("--smoke", action="store_true", help="3 trials, 2 slots, L=40, one round")
    parser.add_argument("--keep", type=Path, default=None, help="work in this directory and keep it")
    args = parser.parse_args(argv)
    if args.smoke:
        args.trials, args.slots, args.length, args.rounds = 3, 2, 40, 1
    launchers = list(LAUNCHERS) if args.launcher == "both" else [args.launcher]
    results: dict[str, list[dict[str, dict[str, Any]]]] = {name: [] for name in launchers}
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # tests.slurm_standin
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        cache = root / "xla"
        lone_run(args, root, cache, "warm-up", max(args.length // 4, 1))  # compiles every program the trials load
        lone = lone_run(args, root, cache, "lone", args.length)
        print(
            f"a lone run of {args.length} steps: {lone['wall_s']:.1f} s, {lone['step_s'] * 1e3:.2f} ms a step, "
            f"{lone['startup_s']:.1f} s besides",
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
    record["targets"] = {f"{key}_at_most": limit for key, limit in TARGETS.items()} | {
        launcher: {f"{key}_met": record[launcher][key] <= limit for key, limit in TARGETS.items()}
        for launcher in launchers
    }
    record |= {
        "lone_run": {k: round(v, 6) for k, v in lone.items()},
        "trials": args.trials,
        "slots": args.slots,
        "length": args.length,
        "eval_every": max(args.length // 4, 1),
        "sampler": args.sampler,
        "seed": args.seed,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
    }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
