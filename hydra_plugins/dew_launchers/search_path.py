"""Hydra's search path for dew's plugins: the ``conf/`` directory of every package that registers
parts through the ``dew.plugins`` entry-point group (``dew.contract.registry.plugin_conf_dirs``) is searched
after dew's own ``conf/``, so ``dew-train model=my_model`` finds the plugin's
``conf/model/my_model.yaml`` with no edit to dew. Hydra finds this class by scanning the
``hydra_plugins`` package."""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

from dew.contract.registry import plugin_conf_dirs


class DewPluginSearchPath(SearchPathPlugin):
    """Appends each dew plugin's ``conf/`` to Hydra's search path."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        for directory in plugin_conf_dirs():
            search_path.append(provider="dew-plugin", path=Path(directory).as_uri())
