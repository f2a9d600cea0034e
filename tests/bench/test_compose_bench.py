"""bench/compose.py for two rounds, so the command docs/performance.md quotes cannot rot: both sides
compose the same config, each is timed, and dew's side is left installed."""

import importlib
import json

from hydra._internal.config_loader_impl import CachingConfigRepository
from omegaconf import OmegaConf

bench = importlib.import_module("bench.compose")


def test_both_sides_compose_the_same_config_and_are_timed(capsys):
    assert bench.main(["--rounds", "2"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["bench"] == "compose" and record["same_config"] is True
    assert record["ms"]["hydra"] > 0 and record["ms"]["dew"] > 0 and record["cpu_ratio"] > 0
    assert hasattr(CachingConfigRepository.__init__, "__wrapped__") and hasattr(OmegaConf.load, "__wrapped__")
