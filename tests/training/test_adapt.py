"""trainer.quantization and lora (dew.training.adapt): the quantized forward, straight-through
gradients, LoRA's factors and what stays frozen, on a tiny simple_dit, and tiny runs through
``RunConfig.train``."""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dew.build import build_run
from dew.config import LoRA, ModelConfig, Quantization, TrainerConfig
from dew.contract.data import datasets
from dew.models import architectures
from dew.models.dit import SimpleDiT
from dew.models.simple_dit import SimpleDiTFields
from dew.recipe import Recipe
from dew.training import adapt

FIELDS = SimpleDiTFields(
    input_size=8, in_channels=1, patch_size=2, hidden_size=32, depth=2, num_heads=2, num_classes=10
)


@functools.partial(nnx.jit, static_argnums=0)
def initialised(seed: int) -> SimpleDiT:
    return SimpleDiT(FIELDS, nnx.Rngs(params=seed))


def model(seed: int = 0) -> SimpleDiT:
    """A tiny DiT whose zero-initialised layers (adaLN-Zero) are nudged, so its output is not zero.
    Initialised by one compiled program and nudged with NumPy's draws: eager initialisation and
    nudging compile every op for every shape (4.6 CPU-s against 1.0)."""
    m = initialised(seed)
    for i, (_, param) in enumerate(nnx.to_flat_state(nnx.state(m, nnx.Param))):
        noise = np.random.default_rng(i).standard_normal(param.shape, np.float32)
        param[...] = jnp.asarray(np.asarray(param[...]) + np.float32(0.05) * noise)
    return m


def inputs(batch: int = 32) -> tuple[jax.Array, jax.Array, jax.Array]:
    # batch == hidden_size: qwix's shape fallback would take the timestep MLP's activation for a weight.
    x = jax.random.normal(jax.random.key(1), (batch, 8, 8, 1))
    return x, jax.random.uniform(jax.random.key(2), (batch,)), jnp.arange(batch, dtype=jnp.int32) % 10


def wrap(
    m: nnx.Module, quantization: Quantization | None = None, lora: LoRA | None = None, seed: int = 0
) -> nnx.Module:
    return adapt.adapt(architectures["simple_dit"](FIELDS), m, quantization=quantization, lora=lora, seed=seed)


def paths(state: nnx.State) -> list[str]:
    return ["/".join(map(str, p)) for p, _ in nnx.to_flat_state(state)]


def forward(m: nnx.Module, filter_: object = nnx.Param):
    """A jitted ``params -> output`` of ``m`` on ``inputs()``, as the trainer runs it."""
    graphdef, params, rest = nnx.split(m, filter_, ...)
    return jax.jit(lambda p: nnx.merge(graphdef, p, rest)(*inputs())), params


# ------------------------------------------------------------------------------- quantized training


