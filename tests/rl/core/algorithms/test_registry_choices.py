"""The algorithm registries offer exactly the names the config accepts (rl/core/config/choices.py), and
LossSettings reads the loaded config."""

import pytest

import rl.backends.registry  # noqa: F401  (registers the training strategies the config names)
from rl.core.algorithms import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_REDUCTIONS, POLICY_LOSSES, LossSettings
from rl.core.algorithms.off_policy import SEQUENCE_MASKS, TIS_RATIOS
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
    ],
)
def test_registry_matches_config_choices(registry, names):
    assert registry.names() == sorted(names)


def test_loss_settings_from_the_loaded_config():
    cfg = load_config(["trainer.algorithm.policy_loss_type=gspo", "trainer.algorithm.eps_clip_high=0.0004"])
    settings = LossSettings.from_config(cfg.trainer.algorithm, cfg.generator)
    assert settings.policy_loss_type == "gspo" and settings.eps_clip_high == 0.0004
    assert settings.max_generate_length == cfg.generator.max_generate_length
    assert settings.use_kl_loss == cfg.trainer.algorithm.use_kl_loss
    assert settings.kl_estimator_type == cfg.trainer.algorithm.kl_estimator_type
