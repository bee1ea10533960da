"""What the machine must provide is checked before anything is created: the launcher exits with code 2 and one line
naming the key, with no run directory and no Ray instance, for bad prompt files, a missing local model and kernels
this machine cannot run."""

import json
import os
import time

import pytest

from rl.launch import train

PROMPTS = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(6)]


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in PROMPTS))
    return str(path)


def _launch(run_dir: str, overrides: list[str], capsys) -> str:
    from absl import flags

    flags.FLAGS.unparse_flags()
    flags.FLAGS(["train", f"--run_dir={run_dir}"])
    started = time.perf_counter()
    assert train.main(["train", *overrides]) == 2
    assert time.perf_counter() - started < 10, "refused before any expensive work"
    assert not os.path.exists(run_dir), "nothing is created before the checks pass"
    import ray

    assert not ray.is_initialized()
    return capsys.readouterr().err


CASES = {
    "missing_file": (["data.train_data=['{tmp}/nope.jsonl']"], "data.train_data:", "no such file"),
    "directory": (["data.train_data=['{tmp}']"], "data.train_data:", "unsupported file extension"),
    "extension": (["data.train_data=['{tmp}/train.csv']"], "data.train_data:", "unsupported file extension"),
    "prompt_key": (["data.train_data=['{data}']", "data.prompt_key=question"], "data.train_data:", "question"),
    "val_answer_key": (["data.val_data=['{data}']", "data.answer_key=solution"], "data.val_data:", "solution"),
    "too_few_prompts": (["data.train_data=['{data}']", "trainer.train_batch_size=8",
                         "trainer.policy_mini_batch_size=8"], "trainer.train_batch_size:", "holds 6"),
    "model_dir": (["trainer.policy.model.path={tmp}/no-model"], "trainer.policy.model.path:", "is not a directory"),
    "model_config": (["trainer.policy.model.path={tmp}"], "trainer.policy.model.path:", "no config.json"),
    "kernels": (["trainer.kernels=cuda"], "trainer.kernels:", "needs a CUDA device"),
    "ckpt_under_a_file": (["trainer.ckpt_path={data}/ckpt"], "trainer.ckpt_path:", "is a file"),
    "export_under_a_file": (["trainer.export_path={data}/exports"], "trainer.export_path:", "is a file"),
}


@pytest.mark.parametrize("case", CASES)
def test_refused_before_anything_starts(case, data, tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the kernels case on a GPU machine too
    overrides, key, words = CASES[case]
    overrides = [o.format(tmp=tmp_path, data=data) for o in overrides]
    message = _launch(str(tmp_path / "run"), overrides, capsys)
    assert key in message and words in message, message
    assert "Traceback" not in message


@pytest.mark.parametrize("offline", [True, False], ids=["offline", "unreachable"])
def test_hub_name_not_cached_without_a_hub_is_refused(offline, tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    message = _launch(str(tmp_path / "run"), ["trainer.policy.model.path=no-such-org/no-such-model"], capsys)
    name = "no-such-org/no-such-model"
    assert f"trainer.policy.model.path: {name} is a hub name that is not in the local cache" in message
    assert ("HF_HUB_OFFLINE is set" if offline else "http://127.0.0.1:9 cannot be reached") in message
    assert "point trainer.policy.model.path at the directory" in message


def test_run_dir_that_is_a_file_is_refused(tmp_path, capsys):
    from absl import flags

    path = tmp_path / "run"
    path.write_text("")
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["train", f"--run_dir={path}"])
    assert train.main(["train"]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err
