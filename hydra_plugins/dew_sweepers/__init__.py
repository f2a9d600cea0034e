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

from typing import Any

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin
from hydra.plugins.sweeper import Sweeper

from dew.cli.sweeper_conf import store_sweeper_config


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
        store_sweeper_config()  # dew.cli.sweeper_conf: the plugin's fields, dew's class, the pruners
