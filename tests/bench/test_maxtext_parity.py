"""bench/maxtext_parity.py without MaxText: it says what is missing, records the skip and exits 0, so
the comparison cannot rot where MaxText is not installed (nothing here needs MaxText)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("python", ["/nonexistent/python", sys.executable])
def test_without_maxtext_the_script_says_what_is_missing_and_records_the_skip(python):
    # /nonexistent: no such interpreter; this one: an interpreter where 'import maxtext' fails.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "maxtext_parity.py"), "--maxtext-python", python],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    *lines, last = proc.stdout.strip().splitlines()
    record = json.loads(last)
    assert record["bench"] == "maxtext_parity" and python in record["skipped"]
    assert (
        "no Python at" in record["skipped"]
        if python.startswith("/nonexistent")
        else "'import maxtext' fails" in record["skipped"]
    )
    assert len(lines) == 1 and lines[0].startswith(f"maxtext_parity: skipped: {record['skipped']}; install")
    assert "pip install maxtext==0.2.5" in lines[0] and "--maxtext-python" in lines[0]


def test_the_suite_runs_the_maxtext_comparison_only_when_asked(monkeypatch, capsys):
    import importlib

    suite = importlib.import_module("bench.__main__")
    assert "maxtext_parity" not in suite.discover()
    assert "maxtext_parity" in suite.discover(opt_in=True) and "gpu" not in suite.discover(opt_in=True)
    monkeypatch.setenv("MAXTEXT_PYTHON", "/nonexistent/python")
    assert suite.main(["--only", "maxtext_parity"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["bench"] == "maxtext_parity" and "/nonexistent/python" in record["skipped"]
