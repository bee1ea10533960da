"""The keys of the peers' losses and of the KL penalty in the reward: SkyRL's defaults, and the combinations the
config refuses with a line naming both keys."""

from __future__ import annotations

import pytest

import rl.backends.registry  # noqa: F401  (registers the training strategies the config names)
from rl.core.config import ConfigError, load_config

ALGO = "trainer.algorithm."


def problems_of(overrides: list[str]) -> list[str]:
    try:
        load_config(overrides)
    except ConfigError as error:
        return list(error.problems)
    return []


def assert_refused(overrides: list[str], key: str, *fragments: str) -> None:
    lines = [line for line in problems_of(overrides) if line.startswith(key + ":")]
    assert lines, f"no problem names {key}"
    for fragment in fragments:
        assert any(fragment in line for line in lines), f"{fragment!r} missing from {lines}"


def test_defaults_are_skyrls():
    algorithm = load_config([]).trainer.algorithm
    assert (algorithm.sapo.tau_pos, algorithm.sapo.tau_neg) == (1.0, 1.05)
    assert (algorithm.clip_cov.clip_ratio, algorithm.clip_cov.clip_cov_lb, algorithm.clip_cov.clip_cov_ub) == (
        0.0002,
        1.0,
        5.0,
    )
    assert (algorithm.kl_cov.kl_cov_frac, algorithm.kl_cov.ppo_kl_coef) == (0.2, 1.0)
    assert algorithm.use_kl_in_reward is False
    assert (algorithm.kl_ctrl.type, algorithm.kl_ctrl.kl_target, algorithm.kl_ctrl.horizon) == ("fixed", 0.1, 10000)


@pytest.mark.parametrize("name", ["sapo", "clip_cov", "kl_cov", "importance_sampling"])
def test_new_losses_load(name):
    assert load_config([ALGO + f"policy_loss_type={name}"]).trainer.algorithm.policy_loss_type == name


def test_distillation_settings_load():
    cfg = load_config(
        [
            ALGO + "advantage_estimator=no_op",
            ALGO + "policy_loss_type=importance_sampling",
            ALGO + "use_kl_in_reward=true",
            ALGO + "use_kl_loss=false",
        ]
    )
    assert cfg.trainer.algorithm.advantage_estimator == "no_op"


def test_kl_in_reward_and_kl_loss_are_refused_together():
    assert_refused([ALGO + "use_kl_in_reward=true"], ALGO + "use_kl_in_reward", "trainer.algorithm.use_kl_loss")


@pytest.mark.parametrize("name", ["sapo", "clip_cov", "kl_cov", "importance_sampling"])
def test_fused_kernels_are_refused_with_losses_without_a_kernel_formula(name):
    assert_refused(
        ["trainer.policy.use_fused_kernels=true", ALGO + f"policy_loss_type={name}"],
        "trainer.policy.use_fused_kernels",
        "trainer.algorithm.policy_loss_type",
        name,
    )


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov"])
def test_tis_is_refused_with_the_covariance_losses(name):
    tis = ALGO + "off_policy_correction.tis_ratio_type"
    assert_refused([ALGO + f"policy_loss_type={name}", tis + "=token"], tis, "trainer.algorithm.policy_loss_type", name)
    masks = [
        ALGO + "off_policy_correction.token_mask_is_threshold_low=0.5",
        ALGO + "off_policy_correction.token_mask_is_threshold_high=2.0",
    ]
    assert problems_of([ALGO + f"policy_loss_type={name}", *masks]) == []


@pytest.mark.parametrize(
    ("override", "key", "fragment"),
    [
        ("sapo.tau_pos=0", "sapo.tau_pos", "> 0"),
        ("sapo.tau_neg=-1", "sapo.tau_neg", "> 0"),
        ("clip_cov.clip_ratio=0", "clip_cov.clip_ratio", "(0, 1]"),
        ("clip_cov.clip_cov_lb=5", "clip_cov.clip_cov_lb", "trainer.algorithm.clip_cov.clip_cov_ub"),
        ("kl_cov.kl_cov_frac=1.5", "kl_cov.kl_cov_frac", "(0, 1]"),
        ("kl_cov.ppo_kl_coef=-0.1", "kl_cov.ppo_kl_coef", ">= 0"),
        ("kl_ctrl.type=adaptve", "kl_ctrl.type", "adaptive"),
        ("kl_ctrl.kl_target=0", "kl_ctrl.kl_target", "> 0"),
        ("kl_ctrl.horizon=0", "kl_ctrl.horizon", ">= 1"),
    ],
)
def test_bad_values_name_the_key(override, key, fragment):
    assert_refused([ALGO + override], ALGO + key, fragment)


def test_kl_in_reward_needs_the_reference_model_a_group_of_its_own_may_hold():
    overrides = [
        "trainer.placement.colocate_all=false",
        "trainer.placement.colocate_policy_ref=false",
        ALGO + "use_kl_loss=false",
        ALGO + "use_kl_in_reward=true",
    ]
    assert not [line for line in problems_of(overrides) if "no reference model" in line]
    assert [line for line in problems_of(overrides[:3]) if "no reference model" in line]
