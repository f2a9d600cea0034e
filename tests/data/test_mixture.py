"""mixture: the realised shares against the weights, each source's rows in its own order, stages,
exact resume (on another process count too), evaluation per source, composition from Hydra and
the command line, bad input."""

import json

import numpy as np
import pytest

from dew.contract.data import eval_sources
from dew.data.mixture import component_seed, draw_sources
from dew.data.mixture_fields import MixtureComponent, MixtureStage
from dew.data.specs import HFText, Mixture, TextStream, TokenWindows, datasets
from dew.training.early_stopping import EarlyStoppingMetricError, check
from dew.training.evaluate import reported
from tests.cli.test_compose import compose_recipe

L = 8
VOCAB = 300
NAMES = ("web", "books", "code")


@pytest.fixture
def files(tmp_path):
    """One raw token file per source, each with ids of its own hundred (web 0-99, books 100-199,
    code 200-299): a row's first id names the source it came from."""
    rng = np.random.default_rng(0)
    paths = {}
    for k, name in enumerate(NAMES):
        paths[name] = tmp_path / f"{name}.bin"
        (rng.integers(0, 100, 40 * L + 1) + 100 * k).astype("<u2").tofile(paths[name])
    return paths


def mixture(files, weights=(0.5, 0.3, 0.2), stages=(), **fields):
    components = {
        name: MixtureComponent(w, TokenWindows(path=str(files[name]), seq_len=L, vocab_size=VOCAB, **fields))
        for name, w in zip(NAMES, weights)
    }
    return Mixture(components=components, stages=stages)


def source_of(tokens):
    return tokens[:, 0] // 100


def test_shares_follow_the_weights_over_10000_sequences(files):
    ds = mixture(files).load(batch_size=100, seed=3)
    assert datasets["mixture"] is Mixture and ds.num_records is None and ds.resumable
    assert ds.model_fields() == {"vocab_size": VOCAB, "seq_len": L}
    it = ds.iterator()
    seen = np.concatenate([source_of(it.next()["tokens"]) for _ in range(100)])
    shares = np.bincount(seen, minlength=3) / len(seen)
    np.testing.assert_allclose(shares, [0.5, 0.3, 0.2], atol=0.01)
    assert list(np.bincount(seen)) == [5000, 3000, 2000]  # grain's proportional selection: exact per period
    # Every batch holds each source's share to within one sequence; the rows' places move with the step.
    batches = seen.reshape(100, 100)
    assert all(abs(np.sum(b == 0) - 50) <= 1 and abs(np.sum(b == 2) - 20) <= 1 for b in batches)
    assert len({tuple(b[:10]) for b in batches}) > 50


def test_each_source_reads_its_own_stream_in_order(files):
    ds = mixture(files).load(batch_size=16, seed=0)
    it = ds.iterator()
    got = [it.next()["tokens"] for _ in range(30)]
    rows = np.concatenate(got)
    for k, name in enumerate(NAMES):
        own = ds.components[name].iterator()  # the component's own stream, from the seed it was given
        mine = rows[source_of(rows) == k]
        np.testing.assert_array_equal(mine, own.next(len(mine))["tokens"])
        assert ds.components[name].seed == component_seed(0, name) != component_seed(0, "other")
    # The sources of a batch are a function of the seed, the step and the position alone.
    again = draw_sources([0.5, 0.3, 0.2], seed=0, step=4, position=64, size=16)
    np.testing.assert_array_equal(again, source_of(got[4]))
    assert not np.array_equal(again, draw_sources([0.5, 0.3, 0.2], seed=1, step=4, position=64, size=16))


