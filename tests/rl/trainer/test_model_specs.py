"""The trainer keys each worker's ModelSpec carries: trainer.bf16 and trainer.flash_attn reach the policy and the
reference alike, null (the device decides) by default; freeze_vision_tower reaches the policy only."""

from rl.core.config import load_config
from rl.trainer.workers.worker_start import model_specs


def test_precision_and_attention_keys_reach_both_models():
    policy, ref = model_specs(load_config([]), "model")
    assert (policy.bf16, policy.flash_attn, ref.bf16, ref.flash_attn) == (None, None, None, None)
    policy, ref = model_specs(load_config(["trainer.bf16=true", "trainer.flash_attn=false"]), "model")
    assert (policy.bf16, policy.flash_attn, ref.bf16, ref.flash_attn) == (True, False, True, False)
    policy, ref = model_specs(load_config(["trainer.bf16=false"]), "model")
    assert policy.bf16 is False and ref.bf16 is False


def test_a_frozen_vision_tower_is_the_policys_alone():
    """The reference never trains, so only the policy's spec freezes the vision tower (its default: train it)."""
    policy, ref = model_specs(load_config(["trainer.algorithm.use_kl_loss=true"]), "model")
    assert policy.freeze_vision_tower is False
    policy, ref = model_specs(load_config(["trainer.algorithm.use_kl_loss=true",
                                           "trainer.policy.model.freeze_vision_tower=true"]), "model")
    assert policy.freeze_vision_tower is True and ref.freeze_vision_tower is False
