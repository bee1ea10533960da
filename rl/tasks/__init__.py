"""Tasks: what a run trains on and how it is scored, kept out of the generic layers below.

- `rl.tasks.gsm8k`: GSM8K data preparation (jsonl or the hub to parquet) and the GSM8K reward functions.
- `rl.tasks.embedded`: the embedded default job (tokenizer, tiny model, synthetic arithmetic task, warm-up).
- `rl.tasks.rewards`: importing it registers every task's reward functions under their `data.reward_fn` names.
"""
