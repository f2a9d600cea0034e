"""Wrapping the module an objective trains before the run initialises it: quantized training
(``dew.training.adapters.quantization``) and LoRA (``dew.training.adapters.lora``), both with qwix. With neither set,
the module is returned as it is and every ``nnx.Param`` trains.

qwix wraps an NNX module by calling it once on sample inputs: that call finds the weight each matmul
reads and creates LoRA's factors next to it. ``adapt`` builds those inputs from the architecture's
``call_shapes`` (one example) and makes that one call walk a stack
of blocks (``dew.models.stack``) layer by layer in Python, so that the factors each layer creates land
in the stack, stacked on its ``depth`` axis. Every later call scans as usual.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx import spmd

from dew.contract.config import LoRA, Quantization, RunConfig
from dew.contract.models import Architecture, of
from dew.models import stack

if TYPE_CHECKING:
    from flax.nnx.filterlib import Filter

    from dew.objectives.base import Objective

_LAYERS = {nnx.PARTITION_NAME: "layers"}
"""The logical name of a stack's leading axis (``dew.models.stack``)."""

LORA_STREAM = 0x10AA
"""Folded into the run's seed for the draw of LoRA's ``A`` factors, apart from the base init."""


def build_model(run: RunConfig, objective: Objective) -> nnx.Module:
    """The module a run trains: the objective's, initialised from the run's seed, with the
    quantization and the adapters the run asks for. Training and ``dew-sample`` both build it here,
    so inference rebuilds exactly the module training saved."""
    t = run.trainer
    return adapt(
        of(run.model.architecture, run.model.fields()),
        objective.build(nnx.Rngs(params=t.seed)),
        quantization=t.quantization,
        lora=run.lora,
        seed=t.seed,
    )


INIT_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}
"""XLA options of the one program that initialises a model: it runs once, so compiling it fast is
what matters. Level 1 compiled a digits DiT's initialisation in 5.1 s against 9.5 s at XLA's
default, with every parameter the same bits as eager initialisation; level 0 took 3.3 s but moved
three normal-initialised leaves by one ulp (tests/training/test_adapt.py checks the bits)."""


def init_model(run: RunConfig, objective: Objective) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """``build_model``'s module as ``(graphdef, trainable state, the rest)``, initialised by one
    compiled program instead of op by op: eager initialisation dispatches every initialiser of every
    parameter separately, and took 11 s of a digits run's set-up on a loaded 2-core machine against
    5 s for the program. The parameters are the same bits either way.

    A module with adapters is built eagerly: qwix finds the weights by calling the module once, and
    the graph it leaves under tracing is not the one it leaves when called eagerly."""
    which = trainable(run.lora)
    if run.lora is not None or run.trainer.quantization is not None:
        # flax types split's parts as a variadic tuple; two filters give exactly three
        graphdef, params, rest = nnx.split(build_model(run, objective), which, ...)  # type: ignore[misc]
        return graphdef, params, rest
    # The graph is the one the traced build leaves (a second, abstract build for it cost ~0.1 CPU-s
    # of a tiny run's ~2.4).
    graphdefs: list[nnx.GraphDef] = []

    def initialised() -> tuple[nnx.State, nnx.State]:
        graphdef, *states = nnx.split(build_model(run, objective), which, ...)
        graphdefs.append(graphdef)
        return states[0], states[1]

    params, rest = jax.jit(initialised, compiler_options=INIT_COMPILER_OPTIONS)()
    return graphdefs[0], params, rest


def abstract_model(run: RunConfig, objective: Objective) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """``init_model``'s split with the trainable parameters as shapes (``jax.ShapeDtypeStruct``), for
    a start that reads every one of them from a source: none is initialised to be overwritten (a
    Hugging Face model's random initialisation is as large as the model). The rest of the module
    is concrete, computed by a program whose unused parameters XLA drops."""
    which = trainable(run.lora)
    graphdef, params, *others = nnx.split(nnx.eval_shape(lambda: build_model(run, objective)), which, ...)
    rest = others[0]
    if jax.tree.leaves(rest):
        rest = jax.jit(
            lambda: nnx.split(build_model(run, objective), which, ...)[-1], compiler_options=INIT_COMPILER_OPTIONS
        )()
    return graphdef, params, rest


