"""The journal as dew-runs reads it: superseded records after a resume, versions, a cut-off last
line, and the state each ending gives a run (written as journals, so every state is covered
whatever the trainer writes today)."""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from etils import epath

from dew.contract import journal as journals
from dew.runs.discover import RunsError, find_journal, find_runs
from dew.runs.plot import smooth
from dew.runs.status import read_run
from dew.runs.table import parse_where
from dew.training.reporting.tracker import JOURNAL_VERSION


def lines(*records: dict) -> list[str]:
    return [json.dumps(r) for r in records]


def test_a_resume_supersedes_what_the_lost_process_logged_past_its_step():
    view = journals.parse(
        lines(
            {"event": "start", "step": 0, "time": 100.0, "journal": 1, "total_steps": 6},
            *({"step": s, "time": 100.0 + s, "train/loss": 10.0 - s} for s in range(1, 6)),
            {"event": "eval", "step": 4, "eval/loss": 3.0},
            {"event": "stop", "step": 5, "time": 105.5, "reason": "preempted", "message": "SIGTERM"},
            {"event": "resume", "step": 3, "time": 200.0, "journal": 1, "total_steps": 6},
            *({"step": s, "time": 200.0 + s, "train/loss": 20.0 + s} for s in range(4, 7)),
            {"event": "end", "step": 6, "time": 207.0},
        )
    )
    assert view.series("train/loss") == ([1, 2, 3, 4, 5, 6], [9.0, 8.0, 7.0, 24.0, 25.0, 26.0])
    assert [e["event"] for e in view.events] == ["start", "stop", "resume", "end"]  # eval at 4 was lost
    assert view.lifecycle()["event"] == "end" and view.total_steps() == 6
    assert view.wall_time() == pytest.approx(5.5 + 7.0)  # two processes: 100 -> 105.5, 200 -> 207


def test_versions_a_cut_off_tail_and_damaged_lines():
    assert journals.parse(lines({"event": "start", "step": 0})).version is None  # before versioning: read as 1
    newer = lines({"event": "start", "step": 0, "journal": JOURNAL_VERSION + 1})
    with pytest.raises(journals.JournalError, match=f"journal version {JOURNAL_VERSION + 1}.*upgrade dew"):
        journals.parse(newer)
    view = journals.parse([*lines({"event": "start", "step": 0}, {"step": 1, "train/loss": "nan"}), '{"step": 2, "tr'])
    assert view.partial_tail and math.isnan(view.series("train/loss")[1][0])
    with pytest.raises(journals.JournalError, match="line 2 is not JSON"):
        journals.parse([*lines({"event": "start", "step": 0}), "garbage", *lines({"step": 1})])


def write_run(root: Path, name: str, records: list[dict] | None, *, record: bool = True, steps: tuple = ()) -> Path:
    run = root / "ck" / name
    run.mkdir(parents=True)
    if record:
        (run / "run.json").write_text(json.dumps({"trainer": {"steps": 10}, "optim": {"learning_rate": 0.1}}))
    for step in steps:
        (run / str(step)).mkdir()
        (run / str(step) / "_CHECKPOINT_METADATA").write_text("{}")  # what orbax writes in every step
    if records is not None:
        journal = root / "tracking" / name / "journal.jsonl"
        journal.parent.mkdir(parents=True)
        journal.write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


START = {"event": "start", "step": 0, "time": 0.0, "journal": 1, "total_steps": 10}


