"""tests/cpu_per_test.py, the plugin docs/performance.md's per-test figures come from: a test's own
CPU and its children's are told apart, and nothing is written unless asked."""

import json
import os
import subprocess
import sys

from tests.conftest import REPO

BURNS = """
import subprocess, sys, time

def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

def test_own():
    burn(0.4)

def test_child():
    code = "import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", code], check=True)
"""


def pytest_in(tmp_path, env):
    """pytest on BURNS, one process (no xdist worker's variables: the outer suite's are not its)."""
    env = {k: v for k, v in env.items() if not k.startswith("PYTEST_")}
    (tmp_path / "test_burns.py").write_text(BURNS)
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, *args, "-p", "tests.cpu_per_test", str(tmp_path / "test_burns.py")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_each_tests_own_cpu_and_its_childrens_are_recorded_apart(tmp_path):
    out = tmp_path / "cpu.jsonl"
    pytest_in(tmp_path, {**os.environ, "DEW_CPU_PER_TEST": str(out)})
    records = {r["test"].split("::")[1]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == {"test_own", "test_child"}
    own, child = records["test_own"], records["test_child"]
    assert own["self"] >= 0.35 and own["children"] < 0.05 and own["warm"] == 0
    assert child["children"] >= 0.35 and child["self"] < 0.3 and child["warm"] == 0
    assert all(r["wall"] >= 0.35 and r["worker"] == "" for r in records.values())


def test_nothing_is_written_unless_asked(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DEW_CPU_PER_TEST"}
    pytest_in(tmp_path, env)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == ["test_burns.py"]
