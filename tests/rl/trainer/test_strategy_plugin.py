"""Adding a backend is one module, one registry entry and one config block: a strategy registered by this test alone
(`ddp_strategy.py`: torch DDP, block `trainer.policy.ddp_config`) is chosen by `--strategy`, its block is typed,
checked and saved with the run's config, and its first step through the real launcher (Ray workers, one gloo group)
equals fsdp2's on the same job."""

import os
import re

import pytest
import yaml

from rl.backends.registry import STRATEGIES
from rl.core.config import ConfigError, load_config
from rl.core.config.strategies import register, unregister
from rl.trainer.state.metrics import read_metrics
from tests.rl.trainer.ddp_strategy import DDPStrategy
from tests.testing.tiny_job import make_tiny_job, run_train

NONZERO = ["data.reward_fn=gsm8k_flexible", "trainer.algorithm.use_entropy_loss=true"]
COMPARED = ("loss", "pg_loss", "entropy", "grad_norm", "kl")


@pytest.fixture(scope="module")
def ddp():
    register(DDPStrategy())
    yield
    unregister("ddp")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


def test_unregistered_it_is_unknown():
    """Runs before the module's registration (pytest keeps file order)."""
    assert "ddp" not in STRATEGIES
    with pytest.raises(ConfigError, match=re.escape("trainer.strategy: got 'ddp'")):
        load_config([], strategy="ddp")


def test_its_block_is_typed_and_checked_and_belongs_to_it_alone(ddp):
    cfg = load_config(["trainer.policy.ddp_config.bucket_cap_mb=10"], strategy="ddp")
    assert cfg.blocks["trainer.policy.ddp_config"].bucket_cap_mb == 10
    with pytest.raises(ConfigError, match=re.escape("trainer.policy.ddp_config.bucket_cap_mb: must be >= 1")):
        load_config(["trainer.policy.ddp_config.bucket_cap_mb=0"], strategy="ddp")
    with pytest.raises(ConfigError, match="expected an integer"):
        load_config(["trainer.policy.ddp_config.bucket_cap_mb=big"], strategy="ddp")
    with pytest.raises(ConfigError, match=re.escape("only applies to trainer.strategy=ddp")):
        load_config(["trainer.policy.ddp_config.bucket_cap_mb=10"], strategy="fsdp2")
    with pytest.raises(ConfigError, match=re.escape("only applies to trainer.strategy=fsdp or fsdp2")):
        load_config(["trainer.policy.fsdp_config.fsdp_size=1"], strategy="ddp")


def test_first_step_through_the_launcher_matches_fsdp2(ddp, job, tmp_path):
    from absl import flags

    from rl.launch import train

    overrides = [*job.overrides(steps=1), *NONZERO, "trainer.placement.policy_num_gpus_per_node=2"]
    run_dir = str(tmp_path / "ddp")
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["train", "--strategy=ddp", f"--run_dir={run_dir}"])
    assert train.main(["train", *overrides, "trainer.policy.ddp_config.bucket_cap_mb=1"]) == 0
    with open(os.path.join(run_dir, "config.yaml")) as f:
        assert yaml.safe_load(f)["trainer"]["policy"]["ddp_config"] == {"bucket_cap_mb": 1,
                                                                         "gradient_as_bucket_view": False}
    got = next(row for row in read_metrics(f"{run_dir}/metrics.jsonl") if row["step"] == 1)

    reference_dir = str(tmp_path / "fsdp2")
    result = run_train(reference_dir, [*overrides, "trainer.strategy=fsdp2"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    reference = next(row for row in read_metrics(f"{reference_dir}/metrics.jsonl") if row["step"] == 1)
    assert got["reward_mean"] == reference["reward_mean"]
    assert reference["grad_norm"] > 0
    for key in COMPARED:
        assert got[key] == pytest.approx(reference[key], rel=1e-4, abs=1e-6), key