@pytest.mark.parametrize(
    ("ending", "status", "reason"),
    [
        ({"event": "end", "step": 10}, "finished", None),
        (
            {"event": "stop", "step": 4, "reason": "preempted", "message": "SIGTERM at step 4"},
            "stopped",
            "preempted: SIGTERM at step 4",
        ),
        ({"event": "stop", "step": 4, "reason": "interrupted"}, "stopped", "interrupted"),
        (
            {"event": "stop", "step": 4, "reason": "nonfinite", "message": "loss nan at step 4"},
            "failed",
            "nonfinite: loss nan at step 4",
        ),
        (
            {"event": "stop", "step": 4, "reason": "error", "message": "OSError: disk full"},
            "failed",
            "error: OSError: disk full",
        ),
        ({"step": 4, "train/loss": 1.0}, "stopped", "no end recorded"),  # SIGKILL: no word at all
    ],
)
def test_state_from_the_journal(tmp_path, ending, status, reason):
    run = write_run(tmp_path, "sweep/r", [START, {"step": 2, "train/loss": 2.0}, ending])
    summary = read_run(epath.Path(run), "r").summary
    assert summary.status == status
    assert (
        summary.reason == reason
        if reason is None or status != "stopped" or "no end" not in reason
        else summary.reason.startswith(reason)
    )
    assert summary.total_steps == 10 and summary.journal == os.fspath(
        tmp_path / "tracking" / "sweep" / "r" / "journal.jsonl"
    )


def test_never_started_running_and_journal_elsewhere(tmp_path):
    assert read_run(epath.Path(write_run(tmp_path, "fresh", None)), "fresh").summary.status == "never started"
    run = write_run(tmp_path, "held", [START])
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from dew.contract.lock import RunLock; "
            "RunLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(60)",
            str(run),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "locked"
        summary = read_run(epath.Path(run), "held").summary
        assert summary.status == "running" and f"process {child.pid}" in summary.reason
    finally:
        child.kill()
        child.wait()
    assert read_run(epath.Path(run), "held").summary.status == "stopped"  # the holder died: the lock is free
    moved = write_run(tmp_path, "moved", None, steps=(5,))
    summary = read_run(epath.Path(moved), "moved").summary
    assert summary.status == "unknown" and summary.step == 5 and "--tracking" in summary.reason
    (tmp_path / "elsewhere" / "moved").mkdir(parents=True)
    (tmp_path / "elsewhere" / "moved" / "journal.jsonl").write_text(json.dumps(START) + "\n")
    assert find_journal(epath.Path(moved), str(tmp_path / "elsewhere")) is not None


def test_discovery_skips_steps_and_tracking_and_reports_runs_without_a_record(tmp_path):
    write_run(tmp_path, "sweep/a", [START], steps=(2, 4))
    write_run(tmp_path, "sweep/b", None, record=False, steps=(2,))
    (tmp_path / "ck" / "sweep" / "3.orbax-checkpoint-tmp-1").mkdir()
    write_run(tmp_path, "sweep/0", [START], steps=(2,))  # a job named by its number alone is a run, not a step
    assert [p.name for p in find_runs(tmp_path / "ck")] == ["0", "a", "b"]
    assert read_run(find_runs(tmp_path / "ck")[2], "b").summary.status == "damaged"
    with pytest.raises(RunsError, match="does not exist"):
        find_runs(tmp_path / "nope")


def test_a_sweeps_jobs_are_found_in_the_order_of_their_numbers(tmp_path):
    for number in (10, 2, 0, 19, 1, 11):
        write_run(tmp_path, f"sweep/{number}-lr=0.1", [START])
    assert [p.name.split("-")[0] for p in find_runs(tmp_path / "ck")] == ["0", "1", "2", "10", "11", "19"]


def test_where_expressions(tmp_path):
    runs = [
        read_run(epath.Path(write_run(tmp_path, f"r{i}", [START, {"step": 3, "train/loss": float(i)}])), f"r{i}")
        for i in range(3)
    ]
    assert [r.summary.name for r in runs if parse_where("train/loss>=1", runs)(r)] == ["r1", "r2"]
    assert [r.summary.name for r in runs if parse_where("optim.learning_rate = 0.1", runs)(r)] == ["r0", "r1", "r2"]
    with pytest.raises(RunsError, match="expected KEY OP VALUE"):
        parse_where("train/loss", runs)


def test_smoothing_is_a_debiased_moving_average():
    values = [4.0, 2.0, math.nan, 1.0]
    out = smooth(values, 0.5)
    assert out[0] == 4.0 and out[1] == pytest.approx((0.5 * 4 + 2) / 1.5)
    assert math.isnan(out[2]) and out[3] == pytest.approx((0.25 * 4 + 0.5 * 2 + 1) / 1.75)


