"""Prompt templates where the trainer uses them: the ids the engine gets through the embedded tokenizer's chat
template (written out by hand from its vocabulary table), the preflight building the prompts with the template
(a row it cannot take refused before anything starts), and the SFT/DPO preflight refusing the keys it would not use."""

from __future__ import annotations

import json

import rl.backends.registry  # noqa: F401  (the strategies a config names)
from rl.core.config import load_config
from rl.core.config.supervised import SftConfig
from rl.core.data import load_prompt_dataset, load_prompt_template
from rl.tasks.embedded.tokenizer import build_tokenizer, vocabulary
from rl.trainer.components import load_datasets
from rl.trainer.preflight.checks import _data_problems
from rl.trainer.rollout.prompt_encoding import render_ids
from rl.trainer.supervised.preflight import _data_problems as supervised_data_problems

VOCAB = vocabulary()


def _write(path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def _rows(tmp_path, rows) -> str:
    return _write(tmp_path / "rows.jsonl", "".join(json.dumps(row) + "\n" for row in rows))


def test_ids_through_the_embedded_chat_template(tmp_path):
    template = load_prompt_template(_write(tmp_path / "t.txt", "Answer:\n{}"),
                                    _write(tmp_path / "s.txt", "Answer after ####."))
    path = _rows(tmp_path, [{"prompt": "What is 12 + 34?", "answer": "46"}])
    (record,) = load_prompt_dataset([path], template=template)
    pieces = ["<|bos|>", "<|system|>", "Answer", " ", "after", " ", "####", ".", "<|end|>",
              "<|user|>", "Answer", ":", "\n", "What", " ", "is", " ", "1", "2", " ", "+", " ", "3", "4", "?",
              "<|end|>", "<|assistant|>"]
    assert render_ids(build_tokenizer(), record) == [VOCAB[piece] for piece in pieces]


def test_training_and_preflight_build_the_same_prompts(tmp_path):
    good = _rows(tmp_path, [{"prompt": "What is 1 + 2?", "answer": "3"}])
    template = _write(tmp_path / "t.txt", "Answer:\n{}")
    cfg = load_config([f"data.train_data=[{good}]", "data.val_data=[]", f"data.prompt_template_file={template}",
                       "trainer.train_batch_size=1", "trainer.policy_mini_batch_size=1"])
    loaded: dict = {}
    assert _data_problems(cfg, loaded) == []
    train, _ = load_datasets(cfg, cfg.data.train_data, [])
    assert loaded["data.train_data"][0].prompt == train[0].prompt
    assert train[0].messages() == [{"role": "user", "content": "Answer:\nWhat is 1 + 2?"}]


def test_preflight_refuses_a_conversation_with_a_template(tmp_path):
    chat = [{"role": "user", "content": "1 + 2?"}, {"role": "assistant", "content": "3"},
            {"role": "user", "content": "And 2 + 2?"}]
    path = _rows(tmp_path, [{"prompt": chat, "answer": "4"}])
    system = _write(tmp_path / "s.txt", "Answer after ####.")
    cfg = load_config([f"data.train_data=[{path}]", "data.val_data=[]", f"data.system_prompt_file={system}",
                       "trainer.train_batch_size=1", "trainer.policy_mini_batch_size=1"])
    (line,) = _data_problems(cfg, {})
    assert line.startswith(f"data.train_data: {path} line 1: the prompt is a chat of 3 messages (user, assistant, "
                           "user)"), line


def test_sft_refuses_the_template_keys(tmp_path):
    rows = _rows(tmp_path, [{"messages": [{"role": "user", "content": "1 + 2?"},
                                          {"role": "assistant", "content": "3"}]}])
    template = _write(tmp_path / "t.txt", "Answer:\n{}")
    cfg = load_config([f"data.train_data=[{rows}]", "data.val_data=[]", f"data.prompt_template_file={template}",
                       "trainer.train_batch_size=1", "trainer.policy_mini_batch_size=1"])
    lines = supervised_data_problems(cfg, "sft", SftConfig())
    assert lines == ["data.prompt_template_file: builds the prompts of GRPO/PPO runs (rl.launch.train); sft rows are "
                     "used as the data holds them: set it to null and write the prompts into the rows"]
