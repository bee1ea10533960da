"""The names a config may choose from, one tuple per choice.

These mirror the registries that implement them (advantage estimators, losses, backends, ...). The config package
keeps its own copy so it can reject a bad name before any of those modules is imported; a test of each registry is
the place to check that it and this file agree.
"""

from __future__ import annotations

ADVANTAGE_ESTIMATORS = ("grpo", "rloo", "reinforce++", "gae", "no_op")
KL_ESTIMATORS = ("k1", "k2", "k3", "abs")
KL_CONTROLLERS = ("fixed", "adaptive")
"""`trainer.algorithm.kl_ctrl.type` (rl/core/algorithms/kl_controller.py)."""
LR_SCHEDULERS = ("constant", "cosine", "linear")
"""`optimizer_config.scheduler` (rl/core/algorithms/lr_schedule.py)."""
POLICY_LOSSES = ("regular", "dual_clip", "gspo", "cispo", "sapo", "clip_cov", "kl_cov", "importance_sampling",
                 "rollout_is")
ROLLOUT_ANCHORED_POLICY_LOSSES = ("rollout_is",)
"""Policy losses whose ratio is to the engine's rollout logprobs, not the trainer's old logprobs
(`rl.trainer.rollout_mismatch.anchor_on_rollout`)."""
COVARIANCE_POLICY_LOSSES = ("clip_cov", "kl_cov")
"""Policy losses whose token selection depends on the other tokens' advantages (rl/core/algorithms/policy_loss.py
COVARIANCE_LOSSES): TIS weights cannot be applied through their advantages."""
TIS_RATIO_TYPES = ("token", "sequence")
SEQUENCE_MASK_METRICS = ("geometric", "product")
LOSS_REDUCTIONS = ("token_mean", "sequence_mean", "seq_mean_token_sum_norm")
GENERATOR_BACKENDS = ("hf", "vllm")
WEIGHT_SYNC_BACKENDS = ("ipc", "ray", "gloo", "nccl")
KERNELS = ("auto", "torch", "triton", "cuda")
LOGGERS = ("console", "tensorboard", "wandb")
DYNAMIC_SAMPLING_TYPES = ("filter", "replace")
REWARD_ON_ERROR = ("fail", "zero")
TRUNCATION = ("left", "right", "middle", "error")
"""`data.truncation`: how a prompt longer than generator.max_prompt_length is cut
(`rl.trainer.rollout.prompt_encoding`)."""
NON_FINITE = ("fail", "skip")
"""`trainer.non_finite`: what a non-finite reward, loss or gradient norm does (`rl.trainer.state.finite`)."""
LORA_INIT_METHODS = ("kaiming", "gaussian")
MODEL_REWARDS = ("reward_model", "llm_judge")
"""data.reward_fn names of the models of trainer.reward (the classifier, the judge)."""
RESUME_MODES = ("none", "latest")
"""`trainer.resume_mode` is one of these or the path of a checkpoint directory."""
