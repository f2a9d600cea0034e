"""optuna-dashboard reads a study dew made: started on 127.0.0.1 against a sweep's ``study.journal``, its
HTTP API (``/api/studies``, ``/api/studies/<id>``) serves the trials ``dew-runs`` lists, number for
number: state, value and parameters equal to the typed study ``read_study`` returns, and to the
table ``dew-runs <sweep dir>`` prints at its precision. Once for a search ``dew-train -m`` ran, once
for a study written with Optuna alone holding every state a trial ends in (complete, fail, pruned)
and one still running, laid out as a sweep."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from dew.contract.rundir import STUDY_FAIL_REASON, STUDY_FILE

START_TIMEOUT_S = 60
"""Seconds the dashboard may take to answer (it answers in ~2 s on 2 cores)."""
MADE = "digits-sweep-0123456789"
"""The sweep directory ``every_state`` lays out, named as its study."""


@pytest.fixture(scope="module")
def every_state(tmp_path_factory) -> tuple[Path, Path]:
    """A study in every state a trial is left in, written through dew's journal storage into a
    directory laid out as a sweep (named as its study, a job directory for a trial that made one)."""
    import optuna
    from optuna.trial import TrialState

    from dew.runs.study_storage import journal

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    work = tmp_path_factory.mktemp("made")
    sweep = work / "ck" / MADE
    sweep.mkdir(parents=True)
    study = optuna.create_study(
        study_name=sweep.name,
        storage=journal(str(sweep / STUDY_FILE)),
        sampler=optuna.samplers.RandomSampler(seed=0),
    )
    for number, state in enumerate(["COMPLETE", "FAIL", "PRUNED", "COMPLETE", "FAIL", "RUNNING"]):
        trial = study.ask()
        lr = trial.suggest_float("optim.learning_rate", 1e-4, 1e-2, log=True)
        warmup = trial.suggest_int("optim.schedule.warmup_steps", 0, 300)
        decay = trial.suggest_float("optim.weight_decay", 0.0, 0.1)
        for step in (10, 20):
            trial.report(2.0 - step / 100 + lr, step)
        if number == 4:  # refused before it trained: no job directory, the reason in the study
            trial.set_user_attr(STUDY_FAIL_REASON, "optim.schedule.warmup_steps=-1 must be >= 0")
        else:
            (sweep / f"{number}-optim.learning_rate={lr},optim.weight_decay={decay}").mkdir()
        if state == "COMPLETE":
            study.tell(trial, 1.5 + lr + warmup / 1000)
        elif state != "RUNNING":
            study.tell(trial, state=TrialState[state])
    return sweep, work / "tracking"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""To 127.0.0.1 straight, whatever proxy the environment names."""


def _get(url: str) -> Any:
    with _DIRECT.open(url, timeout=10) as response:
        assert response.status == 200, url
        return json.loads(response.read())


