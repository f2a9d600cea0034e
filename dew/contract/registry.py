"""Names shared by the config layer and the JAX stack, and the one registry shape every pluggable
part uses.

An architecture, an objective, a dataset, a schedule and an optimizer are each one registered class:
``@architectures.register("my_model")`` on the class gives it its name and puts it in the registry,
and the rest of dew asks the class what it needs (its fields, its builder, its FLOPs, ...). dew's own
parts register when their package is imported; a package outside dew registers its parts through the
``dew.plugins`` entry-point group (docs/extending.md), loaded the first time any registry is read.
This module does not import JAX.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Generic, Literal, TypeVar

DtypeName = Literal["float32", "bfloat16", "float16"]
"""A floating dtype by its NumPy/JAX name."""

MatmulPrecision = Literal["default", "high", "highest"]
"""What a matmul asks XLA for: the backend's fastest algorithm, or more mantissa bits."""

AttentionImpl = Literal["auto", "xla", "cudnn"]
"""Attention kernel: ``auto`` is cudnn on a GPU for the shapes cudnn supports and xla otherwise."""


RematPolicy = Literal["none", "full", "dots", "minimal", "minimal_with_context"]
"""What a block's backward pass keeps from its forward pass (``dew.models.stack``): everything
(``none``), only the block's input (``full``), every matmul's output (``dots``), the weight matmuls'
outputs but not attention's (``minimal``, MaxText's name), or those and attention's output
(``minimal_with_context``)."""

PLUGIN_GROUP = "dew.plugins"
"""The entry-point group a plugin package names its modules in; importing one registers its parts."""

T = TypeVar("T", bound=type)


def unknown_name(kind: str, name: object, known: Iterable[str]) -> ValueError:
    """The error for a name a registry does not hold, listing the ones it does."""
    return ValueError(f"unknown {kind} {name!r}; known: {', '.join(sorted(known))}")


class Registry(Mapping[str, T], Generic[T]):
    """Name -> registered class, for one kind of part. Reading it (a lookup, a listing) first loads
    the installed plugins, so a plugin's part is known wherever dew's own are."""

    def __init__(self, kind: str, builtins: tuple[str, ...] = ()) -> None:
        self.kind = kind
        """What the registry holds, for messages (``architecture``, ``objective``, ...)."""
        self._builtins = builtins
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Class decorator: register the class under ``name`` and set its ``name`` to it. A name
        registered twice raises naming both classes (a plugin cannot silently replace a part)."""

        def add(cls: T) -> T:
            held = self._entries.get(name)
            if held is not None and held is not cls and _qualname(held) != _qualname(cls):
                raise ValueError(
                    f"{self.kind} {name!r} is registered twice: by {_qualname(held)} and by {_qualname(cls)}"
                )
            cls.name = name  # type: ignore[attr-defined]
            self._entries[name] = cls
            return cls

        return add

    def _import_builtins(self) -> None:
        for module in self._builtins:
            if module not in sys.modules:  # a built-in being imported is in sys.modules already
                importlib.import_module(module)

    def _loaded(self) -> dict[str, T]:
        self._import_builtins()
        load_plugins()
        return self._entries

    def __getitem__(self, name: str) -> T:
        entries = self._loaded()
        if name not in entries:
            raise unknown_name(self.kind, name, entries)
        return entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._loaded()

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._loaded()))

    def __len__(self) -> int:
        return len(self._loaded())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


_plugins_loaded = False
_plugin_modules: list[str] = []


def load_plugins() -> list[str]:
    """Import every module the installed packages name in the ``dew.plugins`` entry-point group
    (once per process) and return their names. ``DEW_NO_PLUGINS=1`` skips them.

    A plugin that fails to import raises naming the entry point and the distribution it comes
    from: a broken plugin is a broken environment, better reported than silently left out.
    """
    global _plugins_loaded
    if _plugins_loaded:
        return list(_plugin_modules)
    _plugins_loaded = True  # before importing: a plugin's own registrations read the registries
    if os.environ.get("DEW_NO_PLUGINS"):
        return []
    for point in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        try:
            importlib.import_module(point.value.split(":")[0])
        except Exception as err:
            where = f" (from {point.dist.name})" if point.dist is not None else ""
            raise ImportError(
                f"dew plugin {point.name!r} = {point.value!r}{where} failed to import: {type(err).__name__}: {err}"
            ) from err
        _plugin_modules.append(point.value.split(":")[0])
    return list(_plugin_modules)


_conf_dirs: dict[tuple[tuple[str, int], ...], list[str]] = {}


def plugin_conf_dirs() -> list[str]:
    """The ``conf/`` directory beside each plugin module's package, when it has one: Hydra searches
    them after dew's own ``conf/`` (``hydra_plugins.dew_launchers.search_path``), so a plugin's
    ``model/my_model.yaml`` is the option ``model=my_model``. Found without importing the plugin.

    Every Hydra start and every listing asks, and reading the entry points reads every installed
    distribution's metadata (~0.05 CPU-s): the answer is kept for the path it was read from, each
    of its directories as last modified (a distribution installed into one since changes it)."""
    import importlib.util

    if os.environ.get("DEW_NO_PLUGINS"):
        return []
    key = tuple((os.path.abspath(entry or "."), _modified(entry or ".")) for entry in sys.path)
    if key not in _conf_dirs:
        dirs: list[str] = []
        for point in importlib.metadata.entry_points(group=PLUGIN_GROUP):
            top = point.value.split(":")[0].split(".")[0]
            spec = importlib.util.find_spec(top)
            roots = list(spec.submodule_search_locations or []) if spec is not None else []
            for root in roots:
                conf = os.path.join(root, "conf")
                if os.path.isdir(conf) and conf not in dirs:
                    dirs.append(conf)
        _conf_dirs[key] = dirs
    return list(_conf_dirs[key])


def _modified(entry: str) -> int:
    try:
        return os.stat(entry).st_mtime_ns
    except OSError:
        return -1
