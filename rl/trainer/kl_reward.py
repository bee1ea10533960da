"""The KL penalty in the reward (`trainer.algorithm.use_kl_in_reward`): each response token's reward loses
beta * KL(policy || reference) at that token, beta kept by the `kl_ctrl` controller
(`rl.core.algorithms.kl_controller`) whose state travels in checkpoints. With a teacher as the reference
(`trainer.ref.model.path`) and `advantage_estimator=no_op` this is on-policy distillation: the student's samples
scored per token by the teacher's reverse KL."""

from __future__ import annotations

import torch
from torch import Tensor

from rl.core.algorithms.advantages import last_token_rewards
from rl.core.algorithms.kl_controller import kl_controller, kl_penalized_token_rewards
from rl.trainer.experience import Experience, response_mask


class KLInReward:
    def __init__(self, algorithm_cfg):
        self.controller = kl_controller(algorithm_cfg)
        self.estimator = algorithm_cfg.kl_estimator_type

    def token_rewards(self, experience: Experience) -> tuple[Tensor, dict[str, float]]:
        """[B, T] rewards of the policy's tokens (the outcome on the last one, less beta * kl on each) from the
        sequences' old (sampling-time) and reference logprobs; then the controller's update from the batch's
        mean KL. Metrics: that KL and the beta applied."""
        mask = experience.responses("loss_mask").bool()
        # a response with no loss token (cut at the length limit with overlong filtering) trains nothing, but its
        # outcome still counts in its group's baseline: it sits on the response's last token
        anchor = torch.where(mask.any(dim=1, keepdim=True), mask, response_mask(experience.response_lengths))
        beta = self.controller.value
        rewards, kl = kl_penalized_token_rewards(
            last_token_rewards(experience.rewards.float(), anchor), experience.responses("old_logprobs"),
            experience.responses("ref_logprobs"), mask, beta, self.estimator)
        self.controller.update(kl, len(experience.sequences))
        return rewards, {"kl_in_reward": kl, "kl_in_reward_coef": beta}

    def state_dict(self) -> dict[str, float]:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.controller.load_state_dict(state)