def _start_dashboard(storage: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """optuna-dashboard serving ``storage`` on a free port of 127.0.0.1, once it answers: (process, base
    URL). wsgiref: one process (gunicorn, its default when installed, forks workers a kill leaves).
    Another port is tried when the one found free was taken before the dashboard bound it."""
    command = shutil.which("optuna-dashboard", path=str(Path(sys.executable).parent)) or shutil.which(
        "optuna-dashboard"
    )
    assert command is not None, "optuna-dashboard is not installed (pip install 'dew[test]')"
    for _ in range(3):
        port = _free_port()
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [command, "--host", "127.0.0.1", "--port", str(port), "--server", "wsgiref", str(storage)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                _get(f"{url}/api/meta")
                return proc, url
            except OSError:  # not listening yet (URLError, a reset connection, a timeout)
                time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            pytest.fail(f"optuna-dashboard did not answer in {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")
        if "Address already in use" not in log.read_text():
            pytest.fail(f"optuna-dashboard exited {proc.returncode}:\n{log.read_text()[-3000:]}")
    pytest.fail(f"optuna-dashboard found no free port:\n{log.read_text()[-3000:]}")


def _served(sweep: Path, log: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the dashboard serves for the sweep's study: (its entry in /api/studies, /api/studies/<id>)."""
    proc, url = _start_dashboard(sweep / STUDY_FILE, log)
    try:
        [summary] = _get(f"{url}/api/studies")["study_summaries"]
        detail = _get(f"{url}/api/studies/{summary['study_id']}")
    finally:
        proc.kill()
        proc.wait()
    return summary, detail


def _param(p: dict[str, Any]) -> Any:
    """A parameter as the dashboard serves it, as Optuna holds it (its value as text, and its type)."""
    kind = {"<class 'int'>": int, "<class 'float'>": float}.get(p["param_external_pytyp"], str)
    return kind(p["param_external_value"])


def _value(trial: dict[str, Any]) -> float | None:
    return float(trial["values"][0]) if trial.get("values") else None  # "inf" and "-inf" are served as text


@pytest.mark.slow  # optuna-dashboard's start (~2 s)
def test_optuna_dashboard_serves_a_study_in_every_state_as_dew_runs_lists_it(every_state, tmp_path):
    check_served(*every_state, tmp_path)


def check_served(sweep: Path, tracking: Path, tmp_path: Path) -> None:
    """optuna-dashboard, started on the study in ``sweep``, serves its trials as ``read_study`` reads
    them and as ``dew-runs`` lists them (tests/cli/test_search.py runs it on a study a search made)."""
    from dew.cli.runs import run
    from dew.runs.study import read_study
    from dew.runs.table import number

    typed = read_study(str(sweep), str(tracking))
    text = run([str(sweep), "--tracking", str(tracking)])
    summary, detail = _served(sweep, tmp_path / "dashboard.log")
    served = detail["trials"]

    assert summary["study_name"] == detail["name"] == typed.name == sweep.name
    assert summary["directions"] == detail["directions"] == [typed.direction]
    # the typed study, field by field and exactly
    assert [t["number"] for t in served] == [t.number for t in typed.trials] == list(range(len(served)))
    for d, t in zip(served, typed.trials):
        assert d["state"].lower() == t.state, t.number
        assert _value(d) == t.value, t.number
        params = {p["name"]: _param(p) for p in d["params"]}
        assert params == t.params, t.number
        assert {k: type(v) for k, v in params.items()} == {k: type(v) for k, v in t.params.items()}, t.number
        if t.state == "pruned":
            assert t.step == max(v["step"] for v in d["intermediate_values"]), t.number
    if sweep.name == MADE:
        assert [t.state for t in typed.trials] == ["complete", "fail", "pruned", "complete", "fail", "running"]

    # what a user sees: the header, the best trial, and a row per trial (at dew-runs' precision)
    head, table = text.split("\n\n")[:2]
    states: dict[str, int] = {}
    for d in served:
        states[d["state"].lower()] = states.get(d["state"].lower(), 0) + 1
    counts = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
    [best] = detail["best_trials"]
    overrides = " ".join(
        f"{p['name']}={p['param_external_value']}" for p in sorted(best["params"], key=lambda p: p["name"])
    )
    assert head.splitlines() == [
        f"study {detail['name']} ({detail['directions'][0]}): {len(served)} trials, {counts}",
        f"best: trial {best['number']}, value {number(_value(best))}: {overrides}",
    ]
    header, *rows = table.splitlines()
    columns = header.split()
    assert columns[:3] == ["trial", "state", "value"]
    assert columns[3:] == sorted({p["name"] for d in served for p in d["params"]})
    shown = {int(cells[0]): cells for cells in (row.split()[: len(columns)] for row in rows)}
    assert sorted(shown) == [d["number"] for d in served]
    for d in served:
        params = {p["name"]: _param(p) for p in d["params"]}
        want = [str(d["number"]), d["state"].lower(), number(_value(d)), *(number(params.get(k)) for k in columns[3:])]
        assert shown[d["number"]] == want, rows
    assert rows[0].split()[0] == str(best["number"])  # best first
    assert not (sweep / f"{STUDY_FILE}.lock").exists()  # its readers took no lock
