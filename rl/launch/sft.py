"""`bazel run //rl/launch:sft -- [--strategy=S] [--config=FILE.yaml] [--run_dir=DIR] [key=value ...]`

Supervised fine-tuning on chat-format (`sft.messages_key`) or prompt/response rows (`sft.prompt_key`,
`sft.response_key`) in `data.train_data`, the loss on assistant tokens, through any strategy; checkpoints, resume and
exports as `rl.launch.train`. With no arguments it trains the embedded job's untrained small model on its warm-up
demonstrations. `sft.*` keys: `rl.core.config.supervised.SftConfig` (SkyRL's `num_steps`, `num_epochs`,
`batch_size` are read as trainer.max_steps, trainer.epochs, trainer.train_batch_size).
"""

from rl.launch import cli, supervised_cli

if __name__ == "__main__":
    cli.run(lambda argv: supervised_cli.main("sft", argv), ("rl.launch.supervised_cli",))
