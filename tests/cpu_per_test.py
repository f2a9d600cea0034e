"""Each test's CPU time, for finding where the suite's time goes: a pytest plugin, loaded only when
asked for (docs/performance.md, "The test suite's time", quotes its figures)::

    DEW_CPU_PER_TEST=cpu.jsonl python -m pytest -q -n 2 -p tests.cpu_per_test

appends one JSON line a test to the file ``DEW_CPU_PER_TEST`` names: ``self`` (the pytest worker's
own user + system CPU seconds while the test ran, fixtures included), ``children`` (the processes it
started and waited for: ``subprocess.run``, a ``Popen`` it waited on, and all their waited-for
descendants), ``warm`` (the commands tests/warm.py forked for it, with their descendants), ``wall``
and ``worker``. What no process of the test waited for is not counted (a detached job of the SLURM
stand-in, a process killed before its parent reaped it). The machine's speed moves every figure:
compare runs by ratios of the same tests, measured side by side."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest


def _cpu() -> tuple[float, float, float]:
    from tests import warm

    t = os.times()
    return t.user + t.system, t.children_user + t.children_system, warm.child_cpu


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    out = os.environ.get("DEW_CPU_PER_TEST")
    if not out:
        yield
        return
    before, began = _cpu(), time.monotonic()
    yield
    after = _cpu()
    record = {
        "test": item.nodeid,
        "self": round(after[0] - before[0], 3),
        "children": round(after[1] - before[1], 3),
        "warm": round(after[2] - before[2], 3),
        "wall": round(time.monotonic() - began, 3),
        "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
    }
    with open(out, "a") as f:  # one short line a test: the workers' appends do not interleave
        f.write(json.dumps(record) + "\n")
