"""The models of trainer.reward in a run: a tiny sequence classifier (`reward_model`) and an LLM judge (`llm_judge`,
here the tiny job's own causal LM behind the HF engine), each in its own Ray actor, summed with a reward function
by data.reward_weights; a model that is configured but not listed, or listed but not configured, is refused."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

from rl.trainer.state.metrics import read_metrics
from tests.testing.launcher import launch_refused
from tests.testing.tiny_job import make_tiny_job, run_train
from tests.testing.tolerances import gamma, weighted_mean_gap

JUDGE = ["trainer.reward.judge.template='Grade: {response} Answer:'", "trainer.reward.judge.pattern='(\\d)'",
         "trainer.reward.judge.max_new_tokens=6"]


def _classifier(directory: str, tokenizer_path: str) -> str:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id, initializer_range=0.3)
    LlamaForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _score_bound(directory: str) -> float:
    """Largest |score| the classifier can give: its head reads the final RMSNorm's output g * x / rms(x), whose L2
    norm is at most max|g| sqrt(hidden), so |score| <= |head|_2 max|g| sqrt(hidden) (float32's rounding of the
    norm and the head's dot product, gamma_(2 hidden), on top)."""
    model = LlamaForSequenceClassification.from_pretrained(directory)
    hidden = model.config.hidden_size
    head, norm = model.score.weight.detach(), model.model.norm.weight.detach()
    return float(head.norm()) * float(norm.abs().max()) * hidden**0.5 * (1 + gamma(2 * hidden, torch.float32))


def _digit_judge(directory: str, model_path: str) -> str:
    """The tiny model with an LM head that only ever writes 7 or 3 (whichever way its hidden state leans), so its
    greedy answers always hold a score."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    head = torch.zeros_like(model.get_output_embeddings().weight)  # a head of its own: the embeddings stay
    head[tokenizer.convert_tokens_to_ids("7")] = 5.0
    head[tokenizer.convert_tokens_to_ids("3")] = -5.0
    model.config.tie_word_embeddings = False
    model.get_output_embeddings().weight = torch.nn.Parameter(head)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_a_classifier_and_a_judge_score_beside_a_function(tmp_path):
    job = make_tiny_job(str(tmp_path / "job"))
    classifier = _classifier(str(tmp_path / "rm"), job.model_path)
    judge = _digit_judge(str(tmp_path / "judge"), job.model_path)
    run_dir = str(tmp_path / "run")
    result = run_train(run_dir, [*job.overrides(steps=2), "data.reward_fn=[gsm8k, reward_model, llm_judge]",
                                 "data.reward_weights=[1.0, 0.5, 0.1]", f"trainer.reward.model.path={classifier}",
                                 f"trainer.reward.judge.model_path={judge}", *JUDGE])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = [r for r in read_metrics(f"{run_dir}/metrics.jsonl") if r["step"] >= 1]
    assert len(rows) == 2
    bound = _score_bound(classifier)
    for row in rows:
        expected = row["reward/gsm8k"] + 0.5 * row["reward/reward_model"] + 0.1 * row["reward/llm_judge"]
        # gsm8k and the judge score >= 0 (their means are their magnitudes), the classifier either sign
        gap = weighted_mean_gap([1.0, 0.5, 0.1], [row["reward/gsm8k"], bound, row["reward/llm_judge"]], samples=16)
        assert abs(row["reward_mean"] - expected) <= gap, row
        assert math.isfinite(row["reward/reward_model"]) and row["reward/reward_model"] != 0.0
        assert 3.0 <= row["reward/llm_judge"] <= 7.0 and row["reward_errors"] == 0


@pytest.mark.parametrize("overrides,message", [
    (["trainer.reward.model.path=/tmp/rm"], "data.reward_fn does not list reward_model"),
    (["data.reward_fn=[gsm8k, llm_judge]", "data.reward_weights=[1, 1]"], "trainer.reward.judge.template: is null"),
])
def test_model_rewards_need_both_the_model_and_the_name(tmp_path, capsys, overrides, message):
    printed = launch_refused(str(tmp_path / "run"), overrides, capsys)
    assert message in printed, printed


def test_a_causal_lm_as_reward_model_is_refused(tmp_path, capsys):
    job = make_tiny_job(str(tmp_path / "job"))
    printed = launch_refused(str(tmp_path / "run"), ["data.reward_fn=[reward_model]",
                                                     f"trainer.reward.model.path={job.model_path}"], capsys)
    assert "trainer.reward.model.path:" in printed and "ForSequenceClassification" in printed, printed
