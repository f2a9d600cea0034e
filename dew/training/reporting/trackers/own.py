"""dew's own trackers: every other module of this package, each of which registers one (the
registry imports this module the first time it is read). A new tracker of dew's is one module here
and its option file in ``conf/trainer/trackers/``."""

from __future__ import annotations

import importlib
import pkgutil

from dew.training.reporting import trackers

MODULES = sorted(m.name for m in pkgutil.iter_modules(trackers.__path__) if m.name != "own")
"""The modules of dew's own trackers, by name."""

for module in MODULES:
    importlib.import_module(f"{trackers.__name__}.{module}")