def test_stages_change_the_weights_from_their_step(files):
    stages = (MixtureStage(step=5, weights={"web": 0.0}), MixtureStage(step=10, weights={"code": 3.0}))
    spec = mixture(files, stages=stages)
    assert spec.weights_at(4) == {"web": 0.5, "books": 0.3, "code": 0.2}
    assert spec.weights_at(12) == {"web": 0.0, "books": 0.3, "code": 3.0}
    it = spec.load(batch_size=40, seed=1).iterator()
    counts = [np.bincount(source_of(it.next()["tokens"]), minlength=3) for _ in range(15)]
    assert all(c[0] == 0 for c in counts[5:])  # web off from step 5
    assert sum(c[2] for c in counts[10:]) == pytest.approx(5 * 40 * 3.0 / 3.3, abs=2)


@pytest.mark.slow  # the datasets library's import, for hf_text's stream
def test_resume_is_exact_on_any_process_count(files, tmp_path):
    for i in range(3):
        (tmp_path / f"doc{i}.txt").write_text(f"document {i} " * (10 + i))
    # A text stream (the byte tokenizer's 257 ids) beside two token files read at that vocabulary.
    components = {
        name: MixtureComponent(w, TokenWindows(path=str(files[name]), seq_len=L, vocab_size=257))
        for name, w in (("web", 0.5), ("books", 0.3))
    }
    components["text"] = MixtureComponent(0.4, TextStream(path=str(tmp_path / "doc*.txt"), seq_len=L))
    # hf_text's stream mode alone resumes on its own process count only; in a mixture, on any.
    records = "".join(json.dumps({"text": f"record {i} " * (i + 2)}) + "\n" for i in range(12))
    (tmp_path / "records.jsonl").write_text(records)
    components["records"] = MixtureComponent(
        0.3, HFText(path=str(tmp_path / "records.jsonl"), mode="stream", seq_len=L)
    )
    ds = Mixture(components=components).load(batch_size=8, seed=2)
    whole = ds.iterator()
    for size in (4, 8, 8):  # a batch ramp asks for each stage's size
        whole.next(batch_size=size)
    state = json.loads(json.dumps(whole.get_state()))
    assert (
        state["step"] == 3
        and state["position"] == 20
        and list(state["components"]) == ["web", "books", "text", "records"]
    )
    want = [whole.next()["tokens"] for _ in range(4)]
    fresh = ds.iterator()
    fresh.set_state(state)
    halves = [ds.iterator(p, 2) for p in (0, 1)]
    for half in halves:
        half.set_state(state)
    for w in want:
        np.testing.assert_array_equal(fresh.next()["tokens"], w)
        np.testing.assert_array_equal(np.concatenate([h.next()["tokens"] for h in halves]), w)
    other = Mixture(components={n: components[n] for n in ("web", "books")}).load(batch_size=8, seed=2).iterator()
    with pytest.raises(ValueError, match=r"components \['web', 'books', 'text', 'records'\] and this run's has"):
        other.set_state(state)


def test_held_out_data_per_source_and_over_all(files):
    spec = mixture(files, val_fraction=0.25)
    components = dict(spec.components)
    components["code"] = MixtureComponent(0.2, TokenWindows(path=str(files["code"]), seq_len=L, vocab_size=VOCAB))
    ds = Mixture(components=components).load(batch_size=4, seed=0)
    assert eval_sources(ds) == ("web", "books") and ds.num_eval_records == 20  # code holds nothing out
    per_source = {name: list(batches) for name, batches in ds.source_eval_batches().items()}
    assert [len(b) for b in per_source.values()] == [3, 3]  # 10 windows each, in padded batches of 4
    over_all = list(ds.eval_batches())
    for a, b in zip(over_all, per_source["web"] + per_source["books"], strict=True):
        np.testing.assert_array_equal(a["tokens"], b["tokens"])
    assert set(source_of(np.concatenate([b["tokens"] for b in per_source["books"]]))) == {1}
    assert eval_sources(TokenWindows(path=str(files["web"]), seq_len=L, vocab_size=VOCAB).load(4, 0)) == ()


