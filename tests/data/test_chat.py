"""``chat``: conversations rendered by the tokenizer's own chat template (or a prompt and a response),
packed whole, with a ``loss_mask`` over exactly the assistant's tokens."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "t5-f32"
TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def tokenizer_with_template(directory: Path) -> Path:
    """The Llama fixture's tokenizer with a chat template in its tokenizer_config.json."""
    directory.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(FIXTURE / name, directory / name)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return directory


def conversation(i: int) -> list[dict]:
    return [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": f"What is {i} plus {i}?"},
        {"role": "assistant", "content": f"{2 * i}."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You are welcome."},
    ]


def write_chats(path: Path, count: int) -> Path:
    with open(path, "w") as f:
        for i in range(count):
            f.write(json.dumps({"messages": conversation(i), "prompt": f"Q{i}?", "response": f"A{i}."}) + "\n")
    return path


def trained_text(batch, decode) -> list[str]:
    """Each segment's trained tokens (``loss_mask`` 1), decoded."""
    out = []
    for tokens, seg, mask in zip(batch["tokens"], batch["segment_ids"], batch["loss_mask"]):
        for s in range(1, seg.max() + 1):
            at = (seg == s) & (mask == 1)
            out.append(decode(tokens[at].tolist()))
    return out


@pytest.mark.slow
def test_the_assistant_turns_alone_carry_loss(tmp_path: Path):
    from dew.data.specs import Chat
    from dew.data.tokenizer import load_tokenizer

    tok_dir = tokenizer_with_template(tmp_path / "tok")
    data = Chat(path=str(write_chats(tmp_path / "chats.jsonl", 12)), tokenizer=str(tok_dir), seq_len=128).load(4, 0)
    tok = load_tokenizer(str(tok_dir), "data.tokenizer")
    batch = data.train.gather(np.arange(data.num_records))
    assert set(batch) == {"tokens", "segment_ids", "positions", "loss_mask"}
    got = sorted(trained_text(batch, lambda ids: tok.decode(ids)))
    eos = tok.decode([tok.eos_id])
    want = sorted(f"{2 * i}.{eos}You are welcome.{eos}" for i in range(12))
    assert got == want
    whole = batch["tokens"][0][batch["segment_ids"][0] == 1].tolist()
    assert tok.decode(whole).startswith("<|system|>Answer briefly.<|user|>What is")


def test_prompt_and_response_records_train_the_response_and_its_end(tmp_path: Path):
    from dew.data.specs import Chat

    data = Chat(path=str(write_chats(tmp_path / "c.jsonl", 3)), style="prompt_response", seq_len=16).load(1, 0)
    batch = data.train.gather(np.arange(data.num_records))
    decode = lambda ids: bytes(i if i < 256 else ord("$") for i in ids).decode()  # noqa: E731
    assert sorted(trained_text(batch, decode)) == ["A0.$", "A1.$", "A2.$"]


def test_messages_need_a_chat_template(tmp_path: Path):
    from dew.data.specs import Chat

    path = write_chats(tmp_path / "c.jsonl", 2)
    with pytest.raises(ValueError, match="data.tokenizer: no chat template in"):
        Chat(path=str(path), tokenizer=str(FIXTURE)).load(1, 0)
    with pytest.raises(ValueError, match="data.style=messages renders each conversation with the tokenizer's chat"):
        Chat(path=str(path)).load(1, 0)
