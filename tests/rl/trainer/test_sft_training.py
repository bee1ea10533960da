"""`rl.launch.sft` end to end on the embedded job (fsdp2, packed micro-batches): the untrained model's assistant-token
loss falls from about ln(vocabulary) and validation loss with it; a run resumed from the step-2 checkpoint logs the
uninterrupted run's metrics for steps 3-4; the step-4 export loads in transformers and scores the validation
conversations as the run's own `val_loss` did (within float32 rounding, `tests.testing.tolerances`). Bad input:
tests/rl/trainer/test_supervised_preflight.py."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rl.core.data.supervised import SupervisedDataSpec, load_sft_examples
from rl.trainer.state.metrics import read_metrics
from tests.testing import tolerances
from tests.testing.tiny_job import run_train

COMMON = ["trainer.max_steps=4", "trainer.train_batch_size=32", "trainer.eval_interval=4",
          "trainer.eval_before_train=true", "trainer.policy.optimizer_config.lr=3e-3", "trainer.ckpt_interval=2"]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("sft") / "run"
    run_train(str(run_dir), [*COMMON, "trainer.hf_save_interval=4"], module="rl.launch.sft", check=True)
    return run_dir, read_metrics(str(run_dir / "metrics.jsonl"))


def test_loss_falls_from_chance_on_assistant_tokens(first_run):
    _, rows = first_run
    start, steps = rows[0], {row["step"]: row for row in rows if row["step"] > 0}
    vocabulary = len(AutoTokenizer.from_pretrained(str(first_run[0] / "embedded" / "model")))
    # a random init predicts near-uniformly: the first loss lies within a nat of ln(V)
    assert abs(steps[1]["sft_loss"] - math.log(vocabulary)) < 1.0
    assert steps[4]["sft_loss"] < steps[1]["sft_loss"] - 0.5
    assert steps[4]["val_loss"] < start["val_loss"] - 0.5
    assert steps[1]["sft_tokens"] > 0 and steps[1]["loss"] == steps[1]["sft_loss"]


def test_resumed_run_logs_the_uninterrupted_metrics(first_run, tmp_path):
    run_dir, rows = first_run
    run_train(str(tmp_path / "resumed"), [*COMMON, "trainer.eval_before_train=false",
                                          f"trainer.resume_mode={run_dir / 'checkpoints' / 'global_step_2'}"],
              module="rl.launch.sft", check=True)
    resumed = read_metrics(str(tmp_path / "resumed" / "metrics.jsonl"))
    want = {row["step"]: row for row in rows}
    got = {row["step"]: row for row in resumed}
    assert sorted(got) == [3, 4]
    for step in (3, 4):
        for key in ("sft_loss", "grad_norm", "val_loss"):
            if key in want[step]:
                assert got[step][key] == want[step][key], (step, key)


def test_export_loads_in_transformers_and_scores_as_the_run(first_run):
    run_dir, rows = first_run
    export = run_dir / "exports" / "global_step_4"
    model = AutoModelForCausalLM.from_pretrained(str(export), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(export))
    val = load_sft_examples(tokenizer, [run_dir / "embedded" / "data" / "validation.parquet"],
                            SupervisedDataSpec(response_key="reference_response"))
    nll, tokens, logit_max, longest = 0.0, 0, 0.0, 0
    with torch.no_grad():
        for example in val:
            ids, mask = example["input_ids"], example["loss_mask"]
            logits = model(input_ids=ids[None]).logits[0]
            lp = torch.log_softmax(logits[:-1].double(), -1).gather(-1, ids[1:, None])[:, 0]
            nll += float(-(lp * mask[1:]).sum())
            tokens += int(mask.sum())
            logit_max, longest = max(logit_max, float(logits.abs().max())), max(longest, len(ids))
    want = {row["step"]: row for row in rows}[4]["val_loss"]
    gap = tolerances.network_rtol(tolerances.decoder_reductions(model.config, longest), torch.float32) * logit_max
    tolerances.assert_within(torch.tensor(nll / tokens), torch.tensor(want), gap + 2 * tolerances.gamma(
        tokens, torch.float32) * want, "exported model's validation loss")

