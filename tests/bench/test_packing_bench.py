"""bench/packing.py at a small size, so the command docs/performance.md quotes cannot rot: the last
line is the record, and short documents fill at least 95% of the windows."""

import importlib
import json

bench = importlib.import_module("bench.packing")


def test_short_documents_fill_the_windows_and_the_record_says_so(capsys):
    assert bench.main(["--documents", "2000", "--seq-len", "128", "512"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["bench"] == "packing" and [r["seq_len"] for r in record["rows"]] == [128, 512]
    assert all(r["real_fraction"] >= 0.95 and r["windows"] > 0 for r in record["rows"])
