"""dew's configuration as Hydra reads it, for every command and launcher that composes one:
where conf/ and launch/ are (in the repository, or inside an installed wheel), the structured
schemas and resolvers ``register_configs`` puts in Hydra's ConfigStore, and the listings of the
config groups ``--help`` and ``--hydra-help`` print.

Below the commands (``dew.cli``), the inference commands' composition (``dew.inference``) and the
launchers (``dew.launching``), which all compose dew's config; of dew it imports the contract, the
schemas beside it and the names of a sweep's directories (``dew.launching.naming``).
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from dew import compat
from dew.commandline.schema import member_schema, register_resolvers, schema_of
from dew.contract.data import datasets
from dew.contract.registry import plugin_conf_dirs
from dew.contract.schedules import schedules
from dew.contract.trackers import trackers as tracker_classes
from dew.launching.naming import job_dirname, sweep_name
from dew.recipe import Recipe


def conf_dir() -> str:
    """conf/ at the repository root (editable install), or the copy inside an installed wheel."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "config.yaml").exists():
            return str(candidate)
    raise FileNotFoundError(f"dew's conf/ directory is missing beside {here}")


def launch_dir() -> str:
    """launch/ (the launcher profiles) at the repository root, or the copy inside an installed
    wheel; conf/config.yaml puts it on Hydra's search path, so ``hydra/launcher=slurm`` needs no
    flag and nothing is copied per user."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "launch", here.parent / "launch"):
        if (candidate / "hydra" / "launcher").is_dir():
            return str(candidate)
    raise FileNotFoundError(f"dew's launch/ directory is missing beside {here}")


_registered: tuple[object, ...] | None = None
"""What the last ``register_configs`` stored: the store and the registries' members."""


def register_configs() -> None:
    """Put the structured schemas, derived from the dataclasses, in Hydra's ConfigStore: once for
    each set of registered datasets, schedules and trackers (a plugin loaded since stores again).
    The schemas are ~0.07 CPU-s of every command's start, and the launchers, the inference commands
    and the tests' own compositions register them again in one process. Every composition of dew's
    config comes here first, so this is also where Hydra's compositions are made cheaper, once per
    process (``compat.hydra_compositions_read_once``)."""
    global _registered
    compat.hydra_compositions_read_once()
    cs = ConfigStore.instance()
    members = (id(cs), *datasets.items(), *schedules.items(), *tracker_classes.items())
    if members == _registered:
        return
    cs.store(name="dew_run", node=schema_of(Recipe))
    # The ignores below: typeshed's lru_cache takes a Hashable, and mypy checks a class object
    # against its instances' __hash__; a class is hashable.
    for name, data_cls in datasets.items():
        cs.store(group="schema/data", name=name, node=member_schema(data_cls))  # type: ignore[arg-type]
    for name, schedule_cls in schedules.items():
        cs.store(group="schema/schedule", name=name, node=member_schema(schedule_cls))  # type: ignore[arg-type]
    # A tracker's options, for a plugin's conf/trainer/trackers/<name>.yaml to type them with.
    for name, tracker_cls in tracker_classes.items():
        cs.store(group="schema/tracker", name=name, node=schema_of(tracker_cls.Options))
    register_resolvers()
    OmegaConf.register_new_resolver("dew_groups", group_listing, replace=True)
    OmegaConf.register_new_resolver("dew_hydra_groups", hydra_group_listing, replace=True)
    OmegaConf.register_new_resolver("dew_sweep", sweep_name, replace=True)
    OmegaConf.register_new_resolver("dew_job", job_dirname, replace=True)
    OmegaConf.register_new_resolver("dew_launch_dir", lambda: Path(launch_dir()).as_uri(), replace=True)
    _registered = members


def group_listing() -> str:
    """The user's config groups and their options, dew's and its plugins', for --help (Hydra's own
    listing also shows the schema groups, which are dew's plumbing, not choices)."""
    groups: dict[str, set[str]] = {}
    for root in [Path(conf_dir()), *map(Path, plugin_conf_dirs())]:
        for folder in (p for p in root.rglob("*") if p.is_dir() and p.relative_to(root).parts[0] != "hydra"):
            options = {f.stem for f in folder.glob("*.yaml")}
            if options:
                groups.setdefault(folder.relative_to(root).as_posix(), set()).update(options)
    return "\n".join(f"{group}: {', '.join(sorted(options))}" for group, options in sorted(groups.items()))


def hydra_group_listing() -> str:
    """Hydra's own config groups and their options, for --hydra-help, by the names the docs use:
    the launchers are dew's profiles in launch/ (``dew_basic``, ``local``, ``slurm``), not the
    ConfigStore nodes Hydra's listing shows (``dew_slurm_schema``, ``submitit_local``, ...), which
    those extend. "(default)" marks what dew-train runs with (conf/config.yaml, else Hydra's own)."""
    from importlib.resources import files

    from hydra.conf import HydraConf
    from hydra.core.config_store import ConfigStore

    groups: dict[str, set[str]] = {}
    for root in (Path(str(files("hydra.conf"))) / "hydra", Path(conf_dir()) / "hydra"):
        for folder in (p for p in root.rglob("*") if p.is_dir()):
            if options := {f.stem for f in folder.glob("*.yaml")}:
                groups.setdefault(f"hydra/{folder.relative_to(root).as_posix()}", set()).update(options)
    groups["hydra/launcher"] = {f.stem for f in (Path(launch_dir()) / "hydra" / "launcher").glob("*.yaml")}
    for group in ("hydra/sweeper", "hydra/sweeper/sampler", "hydra/sweeper/pruner"):
        try:
            stored = ConfigStore.instance().list(group)
        except OSError:  # hydra/sweeper/pruner without the dew[search] extra
            stored = []
        groups[group] = groups.get(group, set()) | {n.removesuffix(".yaml") for n in stored if n.endswith(".yaml")}
    chosen = {f"hydra/{k}": v for entry in HydraConf().defaults if isinstance(entry, dict) for k, v in entry.items()}
    for entry in OmegaConf.load(Path(conf_dir()) / "config.yaml").defaults:
        for key, value in entry.items() if isinstance(entry, DictConfig) else ():
            if isinstance(key, str) and key.startswith("override hydra/"):
                chosen[key.removeprefix("override ")] = value

    def shown(group: str, option: str) -> str:
        return f"{option} (default)" if chosen.get(group) == option else option

    return "\n".join(f"{g}: {', '.join(shown(g, o) for o in sorted(options))}" for g, options in sorted(groups.items()))


def config_roots() -> list[Path]:
    """Where the config groups' options are: dew's conf/, its plugins', and launch/ (the launchers)."""
    return [Path(conf_dir()), *map(Path, plugin_conf_dirs()), Path(launch_dir())]
