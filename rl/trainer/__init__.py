"""The GRPO/PPO training loop and its components (experience, batching, checkpoints, metrics, plots)."""
