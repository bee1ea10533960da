"""`rl.launch.sft` and `rl.launch.dpo` on input they must refuse, each run in this process
(`tests.testing.launcher.launch_refused`: exit code 2 within seconds, Ray never started, no run directory, no
traceback), the refusal one line naming the key, and for data the file and the row: the preflight
(`rl.trainer.supervised.preflight`, the RL launcher's checks where they apply) and the `sft:` / `dpo:` blocks."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest

import rl.backends.registry  # noqa: F401  (the strategies the config names)
from tests.testing.launcher import launch_refused

CHAT = [{"messages": [{"role": "user", "content": f"What is {i} + 1?"}, {"role": "assistant", "content": str(i + 1)}]}
        for i in range(4)]
PAIRS = [{"prompt": f"What is {i} + 1?", "chosen": str(i + 1), "rejected": str(i)} for i in range(4)]
STEP = ["trainer.train_batch_size=2", "trainer.policy_mini_batch_size=2"]


@dataclass(frozen=True)
class Bad:
    launcher: str
    overrides: tuple[str, ...]
    key: str
    fragments: tuple[str, ...]
    rows: tuple = ()
    """Rows of `{bad}`, a jsonl file written for the case (`{good}` holds 4 good rows for the launcher)."""


def _unknown_role():
    return ({"messages": [{"role": "user", "content": "What is 1 + 2?"}, {"role": "moderator", "content": "3"}]},)


CASES = {
    "sft_unknown_role": Bad("sft", ("data.train_data=['{bad}']",), "data.train_data",
                            ("bad.jsonl line 2", "unknown role 'moderator'"), (CHAT[0], *_unknown_role())),
    "sft_no_assistant_turn": Bad("sft", ("data.train_data=['{bad}']",), "data.train_data",
                                 ("bad.jsonl line 1", "no assistant turn"),
                                 ({"messages": [{"role": "user", "content": "Hi"}]},)),
    "sft_columns_absent": Bad("sft", ("data.train_data=['{bad}']",), "data.train_data",
                              ("bad.jsonl line 1", "set sft.messages_key"), ({"question": "Hi", "answer": "1"},)),
    "sft_bad_validation_row": Bad("sft", ("data.train_data=['{good}']", "data.val_data=['{bad}']"),
                                  "data.val_data", ("bad.jsonl line 1", "not valid JSON"), ('{"messages": ',)),
    "sft_missing_file": Bad("sft", ("data.train_data=['{tmp}/absent.jsonl']",), "data.train_data",
                            ("absent.jsonl", "no such file")),
    "sft_fewer_rows_than_a_step": Bad("sft", ("data.train_data=['{good}']", "trainer.train_batch_size=8",
                                              "trainer.policy_mini_batch_size=8"), "trainer.train_batch_size",
                                      ("8 examples per step", "holds 4")),
    "sft_model_dir_missing": Bad("sft", ("trainer.policy.model.path={tmp}/no-model",), "trainer.policy.model.path",
                                 ("is not a directory",)),
    "sft_ckpt_under_a_file": Bad("sft", ("trainer.ckpt_path={good}/ckpt",), "trainer.ckpt_path", ("is a file",)),
    "sft_export_under_a_file": Bad("sft", ("trainer.export_path={good}/exports",), "trainer.export_path",
                                   ("is a file",)),
    "sft_resume_from_no_checkpoint": Bad("sft", ("trainer.resume_mode={tmp}",), "trainer.resume_mode",
                                         ("not a complete checkpoint",)),
    "sft_cuda_kernels_without_cuda": Bad("sft", ("trainer.kernels=cuda",), "trainer.kernels",
                                         ("needs a CUDA device",)),
    "sft_two_nodes_without_a_cluster": Bad("sft", ("trainer.placement.policy_num_nodes=2",),
                                           "trainer.placement.policy_num_nodes", ("pass --ray_address",)),
    "sft_unknown_block_key": Bad("sft", ("sft.max_lenght=64",), "sft.max_lenght",
                                 ("did you mean 'sft.max_length'?",)),
    "sft_block_key_of_the_wrong_type": Bad("sft", ("sft.truncate=3",), "sft.truncate", ("expected true or false",)),
    "sft_given_a_dpo_key": Bad("sft", ("dpo.beta=0.1",), "dpo.beta", ("is the block of rl.launch.dpo",)),
    "dpo_identical_pair": Bad("dpo", ("data.train_data=['{bad}']",), "data.train_data",
                              ("bad.jsonl line 2", "chosen and rejected responses are identical"),
                              (PAIRS[0], {"prompt": "What is 2 + 2?", "chosen": "4", "rejected": "4"})),
    "dpo_rejected_column_absent": Bad("dpo", ("data.train_data=['{bad}']",), "data.train_data",
                                      ("bad.jsonl line 1", "set dpo.rejected_key"),
                                      ({"prompt": "Hi", "chosen": "1"},)),
    "dpo_fewer_pairs_than_a_step": Bad("dpo", ("data.train_data=['{pairs}']", "trainer.train_batch_size=8",
                                               "trainer.policy_mini_batch_size=8"), "trainer.train_batch_size",
                                       ("8 pairs per step", "holds 4")),
    "dpo_nemo_val_batches": Bad("dpo", ("dpo.val_batches=8",), "dpo.val_batches",
                                ("evaluating only the first val_batches batches",)),
    "dpo_nemo_rpo_loss": Bad("dpo", ("dpo.preference_loss=rpo_sq",), "dpo.preference_loss",
                             ("the preference losses here are dpo",)),
}


def _jsonl(path, rows) -> str:
    with open(path, "w") as f:
        f.write("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the kernel row on a GPU machine too


@pytest.mark.parametrize("case", CASES)
def test_refused_before_anything_starts_in_one_line(case, tmp_path, capsys):
    row = CASES[case]
    places = {"tmp": str(tmp_path / "scratch"), "good": _jsonl(tmp_path / "good.jsonl", CHAT),
              "pairs": _jsonl(tmp_path / "pairs.jsonl", PAIRS), "bad": _jsonl(tmp_path / "bad.jsonl", row.rows)}
    os.makedirs(places["tmp"])
    good = places["pairs"] if row.launcher == "dpo" else places["good"]
    overrides = [f"data.train_data=['{good}']", "data.val_data=[]", *STEP]
    for override in row.overrides:
        for name, value in places.items():
            override = override.replace("{" + name + "}", value)
        overrides.append(override)
    message = launch_refused(str(tmp_path / "run"), overrides, capsys, launcher=row.launcher)
    problems = [line.strip().removeprefix("- ") for line in message.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and problems[0].startswith(row.key + ":"), message
    for fragment in row.fragments:
        assert fragment in problems[0], message
