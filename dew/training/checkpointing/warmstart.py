"""Starting a run from trained parameters (``trainer.init_from``) instead of the seed's.

The source is a dew run directory (its latest intact step, found by ``Checkpoints.restore_intact``'s
walk), one of its steps (``<run>/<step>``), or a Hugging Face Llama, Qwen2, Qwen3 or Mistral directory
(or its hub name, from the local cache)
(``dew.training.checkpointing.hf_llama``, its files ``hf_weights``). Only parameters are read: the
optimizer state, the step, the data position and the schedule start fresh, and the EMA, which
``TrainState.create`` copies from the parameters, starts from the loaded ones.

Two moments:

- ``check`` (inside the trainer's ``check``, before ``dew-train`` writes anything) reads the source's
  record and the shapes it saved (the checkpoint's metadata, or the safetensors header) and refuses a
  different architecture, or any parameter whose shape differs, naming the parameter and both shapes.
  ``trainer.init_skip`` names the parameters that must differ (a new vocabulary, a new class count):
  they keep the seed's initialisation.
- ``load`` (in the trainer, between ``adapt.init_model`` and laying the state out) reads the values.
  The trainable parameters are restored by orbax straight into the run's layout (each leaf's
  ``NamedSharding`` on the run's mesh, every process reading its own shards), so a warm start works at
  any mesh and process count. With ``lora`` the loaded parameters are the frozen base, which the
  trainer holds outside the train state (``TrainState.rest``, closed over by the compiled step, as a
  seed-initialised base is): it is read whole on each process. A resume of a warm-started run takes
  its parameters from its own checkpoint, so ``load`` reads nothing then, except the LoRA base, which
  the run's checkpoints do not hold: that is read from the source step the run started from, which
  ``<run>/init_from.json`` (``PIN``) records.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from typing import TYPE_CHECKING, Any

import jax
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from dew.contract.config import RunConfig, RunRecord, hub_name
from dew.contract.rundir import RUN_RECORD, is_step
from dew.training import sharding
from dew.training.checkpointing import hf_config, hf_weights
from dew.training.checkpointing.checkpoints import Checkpoints

if TYPE_CHECKING:
    from flax.typing import PathParts

log = logging.getLogger("dew")

FIELD = "trainer.init_from"


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a warm start reads its parameters."""

    path: str
    """The run directory, or the Hugging Face directory."""
    kind: str
    """``run`` (a dew run directory) or ``hf`` (a Hugging Face Llama directory)."""
    step: int | None = None
    """The named step of a run; None is its latest intact step."""


def resolve(init_from: str) -> Source:
    """The source ``init_from`` names, or a ValueError that says what the path is not. A hub name
    (``owner/name``, no such path) is its snapshot in the local Hugging Face cache."""
    if hub_name(init_from):
        directory = hf_config.local_directory(init_from)
        assert directory is not None  # a hub name the cache lacks is refused there
        if not hf_weights.is_directory(directory):
            raise ValueError(f"{FIELD}={init_from!r}: the cached snapshot {directory} holds no config.json and weights")
        return Source(directory, "hf")
    path = init_from.rstrip("/")
    if os.path.isfile(os.path.join(path, RUN_RECORD)):
        return Source(path, "run")
    parent, leaf = os.path.split(path)
    if is_step(leaf) and os.path.isfile(os.path.join(parent, RUN_RECORD)):
        if not os.path.isdir(path):
            raise ValueError(
                f"{FIELD}={init_from!r}: the run {parent} holds no step {leaf} "
                f"(its steps: {', '.join(map(str, _steps(parent))) or 'none'})"
            )
        return Source(parent, "run", int(leaf))
    if hf_weights.is_directory(path):
        return Source(path, "hf")
    if not os.path.exists(path):
        raise ValueError(f"{FIELD}={init_from!r} does not exist")
    raise ValueError(
        f"{FIELD}={init_from!r} is neither a dew run directory (run.json), one of its steps "
        "(<run>/<step>) nor a Hugging Face directory (config.json and model.safetensors or "
        "model.safetensors.index.json) nor a hub name (owner/name)"
    )


def _steps(run_dir: str) -> list[int]:
    return sorted(int(n) for n in os.listdir(run_dir) if is_step(n))


BASE = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))
"""The nnx filter of the parameters a warm start loads: every parameter, LoRA's factors aside."""


def skipped(run: RunConfig, key: str) -> bool:
    """Whether the parameter at path ``key`` keeps the seed's initialisation (``trainer.init_skip``)."""
    return any(re.fullmatch(p, key) for p in run.trainer.init_skip)


