"""Loss settings that together cover every policy-loss family, reduction, KL estimator, the entropy term and the
on-policy case: the grid the fused-loss tests compare against the logits path."""

from rl.core.algorithms import LossSettings

FUSED_LOSS_SETTINGS = {
    "regular-token_mean-k3": LossSettings(use_kl_loss=True, kl_estimator_type="k3", kl_loss_coef=0.1),
    "dual_clip-sequence_mean-k2-entropy": LossSettings(
        policy_loss_type="dual_clip", loss_reduction="sequence_mean", use_kl_loss=True, kl_estimator_type="k2",
        kl_loss_coef=0.2, use_entropy_loss=True, entropy_loss_coef=0.05, clip_ratio_c=2.0),
    "cispo-drgrpo-abs": LossSettings(policy_loss_type="cispo", loss_reduction="seq_mean_token_sum_norm",
                                     max_generate_length=12, use_kl_loss=True, kl_estimator_type="abs"),
    "regular-on_policy-k1-entropy": LossSettings(use_kl_loss=True, kl_estimator_type="k1", use_entropy_loss=True),
}