def test_eval_per_source_is_a_value_early_stopping_may_watch():
    from dew.config import EarlyStopping, ModelConfig
    from dew.objectives.autoregressive import NextToken

    objective = NextToken(ModelConfig("transformer"), knobs=None, vocab_size=VOCAB, seq_len=L)
    values = reported(objective, [], ("web", "books"))
    assert {"eval/loss", "eval/web/loss", "eval/books/loss", "eval/books/perplexity"} <= set(values)
    check(EarlyStopping(metric="eval/web/loss"), objective, [], ("web", "books"))
    with pytest.raises(EarlyStoppingMetricError, match="'eval/code/loss' is not among"):
        check(EarlyStopping(metric="eval/code/loss"), objective, [], ("web", "books"))


def test_composes_from_the_option_and_the_command_line():
    recipe = compose_recipe(
        "data=mixture",
        "data.components.web.weight=0.6",
        "data.components.web.data.path=web.bin",
        "~data.components.wiki",
        "+schema/data@data.components.code.data=token_windows",
        "+data.components.code.weight=0.1",
        "data.components.code.data.seq_len=256",
        "data.stages=[{step: 100, weights: {code: 0.5}}]",
    )
    spec = recipe.data
    assert isinstance(spec, Mixture) and list(spec.components) == ["web", "books", "code"]
    assert spec.components["web"].weight == 0.6 and spec.components["web"].data.path == "web.bin"
    assert spec.components["books"].data.name == "text_stream" and spec.components["code"].data.name == "token_windows"
    assert spec.weights_at(100) == {"web": 0.6, "books": 0.3, "code": 0.5}
    assert recipe.model.architecture == "transformer"
    assert type(recipe).from_dict(recipe.to_dict()) == recipe


@pytest.mark.parametrize(
    "change, message",
    [
        ({"seq_len": 16}, r"data.components.books: seq_len=16 but data.components.web has seq_len=8"),
        ({"vocab_size": 400}, r"data.components.books: vocab_size=400 but data.components.web has vocab_size=300"),
        (
            {"path": "/nowhere/*.bin"},
            r"data.components.books \(token_windows\): data.path='/nowhere/\*.bin' matches no",
        ),
    ],
)
def test_components_that_do_not_fit_are_refused_by_name(files, change, message):
    spec = mixture(files)
    books = spec.components["books"]
    fields = {"path": books.data.path, "seq_len": L, "vocab_size": VOCAB, **change}
    bad = Mixture(components={**spec.components, "books": MixtureComponent(0.3, TokenWindows(**fields))})
    with pytest.raises((ValueError, OSError), match=message):
        bad.load(batch_size=4, seed=0)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"components": {"a b": MixtureComponent()}}, r"data.components.a b: a component's name takes"),
        ({"components": {"a": MixtureComponent(-1.0)}}, r"data.components.a.weight=-1.0 must be a finite number >= 0"),
        ({"components": {"a": MixtureComponent(0.0)}}, r"every weight is 0 from step 0 on"),
        (
            {"components": {"a": MixtureComponent(1.0, Mixture())}},
            r"data.components.a.data.name='mixture': a component is a token dataset",
        ),
        (
            {"components": {"a": MixtureComponent()}, "stages": (MixtureStage(3, {"b": 1.0}),)},
            r"data.stages\[0\].weights names 'b', which is not a component: a",
        ),
        (
            {"components": {"a": MixtureComponent()}, "stages": (MixtureStage(3), MixtureStage(3))},
            r"data.stages\[1\].step=3 must be >= 0 and after the stage before it \(step 3\)",
        ),
    ],
)
def test_bad_fields_are_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        Mixture(**fields)


def test_a_mixture_without_components_is_refused_at_load():
    with pytest.raises(ValueError, match="data.components is empty: a mixture needs at least one source"):
        Mixture().load(batch_size=4, seed=0)


def test_a_source_named_as_a_downstream_task_is_refused():
    from dew.training.evaluate import check_sources

    check_sources(("web", "books"), ("hellaswag",))
    with pytest.raises(ValueError, match="data.components and trainer.evals.tasks both name books: each reports"):
        check_sources(("web", "books"), ("books", "arc"))
