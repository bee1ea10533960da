"""The algorithm registries offer exactly the names the config accepts (rl/core/config/choices.py), and
LossSettings reads the loaded config."""

import pytest

import rl.backends.registry  # noqa: F401  (registers the training strategies the config names)
from rl.core.algorithms import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_REDUCTIONS, POLICY_LOSSES, LossSettings
from rl.core.algorithms.kl_controller import KL_CONTROLLERS, AdaptiveKLController, kl_controller
from rl.core.algorithms.off_policy import SEQUENCE_MASKS, TIS_RATIOS
from rl.core.algorithms.policy_loss import COVARIANCE_LOSSES
from rl.core.config import choices, load_config


@pytest.mark.parametrize(
    ("registry", "names"),
    [
        (ADVANTAGE_ESTIMATORS, choices.ADVANTAGE_ESTIMATORS),
        (KL_ESTIMATORS, choices.KL_ESTIMATORS),
        (POLICY_LOSSES, choices.POLICY_LOSSES),
        (LOSS_REDUCTIONS, choices.LOSS_REDUCTIONS),
        (TIS_RATIOS, choices.TIS_RATIO_TYPES),
        (SEQUENCE_MASKS, choices.SEQUENCE_MASK_METRICS),
        (KL_CONTROLLERS, choices.KL_CONTROLLERS),
    ],
)
def test_registry_matches_config_choices(registry, names):
    assert registry.names() == sorted(names)


def test_covariance_losses_are_the_ones_the_config_refuses_with_tis():
    assert set(COVARIANCE_LOSSES) == set(choices.COVARIANCE_POLICY_LOSSES) <= set(POLICY_LOSSES.names())


def test_loss_settings_from_the_loaded_config():
    cfg = load_config(["trainer.algorithm.policy_loss_type=gspo", "trainer.algorithm.eps_clip_high=0.0004"])
    settings = LossSettings.from_config(cfg.trainer.algorithm, cfg.generator)
    assert settings.policy_loss_type == "gspo" and settings.eps_clip_high == 0.0004
    assert settings.max_generate_length == cfg.generator.max_generate_length
    assert settings.use_kl_loss == cfg.trainer.algorithm.use_kl_loss
    assert settings.kl_estimator_type == cfg.trainer.algorithm.kl_estimator_type


def test_loss_options_and_kl_controller_from_the_loaded_config():
    cfg = load_config(
        [
            "trainer.algorithm.policy_loss_type=kl_cov",
            "trainer.algorithm.kl_cov.kl_cov_frac=0.1",
            "trainer.algorithm.sapo.tau_neg=2.0",
            "trainer.algorithm.use_kl_loss=false",
            "trainer.algorithm.use_kl_in_reward=true",
            "trainer.algorithm.kl_ctrl.type=adaptive",
            "trainer.algorithm.kl_ctrl.horizon=500",
        ]
    )
    settings = LossSettings.from_config(cfg.trainer.algorithm, cfg.generator)
    assert (settings.kl_cov_frac, settings.tau_neg, settings.clip_cov_ratio) == (0.1, 2.0, 0.0002)
    ctrl = kl_controller(cfg.trainer.algorithm)
    assert isinstance(ctrl, AdaptiveKLController) and (ctrl.value, ctrl.horizon) == (0.001, 500)
