"""An Optuna study in a sweep directory (``hydra/sweeper=optuna``: ``<sweep dir>/study.journal``, or an
older dew's ``study.db``: ``dew.runs.study_storage``), as
``dew-runs`` shows it: every trial with its state, value and parameters, the best one first, and
for a trial that failed, why (its run's state, read from the run's files as for any run).

Read with Optuna's own storage API (no JAX). Optuna comes with ``dew[search]``; without it a study is
reported as unreadable, and the sweep's runs are listed as ever.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from etils import epath

from dew.contract.rundir import PRUNED, STUDY_FAIL_REASON
from dew.runs.discover import RunsError
from dew.runs.status import read_run
from dew.runs.study_storage import reading, study_name
from dew.runs.table import number


@dataclasses.dataclass
class Trial:
    """One trial of the study, joined with its job directory in the sweep."""

    number: int
    state: str
    """complete, fail, running, pruned or waiting (Optuna's states, lower case)."""
    value: float | None
    params: dict[str, Any]
    run: str | None
    """The trial's job directory (``<number>-<searched values>``), when the trial made one."""
    reason: str | None = None
    """For a trial that did not complete, its run's state and reason as dew-runs reads them; for a
    pruned one, the pruner, the step and the value it stopped at."""
    step: int | None = None
    """For a pruned trial, the step its pruner stopped it at (its last intermediate value's)."""


@dataclasses.dataclass
class Study:
    name: str
    path: str
    direction: str
    """minimize or maximize."""
    trials: list[Trial]
    log_params: set[str]
    """The parameters searched on a log scale (their plots use a log axis)."""

    @property
    def best(self) -> Trial | None:
        done = [t for t in self.trials if t.state == "complete" and t.value is not None and math.isfinite(t.value)]
        if not done:
            return None
        pick = max if self.direction == "maximize" else min
        return pick(done, key=lambda t: t.value if t.value is not None else math.nan)  # none is None here

    def best_so_far(self) -> list[tuple[int, float]]:
        """(trial number, the best value among trials up to it) for every completed trial."""
        pick = max if self.direction == "maximize" else min
        out, best = [], None
        for t in sorted(self.trials, key=lambda t: t.number):
            if t.state == "complete" and t.value is not None and math.isfinite(t.value):
                best = t.value if best is None else pick(best, t.value)
                out.append((t.number, best))
        return out


def read_study(directory: str, tracking: str | None = None) -> Study:
    """The study in sweep ``directory``; RunsError when it cannot be read."""
    try:
        import optuna
    except ImportError:
        raise RunsError(
            f"{directory} holds an Optuna study; reading it needs Optuna: pip install 'dew[search]'"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with reading(directory) as storage:
            study = optuna.load_study(study_name=study_name(storage, directory), storage=storage)
            finished, direction = study.trials, study.direction  # read while an older dew's upgraded copy exists
    except Exception as err:
        raise RunsError(f"{directory}: not a readable Optuna study ({_one_line(err)})") from None
    jobs = {d.name.split("-", 1)[0]: d for d in epath.Path(directory).iterdir() if d.is_dir()}
    trials, log_params = [], set()
    for t in finished:
        job = jobs.get(str(t.number))
        trial = Trial(
            number=t.number,
            state=t.state.name.lower(),
            value=t.value,
            params=dict(t.params),
            run=job.name if job is not None else None,
        )
        if trial.state == "pruned":
            trial.step = t.last_step
            trial.reason = _why_pruned(job, tracking, t.last_step)
        elif trial.state != "complete":
            trial.reason = _why(job, tracking, t.user_attrs.get(STUDY_FAIL_REASON))
        trials.append(trial)
        log_params |= {
            k for k, d in t.distributions.items() if getattr(d, "log", False) or "LogUniform" in type(d).__name__
        }
    return Study(
        name=study.study_name,
        path=directory,
        direction=direction.name.lower(),
        trials=trials,
        log_params=log_params,
    )


def _one_line(err: BaseException) -> str:
    return str(err).strip().split("\n", 1)[0] or type(err).__name__


def _why(job: epath.Path | None, tracking: str | None, failure: str | None) -> str:
    """Why a trial did not complete: its run's state from the run's files, or, for a trial that never
    made a run (no record, no journal: refused before it trained), the failure the sweeper recorded."""
    run = read_run(job, job.name, tracking=tracking) if job is not None else None
    if run is None or (run.record is None and run.journal is None):
        if failure:
            return f"failed before it trained: {failure}"
        if run is None:
            return "no run directory: refused before it trained (the sweep's log says why)"
    return f"run {run.summary.status}" + (f": {run.summary.reason}" if run.summary.reason else "")


def _why_pruned(job: epath.Path | None, tracking: str | None, step: int | None) -> str:
    """A pruned trial as its run's ``early_stop`` event says it (``pruned by MedianPruner at step 40 of
    100: eval/loss 1.2``), else the step the study holds."""
    run = read_run(job, job.name, tracking=tracking) if job is not None else None
    said = run.summary.reason if run is not None else None
    if said is not None and said.startswith(f"{PRUNED}: "):
        return f"pruned by {said.removeprefix(f'{PRUNED}: ')}"
    return f"pruned at step {step}" if step is not None else "pruned"


def study_text(study: Study) -> str:
    """The study as dew-runs prints it: a header, the best trial's overrides, then one line per
    trial, best first."""
    counts: dict[str, int] = {}
    for t in study.trials:
        counts[t.state] = counts.get(t.state, 0) + 1
    lines = [
        f"study {study.name} ({study.direction}): {len(study.trials)} trials, "
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    ]
    best = study.best
    if best is not None:
        overrides = " ".join(f"{k}={v}" for k, v in sorted(best.params.items()))
        lines.append(f"best: trial {best.number}, value {number(best.value)}: {overrides}")
    else:
        lines.append("best: none (no trial completed)")
    keys = sorted({k for t in study.trials for k in t.params})
    header = ["trial", "state", "value", *keys]
    rows = [
        [
            str(t.number),
            t.state,
            number(t.value) if t.value is not None else "-",
            *(number(t.params[k]) if k in t.params else "-" for k in keys),
        ]
        for t in sorted(study.trials, key=lambda t: (t is not best, t.number))
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines.append("")
    for r, trial in zip([header, *rows], [None, *sorted(study.trials, key=lambda t: (t is not best, t.number))]):
        text = "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
        if trial is not None and trial.reason:
            text += f"  ({trial.reason})"  # a failed trial's run says why
        lines.append(text)
    return "\n".join(lines)
