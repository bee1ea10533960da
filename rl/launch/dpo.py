"""`bazel run //rl/launch:dpo -- [--strategy=S] [--config=FILE.yaml] [--run_dir=DIR] [key=value ...]`

Direct preference optimisation on (`dpo.prompt_key`, `dpo.chosen_key`, `dpo.rejected_key`) rows of
`data.train_data` against the frozen starting policy (a LoRA policy with its adapters off), loss `dpo.loss_type`
sigmoid or ipo, `dpo.beta`, an optional SFT term `dpo.sft_loss_weight`; checkpoints, resume and exports as
`rl.launch.train`. With no arguments it trains the embedded job's warmed-up model on the embedded preference set.
`dpo.*` keys: `rl.core.config.supervised.DpoConfig` (NeMo RL's `dpo:` names are read where they exist).
"""

from rl.launch import cli, supervised_cli

if __name__ == "__main__":
    cli.run(lambda argv: supervised_cli.main("dpo", argv), ("rl.launch.supervised_cli",))