def shapes_of(state: nnx.State) -> dict[str, tuple[int, ...]]:
    """Each leaf's path (``blocks/attn/q/kernel``) -> its shape."""
    return {"/".join(map(str, path)): tuple(v.shape) for path, v in nnx.to_flat_state(state)}


# ------------------------------------------------------------------------------------- the check


def check(run: RunConfig, abstract: nnx.Module) -> None:
    """Refuse a warm start whose source cannot give ``abstract``'s parameters (run ``run``'s module,
    shapes only), before anything is written. Does nothing without ``trainer.init_from``."""
    if run.trainer.init_from is None:
        return
    source = resolve(run.trainer.init_from)
    theirs = source_shapes(run, source)
    ours = shapes_of(nnx.state(abstract, BASE))
    for pattern in run.trainer.init_skip:
        if not any(re.fullmatch(pattern, k) for k in ours):
            raise ValueError(
                f"trainer.init_skip pattern {pattern!r} matches no parameter; the parameters: {', '.join(sorted(ours))}"
            )
    problems = []
    for key in sorted(set(ours) | set(theirs)):
        if skipped(run, key):
            continue
        if key not in theirs:
            problems.append(f"{key}: {ours[key]} here, absent from the source")
        elif key not in ours:
            problems.append(f"{key}: absent here, {theirs[key]} in the source")
        elif ours[key] != theirs[key]:
            problems.append(f"{key}: {ours[key]} here, {theirs[key]} in the source")
    if problems:
        raise ValueError(
            f"{FIELD}={run.trainer.init_from!r}: the source's parameters do not fit this model "
            "(parameter: shape here, shape in the source):\n  "
            + "\n  ".join(problems)
            + "\nLeave parameters that must differ freshly initialised with trainer.init_skip=[...]"
        )


def source_shapes(run: RunConfig, source: Source) -> dict[str, tuple[int, ...]]:
    """The source's parameter shapes by path, after checking its architecture against the run's."""
    if source.kind == "hf":
        return hf_weights.dew_shapes(run, source.path)
    record = RunRecord.read(source.path).values
    theirs = record.get("model", {}).get("architecture")
    if theirs != run.model.architecture:
        raise ValueError(
            f"{FIELD}={run.trainer.init_from!r}: the source is a {theirs!r} model, this run "
            f"builds {run.model.architecture!r}"
        )
    if record.get("lora") is not None:
        raise ValueError(
            f"{FIELD}={run.trainer.init_from!r}: the source is a LoRA run, whose checkpoints hold "
            "only its factors; merge it into a full model first (dew-export RUN --merge-lora "
            "--to OUT) and start from OUT"
        )
    steps = [source.step] if source.step is not None else sorted(_steps(source.path), reverse=True)
    if not steps:
        raise ValueError(f"{FIELD}={run.trainer.init_from!r}: the run holds no finished checkpoint")
    errors = []
    for step in steps:  # the newest step whose metadata reads; load walks the same way
        try:
            tree = ocp.PyTreeCheckpointer().metadata(os.path.join(source.path, str(step), "state")).item_metadata.tree
        except Exception as err:
            errors.append(f"step {step}: {type(err).__name__}: {err}")
            continue
        leaves = jax.tree_util.tree_flatten_with_path(tree["params"], is_leaf=lambda x: hasattr(x, "shape"))[0]
        # A saved nnx.Variable is a node whose one leaf is named "value".
        return {"/".join(_key(k) for k in path[:-1]): tuple(leaf.shape) for path, leaf in leaves}
    raise ValueError(f"{FIELD}={run.trainer.init_from!r}: no checkpoint of the source reads: " + "; ".join(errors))


def _key(entry: jax.tree_util.KeyEntry) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


# -------------------------------------------------------------------------------------- the load


class _ParamsOnly(Checkpoints):
    """A source run's checkpoints, read only, restoring the parameters alone (``restore`` is what
    ``restore_intact`` walks with); the optimizer state and the EMA stay on disk."""

    def __init__(self, directory: epath.Path) -> None:
        self.directory = directory
        self.manager = ocp.CheckpointManager(
            directory, options=ocp.CheckpointManagerOptions(read_only=True, create=False), item_names=("state", "meta")
        )

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """``abstract_state`` is a flat ``{path: ShapeDtypeStruct}``; so is what this returns."""
        target = {"params": _nested({p + ("value",): v for p, v in abstract_state.items()})}
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(
                    item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True
                )
            ),
        )
        flat = jax.tree_util.tree_flatten_with_path(restored.state["params"])[0]
        by_name = {tuple(_key(k) for k in path[:-1]): leaf for path, leaf in flat}
        return {p: by_name[tuple(map(str, p))] for p in abstract_state}, {}


