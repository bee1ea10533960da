"""Long prompts in a run: one launcher run of the tiny job with generator.max_prompt_length below every prompt's
length, so each prompt is cut (data.truncation=left, the default), named in one warning and counted per step."""

import re

from rl.trainer.state.metrics import read_metrics
from tests.testing.tiny_job import make_tiny_job, run_train

WARNING = re.compile(r"^warning: the prompt of (\S+train\.parquet row \d+) has (\d+) tokens, more than "
                     r"generator\.max_prompt_length=8; cut to it \(data\.truncation=left\)$")


def test_cut_prompts_are_warned_once_per_row_and_counted_each_step(tmp_path):
    job = make_tiny_job(str(tmp_path / "job"))
    run_dir = str(tmp_path / "run")
    # a tiny-job prompt is <|bos|><|user|>What is a + b?<|end|><|assistant|>: at least 14 tokens, so all are cut
    result = run_train(run_dir, [*job.overrides(steps=2), "generator.max_prompt_length=8"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [row for row in read_metrics(f"{run_dir}/metrics.jsonl") if row["step"] >= 1]
    assert [row["prompts_truncated"] for row in rows] == [4, 4]  # train_batch_size prompts per step
    warned = [WARNING.match(line) for line in result.stdout.splitlines() if line.startswith("warning: the prompt")]
    assert all(warned), result.stdout[-3000:]
    assert all(int(match.group(2)) >= 14 for match in warned)
    rows_named = [match.group(1) for match in warned]
    assert len(rows_named) == len(set(rows_named)) == 8  # two steps of 4 distinct rows (64 in the epoch), once each
