"""Typed run configuration: defaults in defaults.yaml, types and reference docs in schema.py (the algorithm block
in schema_algorithm.py, the model blocks in schema_models.py, generator: in schema_generator.py, data: and
environment: in schema_data.py).

from rl.core.config import load_config
cfg = load_config(["trainer.strategy=fsdp2", "generator.n_samples_per_prompt=8"], config_file="run.yaml")
"""

from rl.core.config.choices import (
    ADVANTAGE_ESTIMATORS,
    GENERATOR_BACKENDS,
    KERNELS,
    KL_ESTIMATORS,
    LOGGERS,
    LOSS_REDUCTIONS,
    POLICY_LOSSES,
)
from rl.core.config.defaults import DEFAULTS_PATH
from rl.core.config.errors import ConfigError
from rl.core.config.loader import config_from_dict, config_to_dict, load_config, save_config
from rl.core.config.parallel import ParallelSizes, parallel_sizes, policy_world_size, ref_world_size
from rl.core.config.schema import (
    AlgorithmConfig,
    Config,
    DataConfig,
    GeneratorConfig,
    ModelConfig,
    OptimizerConfig,
    PlacementConfig,
    PolicyConfig,
    RefConfig,
    TrainerConfig,
)
from rl.core.config.strategies import STRATEGIES, StrategyConfig
from rl.core.config.validate import validate_config

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "DEFAULTS_PATH",
    "GENERATOR_BACKENDS",
    "KERNELS",
    "KL_ESTIMATORS",
    "LOGGERS",
    "LOSS_REDUCTIONS",
    "POLICY_LOSSES",
    "STRATEGIES",
    "AlgorithmConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "GeneratorConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ParallelSizes",
    "PlacementConfig",
    "PolicyConfig",
    "RefConfig",
    "StrategyConfig",
    "TrainerConfig",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "parallel_sizes",
    "policy_world_size",
    "ref_world_size",
    "save_config",
    "validate_config",
]
