"""dew-runs over a real sweep of four tiny digits runs, each in a different state: one finished, one
stopped by SIGTERM mid-run (a real dew-train process), one failed on bad data (a NaN batch), one
still running (its lock held by a live child process). Every run differs from the others in
optim.learning_rate only."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dew.contract.journal import read_journal
from tests.conftest import dew
from tests.training import wrappers
from tests.training.conftest import TINY, compose, fast_env

pytestmark = pytest.mark.slow

SETTINGS = ["trainer.steps=40", "trainer.eval_every=10", "trainer.checkpoint_every=10", "trainer.name=sweep"]
RATES = {"finished": 0.001, "sigterm": 0.002, "bad-data": 0.003, "running": 0.004}
"""Each run's rate; a run's directory is <sweep>/<n>-<role>, in the sweep directory the SIGTERM run
made (a real dew-train -m job: sweep-sweep-<digest>/0-...)."""


def _sweep(tmp: Path) -> str:
    """The sweep directory's name: ``<trainer.name>-sweep-<digest of the command>``."""
    found = sorted((tmp / "ck").glob("sweep-sweep-*"))
    return found[0].name if found else "sweep-sweep-missing"


def runs_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return dew(*args, cwd=cwd, script="dew.cli.runs", timeout=120)


def _train_in_process(tmp: Path, name: str, data=None) -> BaseException | None:
    from dew.build import build_run

    recipe = compose(
        f"trainer.checkpoint_dir={tmp / 'ck'}", *SETTINGS, f"optim.learning_rate={RATES[name.split('-', 1)[1]]}"
    )
    recipe, objective, dataset = build_run(recipe)
    try:  # named as a Hydra sweep names its jobs: trainer.name is the sweep, the job a directory in it
        recipe.train(objective, data(dataset) if data else dataset, name=f"{_sweep(tmp)}/{name}")
    except Exception as err:
        return err
    return None


