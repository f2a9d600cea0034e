"""Per-token figures count the targets that carry loss: with packed documents (and a chat's loss mask),
dew-eval's bits per byte, the datasets' ``tokens_per_record`` (the power schedule's tokens seen) and
the trainer's tokens/s leave the padding, the targets across document boundaries and the prompts out,
as the loss and the perplexity do."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew.data.packing import Framing, PackedTable
from dew.objectives.tokens import target_weights

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "t5-f32"
TEXTS = ["The quick brown fox.", "naïve café, 東京!", "Pack my box with five dozen liquor jugs."]


class Uniform(nnx.Module):
    """Zero logits: every target costs ln V nats, wherever it is."""

    def __init__(self, vocab: int):
        self.vocab = vocab

    def __call__(self, inputs, **kwargs):
        return jnp.zeros((*inputs.shape, self.vocab), jnp.float32)


@pytest.mark.slow
def test_bits_per_byte_of_a_padded_batch_is_the_documents_own():
    """Three documents packed into two windows of 24 with padding, under the Llama fixture's BPE (an
    end-of-text id that decodes to nothing): the loss is ln V per counted target, so bits per byte
    must be (counted targets · log2 V) / (the documents' UTF-8 bytes), by hand."""
    from dew.data.tokenizer import load_tokenizer
    from dew.inference.evaluating import TargetBytes, bits_per_byte, byte_counter, with_bytes
    from dew.objectives.autoregressive import NextToken
    from dew.objectives.next_token import NextTokenKnobs

    tok = load_tokenizer(str(FIXTURE), "data.tokenizer")
    ids = [tok.encode(t).astype(np.int32) for t in TEXTS]
    shard = np.concatenate([np.concatenate([i, [tok.eos_id]]) for i in ids]).astype(np.int32)
    table = PackedTable([shard], 23, Framing(tok.eos_id, has_bos=False))
    host = table.gather(np.arange(table.num_windows))
    assert (host["segment_ids"] == 0).any()  # padding there is
    host["mask"] = np.ones(len(host["tokens"]), np.int32)
    objective = NextToken(model_config=None, knobs=NextTokenKnobs(), vocab_size=tok.vocab_size, seq_len=23)
    counter = byte_counter(objective, type("Data", (), {"tokenizer": {**tok.record(), "file": tok.file}})())
    (batch,) = with_bytes(iter([host]), counter)
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    out = objective.evaluate(Uniform(tok.vocab_size), batch, jax.random.key(0))
    byte_sum, targets = TargetBytes()(None, batch, jax.random.key(0))
    got = bits_per_byte(float(out.total / out.count), float(byte_sum / targets))

    counted = sum(len(i) + 1 for i in ids)  # each document's ids and its end-of-text id; not the lead
    text_bytes = sum(len(t.encode()) for t in TEXTS)
    assert float(out.count) == float(targets) == counted
    assert got == pytest.approx(counted * np.log2(tok.vocab_size) / text_bytes, rel=1e-6)
    # counted as before (every target of every row): another figure, the padding's in it
    every = host["tokens"][:, 1:].size
    assert every > counted and float(byte_sum) / every < float(byte_sum) / counted


def test_tokens_per_record_counts_the_targets_that_carry_loss():
    """A table's per-window count is the objective's weights summed (with and without a loss mask),
    and a dataset's ``tokens_per_record`` their mean; a stream's is its first windows' mean."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 250, rng.integers(1, 40)) for _ in range(60)]  # some longer than a window
    shard = np.concatenate([np.append(d, 256) for d in docs]).astype(np.int32)
    mask = (rng.random(len(shard)) < 0.6).astype(np.int32)
    for masks in (None, [mask]):
        table = PackedTable([shard], 16, Framing(256, has_bos=False), loss_masks=masks)
        weights = target_weights(table.gather(np.arange(table.num_windows)))
        np.testing.assert_array_equal(table.targets_per_window(), weights.sum(axis=1))
    table = PackedTable([shard], 16, Framing(256, has_bos=False))
    by_hand = sum(len(d) + 1 for d in docs)  # each framed document of n + 2 tokens: n + 1 targets, pieces too
    assert table.targets_per_window().sum() == by_hand


def test_token_windows_and_text_stream_report_their_counted_tokens(tmp_path: Path):
    import json

    from dew.data.specs import TextStream, TokenWindows

    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 250, rng.integers(1, 30)) for _ in range(200)]
    (tmp_path / "train.bin").write_bytes(np.concatenate([np.append(d, 256) for d in docs]).astype(np.uint16))
    sidecar = {"format": "dew-tokens", "version": 1, "vocab_size": 257, "tokenizer": {"kind": "byte", "eos_id": 256}}
    (tmp_path / "tokens.json").write_text(json.dumps(sidecar))
    path = str(tmp_path / "train.bin")
    plain = TokenWindows(path=path, seq_len=32, format="raw").load(batch_size=4, seed=0)
    packed = TokenWindows(path=path, seq_len=32, format="raw", documents=True).load(batch_size=4, seed=0)
    assert plain.tokens_per_record == 32
    assert packed.tokens_per_record == pytest.approx(sum(len(d) + 1 for d in docs) / packed.num_records)
    assert packed.tokens_per_record < 32

    for i in range(12):
        (tmp_path / f"{i}.txt").write_text("word " * (3 + 5 * i))
    stream = TextStream(path=str(tmp_path / "*.txt"), seq_len=32, documents=True).load(batch_size=4, seed=0)
    first = stream.iterator().next(64)
    assert stream.tokens_per_record == pytest.approx(float(target_weights(first).sum()) / 64)
    assert 0 < stream.tokens_per_record < 32


def test_tokens_per_second_is_examples_per_second_times_the_counted_tokens():
    from dew.training.reporting.tracker import Throughput

    meter = Throughput(flops_per_example=None, peak_flops=None, tokens_per_example=27.5)
    meter.mark = (0.0, 0)  # as if restarted at the epoch, 0 records
    out = meter.measure(100)
    assert out["perf/tokens_per_sec"] == pytest.approx(out["perf/examples_per_sec"] * 27.5)
    assert "perf/tokens_per_sec" not in Throughput(flops_per_example=None, peak_flops=None).measure(1)