@pytest.mark.slow
def test_quantized_forward_is_close_to_float_and_gradients_pass_straight_through():
    base = model()
    graphdef, params, rest = nnx.split(base, nnx.Param, ...)
    int8_graphdef, int8_params, int8_rest = nnx.split(wrap(base, Quantization()), nnx.Param, ...)
    # The wrap keeps the parameters: same paths, same values, same dtype.
    assert paths(params) == paths(int8_params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(int8_params)):
        assert a.dtype == b.dtype == jnp.float32 and np.array_equal(a, b)

    def output_and_grads(graphdef, rest):
        """The output and the gradient of mean(output**2), from one forward (a VJP)."""

        def both(p):
            out, vjp = jax.vjp(lambda p: nnx.merge(graphdef, p, rest)(*inputs()), p)
            return out, vjp(2 * out / out.size)[0]

        return jax.jit(both)

    out, g = jax.device_get(output_and_grads(graphdef, rest)(params))
    out_q, g_q = jax.device_get(output_and_grads(int8_graphdef, int8_rest)(params))
    err = float(np.abs(out_q - out).max() / np.abs(out).max())
    assert 0 < err < 0.05, err
    # Straight-through: every parameter that learns in float learns here, in nearly the same direction
    # (compared in NumPy: JAX would compile its norms and products for every leaf's shape).
    for path, a, b in zip(paths(g), jax.tree.leaves(g), jax.tree.leaves(g_q)):
        if float(np.linalg.norm(a)) > 1e-3:
            cos = float(np.vdot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
            assert cos > 0.95, (path, cos)


@pytest.mark.slow
def test_quantization_module_path_that_matches_nothing_is_refused():
    with pytest.raises(ValueError, match=r"trainer.quantization.module_path='nope/.\*' matches no module"):
        wrap(model(), Quantization(module_path="nope/.*"))


# -------------------------------------------------------------------------------------------- LoRA


@pytest.mark.slow
def test_lora_starts_at_the_base_model_and_trains_only_its_factors():
    base = model()
    base_fn, params = forward(base)
    adapted = wrap(base, lora=LoRA(rank=4, alpha=8.0, targets=("blocks/.*", "final_layer/linear")))
    lora_fn, factors = forward(adapted, adapt.trainable(LoRA()))
    # B = 0: the delta is exactly zero (the two programs fuse differently, hence float rounding).
    np.testing.assert_allclose(lora_fn(factors), base_fn(params), rtol=0, atol=1e-6)
    names = paths(factors)
    assert names and all(n.endswith(("_lora_a", "_lora_b")) for n in names)
    assert "blocks/attn/q/kernel_lora_a" in names and "final_layer/linear/kernel_lora_b" in names
    assert not any(n.startswith(("t_embedder", "x_embedder", "final_layer/adaLN")) for n in names)
    flat = dict(zip(names, jax.tree.leaves(factors)))
    assert flat["blocks/mlp_in/kernel_lora_a"].shape == (2, 32, 4)  # stacked on depth like the weight
    assert flat["blocks/mlp_in/kernel_lora_b"].shape == (2, 4, 128)
    assert all(not np.any(v) for n, v in flat.items() if n.endswith("_lora_b"))
    a = flat["blocks/mlp_in/kernel_lora_a"]
    assert np.any(a) and not np.array_equal(a[0], a[1])  # each layer draws its own A
    # The frozen part is what the seed initialised, and the factors follow from the seed too.
    again = nnx.state(wrap(model(), lora=LoRA(rank=4, targets=("blocks/.*",))), nnx.LoRAParam)
    assert np.array_equal(dict(zip(paths(again), jax.tree.leaves(again)))["blocks/mlp_in/kernel_lora_a"], a)
    frozen = nnx.state(adapted, nnx.Not(nnx.LoRAParam))
    assert paths(frozen) == paths(params)
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(frozen), jax.tree.leaves(params)))


@pytest.mark.slow
def test_lora_steps_move_the_factors_and_lower_the_loss():
    graphdef, factors, rest = nnx.split(wrap(model(), lora=LoRA(rank=4)), nnx.LoRAParam, ...)
    x, t, y = inputs()
    target = jnp.zeros_like(x)

    def loss(p):
        return jnp.mean((nnx.merge(graphdef, p, rest)(x, t, y) - target) ** 2)

    tx = optax.adam(1e-2)

    @jax.jit
    def step(p, opt):
        value, grads = jax.value_and_grad(loss)(p)
        updates, opt = tx.update(grads, opt, p)
        return optax.apply_updates(p, updates), opt, value

    p, opt = factors, tx.init(factors)
    values = []
    for _ in range(5):
        p, opt, value = step(p, opt)
        values.append(float(value))
    assert values[-1] < values[0]
    assert all(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(factors)))


@pytest.mark.slow
def test_lora_target_that_matches_nothing_is_named():
    with pytest.raises(ValueError, match=r"lora.targets pattern 'decoder/.\*' matches no module"):
        wrap(model(), lora=LoRA(targets=("blocks/.*", "decoder/.*")))


def tiny_run(tmp: Path, quantization: Quantization | None, lora: LoRA | None) -> tuple:
    run = Recipe(
        model=ModelConfig(
            architecture="simple_dit", config=dict(depth=1, hidden_size=32, num_heads=2), dtype="float32"
        ),
        data=datasets["digits"](),
        trainer=TrainerConfig(
            name="tiny",
            checkpoint_dir=str(tmp / "ck"),
            batch_size=32,
            steps=4,
            log_every=1,
            eval_every=None,
            checkpoint_every=None,
            compilation_cache_dir=None,
            quantization=quantization,
        ),
        lora=lora,
    )
    run, objective, dataset = build_run(run)
    batch = {k: jnp.asarray(v) for k, v in dataset.iterator().next().items()}
    key = jax.random.key(7)

    @functools.partial(jax.jit, static_argnums=0)
    def compiled_loss(graphdef: nnx.GraphDef, state: nnx.State) -> jax.Array:
        out = objective.loss(nnx.merge(graphdef, state), batch, key)
        return out.total / out.count

    # The loss as one compiled program (run op by op it compiled ~95 programs, 5.7 CPU-s against
    # 2.4), and the same program for both models: the trained values go into a split of the initial
    # module, as fresh arrays on one device like its own (the trained module's graphdef lists its
    # variables' metadata in another order, and its arrays are placed on the run's mesh: either
    # traced and compiled the loss a second time).
    initial = adapt.build_model(run, objective)
    graphdef, values = nnx.split(initial)
    before = float(compiled_loss(graphdef, values))
    state = run.train(objective, dataset, name="tiny")
    trained = nnx.split(initial)[1]  # a fresh State: replacing its values leaves ``initial`` as it is
    fresh = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), nnx.to_pure_dict(nnx.state(state.model())))
    nnx.replace_by_pure_dict(trained, fresh)
    after = float(compiled_loss(graphdef, trained))
    return state, initial, before, after, tmp / "ck" / "tiny"


