"""``dew-train``: the single Hydra entry point.

Hydra composes the config from conf/ and the command line; it is converted once into the typed
``Recipe``; the dataset and the objective it names are built; ``RunConfig.train`` runs it. A bad
input ends with one message naming the field and what is allowed, a non-zero exit status, and
nothing written (Hydra itself writes nothing: see conf/config.yaml).
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from dew.cli.schema import member_schema, register_resolvers, schema_of
from dew.data.specs import datasets
from dew.recipe import Recipe
from dew.training.schedules import schedules
from dew.typed import ConfigError

log = logging.getLogger("dew")

EXIT_BAD_INPUT = 2


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


def register_configs() -> None:
    """Put the structured schemas, derived from the dataclasses, in Hydra's ConfigStore."""
    cs = ConfigStore.instance()
    cs.store(name="dew_run", node=schema_of(Recipe))
    for name, cls in datasets.items():
        cs.store(group="schema/data", name=name, node=member_schema(cls))
    for name, cls in schedules.items():
        cs.store(group="schema/schedule", name=name, node=member_schema(cls))
    register_resolvers()
    OmegaConf.register_new_resolver("dew_groups", _group_listing, replace=True)
    OmegaConf.register_new_resolver("dew_sweep", _sweep_name, use_cache=True, replace=True)
    OmegaConf.register_new_resolver("dew_job", _job_dirname, replace=True)
    OmegaConf.register_new_resolver("dew_launch_dir", lambda: Path(launch_dir()).as_uri(), replace=True)


def _group_listing() -> str:
    """The user's config groups and their options, for --help (Hydra's own listing also shows the
    schema groups, which are dew's plumbing, not choices)."""
    root = Path(conf_dir())
    lines = []
    for folder in sorted(p for p in root.rglob("*") if p.is_dir() and not p.relative_to(root).parts[0] == "hydra"):
        options = sorted(f.stem for f in folder.glob("*.yaml"))
        if options:
            lines.append(f"{folder.relative_to(root).as_posix()}: {', '.join(options)}")
    return "\n".join(lines)


_STAMP = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")


def _sweep_name(name: str | None, checkpoint_dir: str) -> str:
    """A sweep's directory under checkpoint_dir: the run name, else one named by the command line
    that started the sweep, so that the same command launched again finds the same directory,
    resumes its unfinished jobs and leaves its finished ones as they are (a time stamp would start
    the sweep over). Resolved once, in the launching process: the resolver's cache hands the value
    to every job, submitit's included (Hydra copies it into each job's config)."""
    del checkpoint_dir  # kept in the signature: the cache key every job's config shares
    if name:
        return name
    words = sorted(a for a in sys.argv[1:] if a not in ("-m", "--multirun"))
    return f"sweep-{hashlib.sha1(chr(10).join(words).encode()).hexdigest()[:10]}"


def _job_dirname(num: Any, overrides: str) -> str:
    """A sweep job's directory: its number and its overrides, made safe as one path component."""
    safe = re.sub(r"[^A-Za-z0-9_.,=+-]", "_", str(overrides))[:120]
    return f"{num}-{safe}" if safe else str(num)


def run_name(recipe: Recipe) -> str:
    """The run's directory under checkpoint_dir: trainer.name, or the sweep job's, or the time."""
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        return os.path.relpath(hc.runtime.output_dir, recipe.trainer.checkpoint_dir)
    if recipe.trainer.name:
        return recipe.trainer.name
    return f"run-{_STAMP}"


def fail(message: str) -> None:
    print(f"dew-train: error: {message}", file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def train_from_hydra(cfg: DictConfig) -> Any:
    """Convert the composed config once, build what it names, and train."""
    from dew.training.rundir import RunDirError, prepare_run_dir, write_hydra_record

    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    job_dir = Path(HydraConfig.get().runtime.output_dir)
    error, agreed = None, False
    try:
        container = OmegaConf.to_container(cfg, resolve=True)
        recipe = Recipe.from_dict(container)
        from dew.build import build_run
        from dew.training.process import from_process_zero, prepare_process

        prepare_process(recipe.trainer)  # XLA flags and the process pool, before any backend opens
        # One run however many processes: each resolved its own config and name (a time stamp
        # can differ by a second), so all take process 0's.
        container, name = from_process_zero("run", [container, run_name(recipe)])
        agreed = True
        recipe = Recipe.from_dict(container)

        import jax

        from dew.training.trainer import check

        recipe, objective, dataset = build_run(recipe)
        check(recipe, objective, dataset)
        run_dir = prepare_run_dir(recipe, name, write=jax.process_index() == 0)
    except (ConfigError, ValueError, OSError, RunDirError) as err:  # OSError: missing files, no network
        error = str(err)
    if agreed:  # in a pool, a process that is fine stops with process 0's error
        error = error or from_process_zero("verdict", error)
    if error:
        if multirun and job_dir.is_dir() and not any(job_dir.iterdir()):
            job_dir.rmdir()  # Hydra made the job's directory; leave no trace of a bad job
        fail(error)
    is_main = jax.process_index() == 0
    if is_main:
        write_hydra_record(run_dir, cfg)
    from dew.training.preemption import Preempted

    try:
        state = recipe.train(objective, dataset, name=name, summary=objective.summary())
    except Preempted as stopped:
        print(f"dew-train: run {name!r}: {stopped}", file=sys.stderr, flush=True)
        from dew.cli.launchers import exit_after_stop

        exit_after_stop(stopped.signum)
    if hasattr(objective, "sample_grid") or hasattr(objective, "sample_text"):
        from dew.sampling import write_sample_grid, write_text_samples

        model = state.model(ema=state.ema is not None)
        if jax.process_count() > 1:
            model = _gathered(model)  # every process takes part; process 0 samples alone
        if is_main:
            write = write_sample_grid if hasattr(objective, "sample_grid") else write_text_samples
            samples = write(objective, model, run_dir, seed=recipe.trainer.seed)
            print(f"dew-train: samples in {samples}", flush=True)
    if is_main:
        print(f"dew-train: run {name!r} is in {run_dir}", flush=True)
    return state


def _gathered(model: Any) -> Any:
    """``model`` with every array whole in this process (a collective: every process calls it), so
    that one process can sample from it alone."""
    import jax
    from flax import nnx
    from jax.experimental import multihost_utils

    graphdef, state = nnx.split(model)
    state = jax.tree.map(lambda x: multihost_utils.process_allgather(x, tiled=True)
                         if isinstance(x, jax.Array) else x, state)
    return nnx.merge(graphdef, state)


def main() -> None:
    register_configs()
    hydra.main(version_base="1.3", config_path=conf_dir(), config_name="config")(train_from_hydra)()


if __name__ == "__main__":
    main()
