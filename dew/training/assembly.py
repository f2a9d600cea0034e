"""A run assembled on its devices, in one place: the mesh, the batch's layout and its checks, the
state laid out on the mesh (from the model's initialisation, ``trainer.init_from``'s warm start, or
a checkpoint read into it afterwards), and the compiled train step and evaluation.

Training (``dew.training.trainer``), the set-up's and a launcher's checks before anything starts
(``dew.training.setup``), and ``dew-eval`` (``dew.inference.evaluating``) each ask this module for
what they need, so a run is laid out and compiled the same way wherever it is rebuilt: a program
the trainer compiled is the one ``dew-eval`` loads from the compilation cache, and a layout the
set-up accepted is the one the loop runs. Nothing else in dew makes a mesh, a batch sharding or a
compiled step (tests/test_layers.py checks it); ``dew.training.sharding`` says how each is laid out,
``dew.training.step`` what a step computes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from dew.contract.config import RunConfig, TrainerConfig
from dew.objectives import continuations
from dew.objectives.base import Metric, Objective
from dew.training import adapt, sharding
from dew.training.checkpointing import warmstart
from dew.training.evaluate import Sums
from dew.training.optim.build import Optimizer
from dew.training.step import TrainState, make_eval_step, make_train_step

if TYPE_CHECKING:
    from etils import epath

COMPILER_OPTIONS: dict[str, Any] = {}
"""XLA options the step and the evaluation compile with; empty keeps XLA's defaults (and whatever
``XLA_FLAGS`` sets). Options here are part of the compilation cache's key: a program compiled with
them is not the entry of the same program compiled without, even where both name the same level.
(dew's tests lower the CPU backend's optimisation level through ``XLA_FLAGS`` instead, so that the
tests' own runs and the commands they start share the cache's entries.)"""


# ------------------------------------------------------------------------------ the mesh and the batch


def mesh_of(t: TrainerConfig) -> Mesh:
    """``trainer.mesh`` over this process pool's devices."""
    return sharding.make_mesh(t)


def planned_mesh(t: TrainerConfig, device_count: int) -> AbstractMesh:
    """``trainer.mesh`` over ``device_count`` devices that are not there yet: a launcher's check and
    ``dew-plan``'s, before the processes exist."""
    return sharding.abstract_mesh(t, device_count)


def batch_sharding(mesh: Mesh, t: TrainerConfig) -> NamedSharding:
    """How a global batch lies on ``mesh``: its rows split over ``trainer.layout``'s batch axes."""
    return sharding.batch_sharding(mesh, t.layout)