def saved_params(run_dir: Path) -> list[str]:
    import orbax.checkpoint as ocp

    step = max(int(p.name) for p in run_dir.iterdir() if p.name.isdigit())
    restored = ocp.StandardCheckpointer().restore(run_dir / str(step) / "state")
    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(restored["params"])[0]]


@pytest.mark.slow
def test_quantized_run_learns(tmp_path):
    state, initial, before, after, _ = tiny_run(tmp_path, Quantization(), None)
    assert after < before
    assert paths(state.params) == paths(nnx.state(initial, nnx.Param))


@pytest.mark.slow
def test_qlora_run_moves_only_the_factors(tmp_path):
    state, initial, before, after, run_dir = tiny_run(tmp_path, Quantization(), LoRA(rank=4, alpha=8.0))
    assert after < before
    names = paths(state.params)
    assert names and all(n.endswith(("_lora_a", "_lora_b")) for n in names)
    factors = nnx.state(initial, nnx.LoRAParam)
    moved = [
        n for n, a, b in zip(names, jax.tree.leaves(state.params), jax.tree.leaves(factors)) if not np.array_equal(a, b)
    ]
    assert any(n.endswith("_lora_b") for n in moved)
    # The frozen base is bit for bit what the seed initialised; the checkpoint holds only the factors.
    trained = state.model()
    base_before = nnx.state(initial, nnx.Not(nnx.LoRAParam))
    base_after = nnx.state(trained, nnx.Not(nnx.LoRAParam))
    assert paths(base_after) == paths(base_before)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(base_after), jax.tree.leaves(base_before)))
    saved = saved_params(run_dir)
    assert saved and all(s.replace("['value']", "").endswith(("_lora_a']", "_lora_b']")) for s in saved), saved


INIT_CHECK = """
import sys, jax, numpy as np
from flax import nnx
from dew.build import build_run
from dew.config import ModelConfig, TrainerConfig
from dew.contract.data import datasets
from dew.recipe import Recipe
from dew.training import adapt
for arch, data, path in zip(*[iter(sys.argv[1:])] * 3):
    model = ModelConfig(architecture=arch, config=dict(depth=1, hidden_size=32, num_heads=2), dtype="float32")
    run = Recipe(model=model,
                 data=datasets[data](**({"path": path, "seq_len": 16} if path else {})),
                 trainer=TrainerConfig(batch_size=8, steps=2, compilation_cache_dir=None))
    run, objective, _ = build_run(run)
    graphdef, params, rest = adapt.init_model(run, objective)
    eager = nnx.split(adapt.build_model(run, objective), adapt.trainable(None), ...)
    same = [bool(np.array_equal(np.asarray(a), np.asarray(b)))
            for a, b in zip(jax.tree.leaves((params, rest)), jax.tree.leaves(eager[1:]), strict=True)]
    print(arch, graphdef == eager[0], sum(same), len(same))
"""


@pytest.mark.slow
def test_init_model_is_eager_initialisation_compiled(tmp_path):
    """One compiled program gives every leaf the same bits as building the module op by op, in a
    process with XLA's default flags (this one compiles unoptimised, tests/conftest.py): a DiT on
    digits and a transformer on text, both in one process (a process each paid its start twice,
    ~3 CPU-s)."""
    import subprocess
    import sys

    from tests.conftest import cli_env

    cases = [("simple_dit", "digits"), ("transformer", "text_stream")]
    args = [a for arch, data in cases for a in (arch, data, _text(tmp_path, data).get("path", ""))]
    out = subprocess.run(
        [sys.executable, "-c", INIT_CHECK, *args],
        env=cli_env(unoptimised=False),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines() if line.split()[:1]}
    for arch, _ in cases:
        same_graph, same, leaves = lines[arch]
        assert same_graph == "True" and same == leaves and int(leaves) > 5, out.stdout


def _text(tmp: Path, data: str) -> dict:
    """A UTF-8 file for text_stream (its byte tokenizer needs no vocabulary file)."""
    if data != "text_stream":
        return {}
    (tmp / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 40)
    return {"path": str(tmp / "a.txt"), "seq_len": 16}