def adapt(
    architecture: Architecture, module: nnx.Module, *, quantization: Quantization | None, lora: LoRA | None, seed: int
) -> nnx.Module:
    """``module`` (built by ``architecture``) with the quantized forward and/or the low-rank
    adapters the run asks for."""
    if quantization is None and lora is None:
        return module
    # heavy: qwix loads only for a run that quantizes or adapts
    from dew.training.adapters import lora as lora_lib
    from dew.training.adapters import quantization as quant

    inputs = sample_inputs(architecture)
    with _stacks_walked_in_python():
        if lora is None:
            assert quantization is not None  # one of the two is set (above)
            return quant.quantize(module, inputs, quantization)
        rngs = nnx.Rngs(params=jax.random.fold_in(jax.random.key(seed), LORA_STREAM))
        return lora_lib.apply(module, inputs, lora, quantization, rngs)


def trainable(lora: LoRA | None) -> Filter:
    """The nnx filter of the leaves the optimizer moves: every parameter, or only LoRA's factors."""
    return nnx.Param if lora is None else nnx.LoRAParam


def sample_inputs(architecture: Architecture) -> tuple[jax.Array, ...]:
    """Positional arguments of one call of the module on one example (``Architecture.call_shapes``);
    a sequence is one token long: the length shapes no parameter, and one token traces the same
    weights as a full window."""
    return tuple(jnp.zeros(shape, dtype) for shape, dtype in architecture.call_shapes(1, length=1))


@contextlib.contextmanager
def _stacks_walked_in_python() -> Iterator[None]:
    """Within: ``stack.run`` merges each layer of a stack in turn and calls it eagerly, then writes
    every variable a call created back into the stack, stacked on ``depth``; its random streams
    advance from layer to layer. (Under ``jax.lax.scan`` the created variables would be traced
    values of the scan, lost when it returns.)"""
    scanned = stack.run

    def walk[B: nnx.Module, C, Y](
        blocks: B, body: Callable[[B, C], tuple[C, Y]], carry: C, *, scan: bool, remat: str = "none"
    ) -> tuple[C, Y]:
        del scan, remat  # an eager walk that creates variables: no backward pass to rematerialise
        graphdef, rng_state, state = nnx.split(blocks, nnx.RngState, ...)  # type: ignore[misc]  # see init_model
        depth = jax.tree.leaves(state)[0].shape[0]
        layers, ys = [], []
        for i in range(depth):
            # Each layer's variables lose the stack's leading axis, in their logical names too, so
            # that the factors qwix creates take names from the layer's own weight (``_LAYERS``).
            layer_state = spmd.remove_axis(jax.tree.map(lambda x, i=i: x[i], state), 0, _LAYERS)
            layer = nnx.merge(graphdef, rng_state, layer_state)
            carry, y = body(layer, carry)
            rng_state = nnx.state(layer, nnx.RngState)
            layers.append(layer)
            ys.append(y)
        nnx.update(blocks, rng_state)
        before = {path for path, _ in nnx.to_flat_state(nnx.state(blocks))}
        states = [nnx.state(layer, nnx.Not(nnx.RngState)) for layer in layers]
        stacked = spmd.add_axis(jax.tree.map(lambda *xs: jnp.stack(xs), *states), 0, _LAYERS)
        for path, variable in nnx.to_flat_state(stacked):
            if path not in before:
                parent: Any = blocks  # a module, or a list or dict of them on the way down
                for key in path[:-1]:
                    parent = getattr(parent, key) if isinstance(key, str) else parent[key]
                name = path[-1]
                assert isinstance(name, str), path  # a variable is an attribute of its module
                setattr(parent, name, variable)
        return carry, jax.tree.map(lambda *xs: jnp.stack(xs), *ys)

    stack.run = walk
    try:
        yield
    finally:
        stack.run = scanned
