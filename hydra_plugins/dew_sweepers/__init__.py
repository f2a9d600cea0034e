"""dew's Optuna sweeper, as a Hydra plugin (``hydra/sweeper=optuna``; ``pip install 'dew[search]'``):
a study in the sweep directory, continued by the same command and counted whole
(``dew.launching.search.study_sweeper``; docs/search.md).

``OptunaConfig``, a search-path plugin that Hydra calls after its plugin scan and before it composes
anything, stores the sweeper's config, its samplers and its pruners in Hydra's ConfigStore
(``dew.launching.search.sweeper_conf``). Nothing here imports Optuna, so Hydra's plugin scan stays quiet where the
extra is not installed.
"""

from __future__ import annotations

import warnings
from typing import Any

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin
from hydra.plugins.sweeper import Sweeper

from dew.launching.search.sweeper_conf import store_sweeper_config

# Optuna warns that QMCSampler is experimental each time one is built (Hydra builds it, from
# hydra/sweeper/sampler=qmc, before the sweeper exists): the user chose it; docs/search.md says what it is.
warnings.filterwarnings("ignore", message=r"QMCSampler is experimental")


class OptunaSweeper(Sweeper):
    """The Hydra face of ``dew.launching.search.study_sweeper.StudySweeper``, which imports Optuna."""

    def __init__(self, **settings: Any) -> None:
        from dew.launching.search.study_sweeper import (
            StudySweeper,  # heavy: Optuna loads only when the sweeper is chosen
        )

        self.sweeper = StudySweeper(**settings)

    def setup(self, **kwargs: Any) -> None:
        self.sweeper.setup(**kwargs)

    def sweep(self, arguments: list[str]) -> None:
        return self.sweeper.sweep(arguments)


class OptunaConfig(SearchPathPlugin):
    """Stores ``hydra/sweeper=optuna`` and its groups (the search path itself is left as it is)."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        store_sweeper_config()  # dew.launching.search.sweeper_conf: the sweeper, its samplers, its pruners
