"""The repository's transformers-written Llama (tests/fixtures/hf/t5-f32), fine-tuned on a chat file with
its own tokenizer and a chat template (``data=chat``, ``trainer.init_from``), exported with
``dew-export``: the export holds the fixture's tensors, trained, the run's weights exactly, the
template; and dew's logits of the fine-tune are the ones transformers computed from the export of
the same (deterministic) fine-tune (``tests/fixtures/hf/chat_check.py`` wrote them to
``chat_reference.json``; its report is ``chat_check.txt``), to 1e-4."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.hf import chat_tune

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hf"


@pytest.mark.slow
def test_a_chat_fine_tune_of_the_llama_exports_what_transformers_computes(tmp_path: Path):
    from flax import nnx
    from safetensors.numpy import load_file

    from dew.data.tokenizer import load_tokenizer
    from dew.inference.restore import restore

    run, out, _ = chat_tune.fine_tune(tmp_path)

    # The files: the fixture's tensors and config, trained; the tokenizer with its chat template.
    theirs, ours = load_file(str(FIXTURES / "t5-f32" / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}
    assert all(ours[k].dtype == np.float32 for k in ours)
    moved = {k: float(np.abs(ours[k] - theirs[k]).max()) for k in ours}
    assert min(moved.values()) > 0, moved  # every tensor trained: the assistant's tokens reach them all
    config, source = (json.loads((d / "config.json").read_text()) for d in (out, FIXTURES / "t5-f32"))
    keys = ("architectures", "vocab_size", "hidden_size", "num_hidden_layers", "num_key_value_heads", "head_dim")
    assert {k: config[k] for k in keys} == {k: source[k] for k in keys}
    assert config["eos_token_id"] == load_tokenizer(str(FIXTURES / "t5-f32"), "data.tokenizer").eos_id
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == chat_tune.TEMPLATE

    # The run's weights, exactly: the embedding as the run holds it.
    r = restore(str(run))
    params = dict(nnx.to_flat_state(nnx.state(r.model, nnx.Param)))
    embedding = next(np.asarray(v[...]) for k, v in params.items() if "embed" in "/".join(map(str, k)))
    np.testing.assert_array_equal(ours["model.embed_tokens.weight"], embedding)

    # transformers' logits of the export of this fine-tune (chat_check.py) are dew's.
    reference = json.loads((FIXTURES / "chat_reference.json").read_text())
    assert reference["tokens"] == chat_tune.TOKENS.tolist()
    logits = np.asarray(r.model(chat_tune.TOKENS))
    np.testing.assert_allclose(logits, np.asarray(reference["logits"]), atol=1e-4, rtol=0)