def _sigterm_run(tmp: Path) -> int:
    """A real one-job sweep of dew-train, sent SIGTERM once its first checkpoint is on disk; its exit
    status. Forked from the suite's warm interpreter where it can be (``warm.start``: a cold start's
    ~1.5 CPU-s of imports spared), its output in dew-train.out."""
    from tests import warm

    args = ["-m", *TINY, *SETTINGS, f"trainer.checkpoint_dir={tmp / 'ck'}", f"optim.learning_rate={RATES['sigterm']}"]
    log = tmp / "dew-train.out"
    proc = warm.start("dew.cli.train", args, tmp, fast_env(), log) or subprocess.Popen(
        [sys.executable, "-m", "dew.cli.train", *args],
        cwd=tmp,
        env=fast_env(),
        stdout=open(log, "a"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if any((tmp / "ck").glob("sweep-sweep-*/0*/10")):  # its first checkpoint is complete on disk
                os.kill(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)
                break
            time.sleep(0.02)
    finally:
        if proc.poll() is None:  # JAX may catch SIGTERM: never leave the process behind
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """(work dir, sweep dir, the lock holder's process); the holder is killed at the end."""
    tmp = tmp_path_factory.mktemp("sweep")
    returncode = _sigterm_run(tmp)  # first: its sweep directory is where the others go
    assert returncode != 0, (tmp / "dew-train.out").read_text()[-3000:]
    assert _train_in_process(tmp, "1-finished") is None
    bad = _train_in_process(tmp, "2-bad-data", lambda d: wrappers.Data(d, nan_at=25))
    assert bad is not None and "non-finite" in str(bad), bad
    crash = _train_in_process(tmp, "3-running", lambda d: wrappers.Data(d, crash_at=25))
    assert isinstance(crash, wrappers.Crash), crash
    run_dir = tmp / "ck" / _sweep(tmp) / "3-running"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from dew.contract.lock import RunLock; "
            "RunLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(900)",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=fast_env(),
    )
    names = {
        "sigterm": next((tmp / "ck" / _sweep(tmp)).glob("0*")).name,
        "finished": "1-finished",
        "bad-data": "2-bad-data",
        "running": "3-running",
    }
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield tmp, tmp / "ck" / _sweep(tmp), holder, names
    finally:
        holder.kill()
        holder.wait()


def _journal(tmp: Path, name: str) -> list[dict]:
    return read_journal(tmp / "tracking" / _sweep(tmp) / name / "journal.jsonl")


def _expected_status(journal: list[dict]) -> str:
    """What dew can honestly say of a run that is not running: its last stop event if it wrote one
    (a signal, a divergence or an error writes one), else that its process ended without recording an end."""
    stops = [r for r in journal if r.get("event") == "stop"]
    if stops:
        reason = stops[-1]["reason"]
        return f"{'failed' if reason in ('nonfinite', 'error') else 'stopped'} ({reason})"
    return "stopped (no end recorded)"


def test_list_shows_each_state_and_the_swept_field(sweep):
    tmp, root, holder, names = sweep
    result = runs_cli(str(root), cwd=tmp)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[-1] == "learning_rate", lines[0]  # the only field in which the runs differ
    rows = {line.split()[0]: line for line in lines[1:5]}
    assert sorted(rows) == sorted(names.values())
    for role, rate in RATES.items():
        assert rows[names[role]].split()[-1] == str(rate)
    assert "  finished  " in rows["1-finished"] and "40/40" in rows["1-finished"]
    assert _expected_status(_journal(tmp, names["sigterm"])) in rows[names["sigterm"]]
    assert _expected_status(_journal(tmp, "2-bad-data")) in rows["2-bad-data"]
    assert "  running  " in rows["3-running"]
    assert f"3-running: process {holder.pid} on " in result.stdout  # who holds it, in the notes

    data = json.loads(runs_cli(str(root), "--json", cwd=tmp).stdout)
    finished = next(d for d in data if d["name"] == "1-finished")
    journal = _journal(tmp, "1-finished")
    losses = [r["train/loss"] for r in journal if "train/loss" in r]
    evals = {r["step"]: r["eval/loss"] for r in journal if "eval/loss" in r and "event" not in r}
    assert finished["train_loss"] == losses[-1] and len(losses) == 40
    assert (finished["best"], finished["best_step"]) == min((v, s) for s, v in evals.items())
    assert finished["checkpoints"][-2:] == [30, 40]  # keep=2 latest (and the best, if older)
    assert finished["fields"] == {"optim.learning_rate": 0.001}
    assert 0 < finished["wall_time"] < 600 and finished["examples_per_sec"] > 0
    # Each run's goodput, the share of its wall time that trained (dew-runs goodput's last column).
    from dew.runs.goodput import ledger

    for d in data:
        if d["journal"] is None:
            assert d["goodput"] is None and "  -  " in rows[d["name"]], d
            continue
        written = read_journal(d["journal"], raw=True)
        assert 0 <= d["goodput"] < 1 and d["goodput"] == pytest.approx(ledger(d["name"], written).goodput), d
        assert f"  {100 * d['goodput']:.1f}%  " in rows[d["name"]], rows[d["name"]]
    assert finished["goodput"] > 0
    sigterm = next(d for d in data if d["name"] == names["sigterm"])
    assert 10 <= sigterm["step"] < 40 and sigterm["checkpoints"][0] == 10


def test_json_round_trips(sweep):
    from dew.cli.runs import load_runs
    from dew.runs.status import RunSummary
    from dew.runs.table import fill_fields

    tmp, root, _, _ = sweep
    result = runs_cli(str(root), "--json", cwd=tmp)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    runs = load_runs([str(root)])
    fill_fields(runs)
    assert [RunSummary.from_json(d) for d in data] == [r.summary for r in runs]
    assert [RunSummary.from_json(d).to_json() for d in data] == data


def test_sort_and_where(sweep):
    tmp, root, _, names = sweep
    result = runs_cli(
        str(root),
        "--where",
        "optim.learning_rate<0.0035",
        "--sort",
        "optim.learning_rate",
        "--reverse",
        "--json",
        cwd=tmp,
    )
    assert result.returncode == 0, result.stderr
    assert [d["name"] for d in json.loads(result.stdout)] == ["2-bad-data", names["sigterm"], "1-finished"]
    result = runs_cli(str(root), "--where", "status=finished", "--json", cwd=tmp)
    assert [d["name"] for d in json.loads(result.stdout)] == ["1-finished"]
    for bad in (["--where", "learning_rate~1"], ["--sort", "no.such.field"]):
        result = runs_cli(str(root), *bad, cwd=tmp)
        assert (
            result.returncode == 2
            and result.stderr.startswith("dew-runs: error: --")
            and "Traceback" not in result.stderr
        )


def test_diff_shows_exactly_the_changed_field(sweep):
    tmp, root, _, names = sweep
    result = runs_cli("diff", str(root / "1-finished"), str(root / names["sigterm"]), cwd=tmp)
    assert result.returncode == 0, result.stderr
    fields = [line.strip() for line in result.stdout.splitlines() if line.startswith("  ")]
    assert fields == ["optim.learning_rate: 0.001 -> 0.002"]
    a = {r["step"]: r["train/loss"] for r in _journal(tmp, "1-finished") if "train/loss" in r}
    b = {r["step"]: r["train/loss"] for r in _journal(tmp, names["sigterm"]) if "train/loss" in r}
    first = min(s for s in a.keys() & b.keys() if a[s] != b[s])
    assert all(a[s] == b[s] for s in a.keys() & b.keys() if s < first)
    assert f"train/loss: first differs at step {first} (" in result.stdout


def test_plot_values_and_picture(sweep):
    from PIL import Image

    from dew.cli.runs import load_runs
    from dew.runs.plot import plot_data

    tmp, root, _, names = sweep
    runs = load_runs([str(root)])
    data = plot_data(runs, ["train/loss", "eval/loss"], smoothing=0.5)
    for role, name in names.items():
        journal = _journal(tmp, name)
        curve = next(c for c in data.curves if c.run == name and c.metric == "train/loss")
        assert curve.steps == [r["step"] for r in journal if "train/loss" in r]
        assert curve.values == [r["train/loss"] for r in journal if "train/loss" in r]
        assert curve.smoothed[0] == curve.values[0]  # debiased: the first smoothed value is the first value
        assert curve.smoothed[1] == pytest.approx((0.5 * curve.values[0] + curve.values[1]) / 1.5)
        assert curve.label.startswith(f"learning_rate={RATES[role]}")
    assert data.fields == ["optim.learning_rate"]
    final = {(p.run, p.metric): (p.x, p.y) for p in data.points}
    evals = [r["eval/loss"] for r in _journal(tmp, "1-finished") if "eval/loss" in r]
    assert final[("1-finished", "eval/loss")] == (0.001, evals[-1])

    result = runs_cli(
        "plot", str(root), "--metric", "train/loss,eval/loss", "--smooth", "0.5", "-o", "sweep.png", cwd=tmp
    )
    assert result.returncode == 0, result.stderr
    image = np.asarray(Image.open(tmp / "sweep.png").convert("RGB"))
    assert image.shape == (800, 1120, 3)  # two metric columns; a curve row and a row against the swept rate
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 50 and image.std() > 10  # drawn, not blank
    result = runs_cli("plot", str(root), "--metric", "eval/loss", "--logy", "-o", "sweep.svg", cwd=tmp)
    assert result.returncode == 0 and (tmp / "sweep.svg").read_text().lstrip().startswith("<?xml")


def test_show_lists_checkpoints_events_and_record(sweep):
    tmp, root, _, _ = sweep
    result = runs_cli("show", str(root / "2-bad-data"), cwd=tmp)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "learning_rate: 0.003" in out  # the record, as YAML
    journal = _journal(tmp, "2-bad-data")
    evals = {r["step"]: r["eval/loss"] for r in journal if "eval/loss" in r and "event" not in r}
    best = min(evals, key=evals.get)
    assert out.count("(best)") == 1
    assert next(line for line in out.splitlines() if line.endswith("(best)")).split()[0] == str(best)
    assert " start " in out and "events (2 evaluations and 2 checkpoints not listed)" in out


def test_goodput_splits_each_runs_wall_time_and_draws_it(sweep, tmp_path):
    """``dew-runs goodput`` on the sweep: a row per run (finished, stopped by a signal, failed,
    crashed) and one for them all, each run's buckets adding up to its wall time, the goodput the
    share of it spent training; and the plot."""
    from dew.runs.goodput import BUCKETS, ledger

    tmp, root, _, names = sweep
    picture = tmp_path / "goodput.png"
    result = runs_cli("goodput", str(root), "-o", str(picture), cwd=tmp)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = lines[0].split()
    assert header[:2] == ["run", "wall"] and header[-1] == "goodput"
    assert {"startup", "compile", "train", "eval", "checkpoint"} <= set(header) <= {"run", "wall", "goodput", *BUCKETS}
    rows = {line.split()[0]: line for line in lines[1:] if line and not line.startswith(" ")}
    assert set(names.values()) | {"all"} <= set(rows), lines
    for name in names.values():
        led = ledger(name, read_journal(tmp / "tracking" / root.name / name / "journal.jsonl", raw=True))
        assert sum(led.seconds.values()) == pytest.approx(led.wall, rel=0.01), (name, led)
        assert rows[name].split()[-1] == f"{100 * led.goodput:.1f}%"
        assert led.seconds["train"] > 0 and led.seconds["startup"] > 0
    finished = ledger("f", read_journal(tmp / "tracking" / root.name / "1-finished" / "journal.jsonl", raw=True))
    assert finished.seconds["eval"] > 0 and finished.seconds["checkpoint"] > 0 and finished.seconds["lost"] == 0
    assert picture.stat().st_size > 5000 and result.stdout.splitlines()[-1].startswith(f"wrote {picture}")


def test_damaged_run_directories_are_listed_with_their_problem(sweep, tmp_path):
    _tmp, root, _, _ = sweep
    other = tmp_path / "ck"
    shutil.copytree(root / "1-finished", other / "cut")
    (other / "cut" / "run.json").write_text('{"model": {"architecture": "simp')  # cut off mid-write
    shutil.copytree(root / "1-finished", other / "lost")
    (other / "lost" / "run.json").unlink()
    result = runs_cli(str(other), "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = {d["name"]: d for d in json.loads(result.stdout)}
    assert data["cut"]["status"] == "damaged" and "run.json is unreadable" in data["cut"]["reason"]
    assert data["lost"]["status"] == "damaged" and data["lost"]["reason"].startswith("no run.json")
    result = runs_cli(str(tmp_path / "nowhere"), cwd=tmp_path)
    assert result.returncode == 2 and "does not exist" in result.stderr and "Traceback" not in result.stderr


def test_console_script_is_declared():
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert 'dew-runs = "dew.cli.runs:main"' in text