def check_batches(
    t: TrainerConfig,
    mesh: Mesh | AbstractMesh,
    batches: Sequence[tuple[int, str]],
    *,
    process_count: int | None = None,
    accumulation: int | None = None,
) -> None:
    """Refuse a batch (each ``(size, field)``: the field named in the message) whose part a step
    computes at once (the batch over ``accumulation``, ``trainer.accumulation`` by default: 1 for an
    evaluation) does not divide over the mesh's batch axes, or one whose rows would sit on two
    processes' devices (each process feeds its own records); for an abstract mesh (a launcher's
    check), the rows the job's ``process_count`` processes would share."""
    shared_over = None
    if not isinstance(mesh, Mesh) and process_count:
        shared_over = sharding.shared_rows_over(mesh, t.layout, process_count)
    for batch, field in batches:
        sharding.check_batch(batch // (accumulation or t.accumulation), mesh, t.layout, field=field)
        if isinstance(mesh, Mesh):
            problem = sharding.shared_rows(sharding.batch_sharding(mesh, t.layout), batch)
        else:
            problem = shared_over
        if problem:
            raise ValueError(problem)


def global_batch(batch: Mapping[str, np.ndarray], batch_sharding: NamedSharding) -> dict[str, jax.Array]:
    """This process's rows of a batch, placed as one global array per key."""
    if jax.process_count() == 1:
        return jax.device_put(dict(batch), batch_sharding)
    return {k: jax.make_array_from_process_local_data(batch_sharding, np.asarray(v)) for k, v in batch.items()}


# ------------------------------------------------------------------------------ the parameters


def initial_params(
    run: RunConfig, objective: Objective, mesh: Mesh, *, resuming: bool, run_dir: epath.Path | str | None = None
) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """(graph, parameters, the rest of the module) of the run's model as its initialisation makes
    them, with ``trainer.init_from``'s weights loaded onto ``mesh`` for a run that is not
    ``resuming`` (a warm start; a LoRA run's base on every start)."""
    t = run.trainer
    if t.init_from is not None and run.lora is None and not resuming and not t.init_skip:
        # every parameter comes from the source: its shapes are the target, none is initialised
        graphdef, params, rest = adapt.abstract_model(run, objective)
    else:
        graphdef, params, rest = adapt.init_model(run, objective)
    params, rest = warmstart.load(run, params, rest, mesh, resuming=resuming, run_dir=run_dir)
    return graphdef, params, rest


def param_shardings(params: nnx.State, mesh: Mesh, t: TrainerConfig) -> Any:
    """Each parameter's ``NamedSharding`` on ``mesh``: the layout the trainer gives it (its logical
    axes under ``trainer.layout``), for ``params`` or their abstract shapes."""
    specs = sharding.param_specs(params, mesh, t.layout)
    shapes = {"/".join(map(str, p)): tuple(v.shape) for p, v in nnx.to_flat_state(params)}
    return jax.tree.map(
        lambda spec: NamedSharding(mesh, spec),
        sharding.follow_params(params, specs, shapes),
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )


def laid_out(abstract_params: nnx.State, mesh: Mesh, t: TrainerConfig) -> Any:
    """``abstract_params`` as shapes placed on ``mesh`` (``param_shardings``): what a checkpoint is
    read into, each shard onto its devices."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        abstract_params,
        param_shardings(abstract_params, mesh, t),
    )


# ------------------------------------------------------------------------------ the compiled steps


def compile_eval_step(
    objective: Objective,
    graphdef: nnx.GraphDef,
    rest: nnx.State,
    metrics: Sequence[Metric],
    t: TrainerConfig,
    mesh: Mesh,
    params_sharding: object,
    batch_sharding: NamedSharding,
) -> Callable[[nnx.State, dict[str, jax.Array], jax.Array], Sums]:
    """The evaluation of one batch (``make_eval_step``), jitted over the mesh with the parameters laid
    out as ``params_sharding`` says: what the trainer's ``Evaluator`` calls, and ``dew-eval``'s."""
    return jax.jit(
        sharding.under_rules(mesh, t.layout, make_eval_step(objective, graphdef, rest, metrics)),
        in_shardings=(params_sharding, batch_sharding, None),
        compiler_options=COMPILER_OPTIONS or None,
    )


def compile_scorer(
    graphdef: nnx.GraphDef,
    rest: nnx.State,
    t: TrainerConfig,
    mesh: Mesh,
    params_sharding: object,
    batch_sharding: NamedSharding,
) -> Callable[[nnx.State, dict[str, jax.Array]], tuple[jax.Array, jax.Array]]:
    """A downstream task's rows scored (``dew.objectives.continuations.loglikelihoods``), jitted over
    the mesh with the parameters laid out as ``params_sharding`` says (the evaluation's layout); the
    scores come back whole on every process. One program per row length (``trainer.evals``)."""

    def score(params: nnx.State, rows: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        return continuations.loglikelihoods(nnx.merge(graphdef, params, rest), rows)

    whole = NamedSharding(mesh, PartitionSpec())
    return jax.jit(
        sharding.under_rules(mesh, t.layout, score),
        in_shardings=(params_sharding, batch_sharding),
        out_shardings=(whole, whole),
        compiler_options=COMPILER_OPTIONS or None,
    )


def compile_train_step(
    objective: Objective,
    optimizer: Optimizer,
    t: TrainerConfig,
    mesh: Mesh,
    state_sharding: TrainState,
    batch_sharding: NamedSharding,
) -> Callable[..., tuple[TrainState, dict]]:
    """The train step, jitted over the mesh with the state donated; traced under the layout's rules,
    so the models' activation constraints (dew.models.axes) apply. ``train_step(state, batch,
    dynamics=True)`` runs the step's second program, which also reports the training dynamics
    (``trainer.dynamics_every``): each program is compiled on its first call and cached, so the
    steps that do not report them run the program that computes none of them."""
    graphdef, rest = state_sharding.graphdef, state_sharding.rest

    def step(
        state: TrainState, batch: Mapping[str, jax.Array], inputs: Mapping[str, jax.Array], dynamics: bool
    ) -> tuple[TrainState, dict]:
        o = optimizer.rebuild(inputs) if inputs and optimizer.rebuild is not None else optimizer
        return make_train_step(
            objective,
            graphdef,
            rest,
            o.tx,
            o.learning_rate,
            accumulation=t.accumulation,
            dynamic_scale=t.dynamic_scale,
            extra_args=o.extra_args,
            dynamics=dynamics,
        )(state, batch)

    # Two programs, not one with a lax.cond: bench/dynamics.py times both; on shared CPU cores a
    # reporting step costs what a plain one does (0.97-1.00x) and the cond compiles slower without
    # running faster (docs/performance.md, "Training dynamics").
    compiled = jax.jit(
        sharding.under_rules(mesh, t.layout, step),
        in_shardings=(state_sharding, batch_sharding, None),
        out_shardings=(state_sharding, None),
        compiler_options=COMPILER_OPTIONS or None,
        donate_argnums=0,
        static_argnums=3,
    )
    # The optimizer's numbers are the program's inputs, not its constants (``Optimizer.inputs``):
    # runs that differ only in the rate, the warmup, their length or the weight decay compile one
    # program (the compilation cache then serves a sweep's every trial). On the devices once, not at
    # every call.
    inputs = {k: jnp.asarray(v) for k, v in optimizer.inputs.items()}

    def train_step(
        state: TrainState, batch: Mapping[str, jax.Array], *, dynamics: bool = False
    ) -> tuple[TrainState, dict]:
        return compiled(state, batch, inputs, dynamics)

    return train_step


# ------------------------------------------------------------------------------ a run for training


@dataclasses.dataclass
class Assembled:
    """A run on its devices, ready for its loop."""

    state: TrainState
    """The initial state laid out on the mesh (a new run's, or the one a checkpoint is read into)."""
    train_step: Callable[..., tuple[TrainState, dict]]
    """``(state, batch, *, dynamics=False) -> (state, metrics)`` (``compile_train_step``)."""
    eval_step: Callable[[nnx.State, dict[str, jax.Array], jax.Array], Sums]
    mesh: Mesh
    batch_sharding: NamedSharding

    def place(self, batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        """A batch of this process's rows, placed on the mesh (``global_batch``)."""
        return global_batch(batch, self.batch_sharding)


def assemble(
    run: RunConfig,
    objective: Objective,
    optimizer: Callable[[nnx.State], Optimizer],
    metrics: Sequence[Metric],
    *,
    run_dir: epath.Path,
    resuming: bool,
) -> Assembled:
    """The run on the mesh: its initial state (loaded from ``trainer.init_from`` for a new run),
    the compiled step (of the ``optimizer`` built for the parameters) and evaluation."""
    t = run.trainer
    mesh = mesh_of(t)
    graphdef, params, rest = initial_params(run, objective, mesh, resuming=resuming, run_dir=run_dir)
    built = optimizer(params)

    def init_state(params: nnx.State) -> TrainState:
        return TrainState.create(
            params, built.tx, seed=t.seed, ema=objective.ema_decay > 0, dynamic_scale=t.dynamic_scale
        )

    # One compiled program lays the whole state out on the mesh (not one eager op per leaf), each
    # leaf as the logical axes of its parameter and trainer.layout.rules say.
    state_sharding = sharding.state_sharding(jax.eval_shape(init_state, params), params, mesh, t.layout)
    state = jax.jit(init_state, out_shardings=state_sharding)(params).replace(graphdef=graphdef, rest=rest)
    state_sharding = state_sharding.replace(graphdef=graphdef, rest=rest)
    batches = sharding.batch_sharding(mesh, t.layout)
    return Assembled(
        state=state,
        train_step=compile_train_step(objective, built, t, mesh, state_sharding, batches),
        eval_step=compile_eval_step(objective, graphdef, rest, metrics, t, mesh, state_sharding.params, batches),
        mesh=mesh,
        batch_sharding=batches,
    )