PIN = "init_from.json"
"""The file in a warm-started run's directory that names the source step its parameters came from
(``{"source": ..., "step": ...}``), so that a resume and ``dew-sample`` of a LoRA run rebuild the
base from that step, not from whatever the source's latest step has become since."""


def load(
    run: RunConfig,
    params: nnx.State,
    rest: nnx.State,
    mesh: jax.sharding.Mesh | None,
    *,
    resuming: bool,
    run_dir: str | os.PathLike[str] | None = None,
) -> tuple[nnx.State, nnx.State]:
    """``(params, rest)`` of ``adapt.init_model`` with the source's parameters in place of the seed's
    (the trainable ones laid out on ``mesh`` as the run lays them out). Without ``trainer.init_from``,
    or on a resume of a run without LoRA, they are returned as they are. A fresh start writes
    ``PIN`` into ``run_dir`` (process 0); a resume reads the LoRA base from the step it names."""
    if run.trainer.init_from is None or (run.lora is None and resuming):
        return params, rest
    step = pinned_step(run_dir) if resuming and run_dir is not None else None
    if run.lora is None:
        params, used = _loaded(run, params, mesh, step)
    else:
        base, other = nnx.split_state(rest, BASE, ...)
        base, used = _loaded(run, base, None, step)
        rest = nnx.merge_state(base, other)
    if not resuming and run_dir is not None and jax.process_index() == 0:
        epath.Path(run_dir, PIN).write_text(json.dumps({"source": run.trainer.init_from, "step": used}) + "\n")
    return params, rest


def pinned_step(run_dir: str | os.PathLike[str]) -> int | None:
    """The source step ``PIN`` in ``run_dir`` names, None without one (or for a Hugging Face source)."""
    path = epath.Path(run_dir, PIN)
    return json.loads(path.read_text()).get("step") if path.exists() else None


def _loaded(
    run: RunConfig, state: nnx.State, mesh: jax.sharding.Mesh | None, step: int | None
) -> tuple[nnx.State, int | None]:
    """``state`` with every leaf not in ``trainer.init_skip`` read from the source (at ``step``, when
    given), and the step read: laid out over ``mesh`` as the run lays its parameters out, or, with no
    mesh, whole on this process's first device. The skipped leaves move to the same layout, so that
    the state is one kind of array throughout."""
    flat = dict(nnx.to_flat_state(state))
    where: dict[PathParts, jax.sharding.Sharding]
    if mesh is not None:
        specs = sharding.param_specs(state, mesh, run.trainer.layout)
        where = {p: jax.sharding.NamedSharding(mesh, specs["/".join(map(str, p))]) for p in flat}
    else:
        where = {p: jax.sharding.SingleDeviceSharding(jax.local_devices()[0]) for p in flat}
    wanted = {
        p: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=where[p])
        for p, v in flat.items()
        if not skipped(run, "/".join(map(str, p)))
    }
    values, used = _read(run, wanted, step)
    fresh = {p: v.get_value() for p, v in flat.items() if p not in wanted}
    if fresh:
        paths = list(fresh)
        moved = jax.jit(lambda xs: xs, out_shardings=[where[p] for p in paths])([fresh[p] for p in paths])
        values.update(zip(paths, moved, strict=True))
        log.info(
            "init_from: %s keep the seed's initialisation (trainer.init_skip)",
            ", ".join("/".join(map(str, p)) for p in fresh),
        )
    nnx.replace_by_pure_dict(state, _nested(values))
    return state, used


def _nested(flat: dict[PathParts, Any], into: dict[Any, Any] | None = None) -> dict[Any, Any]:
    """A flat ``{path: leaf}`` as nested dicts (into ``into`` when given)."""
    tree: dict[Any, Any] = {} if into is None else into
    for path, value in flat.items():
        node = tree
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = value
    return tree


def _read(
    run: RunConfig, target: dict[PathParts, jax.ShapeDtypeStruct], step: int | None
) -> tuple[dict[PathParts, jax.Array], int | None]:
    """The source's values for ``target``, a flat ``{path: ShapeDtypeStruct}`` whose leaves carry
    their sharding, and the step they are from (None for a Hugging Face directory). ``step`` (or the
    one ``init_from`` names) is read as it is; otherwise the newest step that restores."""
    assert run.trainer.init_from is not None  # load() reads nothing without one
    source = resolve(run.trainer.init_from)
    if source.kind == "hf":
        return hf_weights.read(run, source.path, target), None
    step = step if step is not None else source.step
    checkpoints = _ParamsOnly(epath.Path(source.path))
    try:
        if step is not None:
            values, _ = checkpoints.restore(step, target)
        else:
            step, values, _, _ = checkpoints.restore_intact(target, move_damaged=False)
    finally:
        checkpoints.close()
    log.info("init_from: parameters of %s at step %d", source.path, step)
    return values, step
