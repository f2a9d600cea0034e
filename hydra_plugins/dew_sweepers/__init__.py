"""dew's Optuna sweeper, as a Hydra plugin: hydra-optuna-sweeper (``pip install 'dew[search]'``) with
its study in the sweep directory, resumed by the same command and counted whole
(``dew.cli.study_sweeper``; docs/search.md).

``hydra/sweeper=optuna`` selects it: hydra-optuna-sweeper stores its config as ``hydra/sweeper/optuna``
in Hydra's ConfigStore when Hydra scans the plugins, and ``OptunaConfig`` below, a search-path plugin
Hydra calls after that scan and before it composes anything, stores dew's in its place. (A YAML file
of the same name on the search path cannot do it: Hydra refuses a file whose name matches a
ConfigStore schema with a defaults list.) Nothing here imports Optuna, so Hydra's plugin scan stays
quiet where the extra is not installed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin
from hydra.plugins.sweeper import Sweeper

TARGET = "hydra_plugins.dew_sweepers.OptunaSweeper"


class OptunaSweeper(Sweeper):
    """hydra-optuna-sweeper's sweeper with a resumable study (``dew.cli.study_sweeper``)."""

    def __init__(self, **settings: Any) -> None:
        from dew.cli.study_sweeper import ResumableOptunaSweeper  # heavy: Optuna loads only when the sweeper is chosen

        self.sweeper = ResumableOptunaSweeper(**settings)

    def setup(self, **kwargs: Any) -> None:
        self.sweeper.setup(**kwargs)

    def sweep(self, arguments: list[str]) -> None:
        return self.sweeper.sweep(arguments)


class OptunaConfig(SearchPathPlugin):
    """Makes ``hydra/sweeper=optuna`` dew's sweeper (the search path itself is left as it is)."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        try:
            from hydra_plugins.hydra_optuna_sweeper.config import OptunaSweeperConf
        except ImportError:
            return  # without the extra, hydra/sweeper=optuna is not an option, as Hydra says itself
        store_config(OptunaSweeperConf, TARGET)


def store_config(base: type, target: str) -> None:
    """Store dew's sweeper config as ``hydra/sweeper/optuna``: the plugin's fields and defaults, dew's
    class, failures that do not end the study, and a ``pruner`` (none by default; the options of
    ``hydra/sweeper/pruner``). Here, not beside the sweeper, so that Hydra's plugin scan at every
    ``dew-train`` start imports no Optuna (over a second)."""
    from hydra.core.config_store import ConfigStore

    from dew.cli.pruners import PRUNERS

    fields = [
        ("_target_", str, dataclasses.field(default=target)),
        ("defaults", list[Any], dataclasses.field(default_factory=lambda: ["_self_", {"sampler": "tpe"}, {"pruner": None}])),
        ("max_failure_rate", float, dataclasses.field(default=1.0)),
        ("pruner", Any, dataclasses.field(default=None)),
    ]
    node = dataclasses.make_dataclass("DewOptunaSweeperConf", fields, bases=(base,))
    store = ConfigStore.instance()
    store.store(group="hydra/sweeper", name="optuna", node=node, provider="dew")
    for name, pruner in PRUNERS.items():
        store.store(group="hydra/sweeper/pruner", name=name, node=pruner, provider="dew")