def test_a_line_cut_off_by_a_killed_process_is_skipped_where_a_kill_leaves_it():
    """The last line, or the line before the next segment's start/resume event; anywhere else a
    line that is not a record is damage, and reading refuses the journal naming the line."""
    start = {"event": "start", "step": 0, "journal": 1, "total_steps": 4}
    resume = {"event": "resume", "step": 1, "journal": 1, "total_steps": 4}
    text = lines(start, {"step": 1, "train/loss": 3.0}, {"step": 2, "train/loss": 2.0})
    view = journals.parse([*text, '{"step": 3, "tra', *lines(resume, {"step": 2, "train/loss": 2.5})])
    assert view.cut_off == [4] and not view.partial_tail
    assert view.series("train/loss") == ([1, 2], [3.0, 2.5])
    assert [r.get("event", r["step"]) for r in view.history()] == ["start", 1, "resume", 2]
    assert len(view.written) == 5  # every record as written, the cut-off line left out
    for damaged in ('{"step": 3, "tra', "[1, 2]", '{"step": "three"}'):
        with pytest.raises(journals.JournalError, match="line 4 is not .*followed by more of the same run"):
            journals.parse([*text, damaged, *lines({"step": 3, "train/loss": 1.0})])


def test_the_writer_ends_a_cut_off_line_and_its_reader_is_the_one_reader(tmp_path):
    from dew.training.reporting.tracker import Journal

    path = tmp_path / "journal.jsonl"
    path.write_text(json.dumps({"event": "start", "step": 0}) + "\n" + '{"step": 1, "tr')
    assert not journals.read(epath.Path(path)).terminated
    writer = Journal(epath.Path(path))
    writer.write({"event": "resume", "step": 0})
    writer.close()
    view = journals.read(epath.Path(path))
    assert view.cut_off == [2] and view.terminated and [r["event"] for r in view.written] == ["start", "resume"]
    assert [r["event"] for r in journals.read_journal(path)] == ["start", "resume"]  # the same, as history


READS = {"loads", "load", "read_text", "read_bytes", "readlines", "readline", "splitlines"}


def _mentions_journal(fn: ast.AST, owner: str) -> bool:
    if "journal" in (getattr(fn, "name", "") + owner).lower():
        return True
    return any(
        (isinstance(n, ast.Name) and "journal" in n.id.lower())
        or (isinstance(n, ast.Attribute) and "journal" in n.attr.lower())
        or (isinstance(n, ast.Constant) and isinstance(n.value, str) and "journal.jsonl" in n.value)
        for n in ast.walk(fn)
    )


def _reads_a_file(fn: ast.AST) -> bool:
    for n in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
        name = getattr(n.func, "id", None) or getattr(n.func, "attr", None)
        if name in READS:
            return True
        modes = [a.value for a in n.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if name == "open" and not any(set(m) & set("aw") for m in modes):
            return True
    return False


def second_readers(root: Path) -> list[str]:
    """Functions under ``root`` (dew/) outside dew/contract/journal.py that read a file or decode
    JSON and name the journal: a reader of their own."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() == "contract/journal.py":
            continue
        tree = ast.parse(path.read_text())
        for owner in [tree, *(c for c in ast.walk(tree) if isinstance(c, ast.ClassDef))]:
            for fn in ast.walk(owner):
                if (
                    isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and _mentions_journal(fn, getattr(owner, "name", ""))
                    and _reads_a_file(fn)
                ):
                    found.append(f"{path.relative_to(root).as_posix()}:{fn.lineno} {fn.name}")
    return sorted(set(found))


def test_dew_reads_journals_in_one_place_only(tmp_path):
    dew = Path(journals.__file__).resolve().parents[1]
    assert second_readers(dew) == []
    # The scan finds a reader of dew's old kind: lines of the journal decoded one by one.
    (tmp_path / "contract").mkdir()
    (tmp_path / "status.py").write_text(
        "import json\n\ndef last_loss(run):\n"
        "    return [json.loads(x) for x in (run / 'journal.jsonl').read_text().splitlines()][-1]\n"
    )
    assert second_readers(tmp_path) == ["status.py:3 last_loss"]
