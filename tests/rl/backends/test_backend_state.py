"""Each strategy in one process: its Hugging Face export loads in transformers with the trained weights, and its
checkpoint restores model and optimizer bit for bit."""

import os

import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from rl.backends.base import ModelSpec
from rl.backends.dist import init_distributed
from rl.backends.hf_model import save_hf_checkpoint
from rl.backends.registry import build_backend
from rl.core.algorithms import LossNormalizer, LossSettings
from tests.testing import tolerances
from tests.testing.backend_steps import small_batch, train_step
from tests.testing.tiny_job import make_tiny_job


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    info = init_distributed(0, 1, "127.0.0.1", 0)
    assert info.device.type == "cpu"
    yield make_tiny_job(str(tmp_path_factory.mktemp("job"))).model_path
    dist.destroy_process_group()


STRATEGIES = ["deepspeed", "fsdp", "fsdp2"]


# One warm-up step, then a cosine decay reaching min_lr at optimizer step 3: rates 1e-2, 1e-2, 5.5e-3, 1e-3
# (rl.core.algorithms.lr_schedule: min_lr + (lr - min_lr) (1 + cos(pi p)) / 2 at p = 0, 1/2, 1 after the warm-up).
SCHEDULE = {"lr_warmup_steps": 1, "scheduler": "cosine", "lr_decay_steps": 3, "min_lr": 1e-3}
SCHEDULED_RATES = [1e-2, 1e-2, 5.5e-3, 1e-3, 1e-3]


def _backend(path, strategy, **schedule):
    spec = ModelSpec(path=path, role="policy", temperature=1.0, lr=1e-2, **schedule)
    return build_backend(strategy, spec, init_distributed(0, 1, "127.0.0.1", 0))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_optimizer_step_takes_the_scheduled_rate(model_path, strategy):
    backend = _backend(model_path, strategy, **SCHEDULE)
    rates = [train_step(backend)["lr"] for _ in SCHEDULED_RATES]
    assert rates == pytest.approx(SCHEDULED_RATES, rel=0, abs=tolerances.lr_schedule_gap(1e-2))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_export_loads_in_transformers_with_the_trained_weights(model_path, tmp_path, strategy):
    backend = _backend(model_path, strategy)
    assert train_step(backend)["grad_norm"] > 0
    state = backend.full_state_dict()
    out = str(tmp_path / "export")
    save_hf_checkpoint(model_path, state, out)
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    original = AutoModelForCausalLM.from_pretrained(model_path).eval()
    batch = small_batch()
    with torch.no_grad():
        trained_lp, _ = backend.logprobs(batch)
    from rl.backends.hf_forward import batch_logprobs, scored_logits

    with torch.no_grad():
        loaded_lp, _ = batch_logprobs(loaded, batch, 1.0, False)
        original_lp, _ = batch_logprobs(original, batch, 1.0, False)
        logits = scored_logits(loaded, batch).logits
    # The backend attends per sequence (sdpa_varlen), plain transformers over the packed row with a block mask: the
    # same sums in other orders (masked positions add exact zeros, so attention sums over the longest sequence).
    gap = tolerances.logprob_gap(loaded.config, logits, int(batch.seq_lengths.max()))
    tolerances.assert_within(loaded_lp, trained_lp, gap, "exported model's logprobs")
    moved = float((original_lp - trained_lp).abs().max())
    assert moved > gap, f"the export must hold the trained weights: max |change| {moved:.3g} <= rounding {gap:.3g}"
    assert not os.path.exists(out + ".partial")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_checkpoint_round_trip_restores_training_exactly(model_path, tmp_path, strategy):
    """Mid-schedule: the resumed step takes the decayed rate the uninterrupted one takes."""
    first = _backend(model_path, strategy, **SCHEDULE)
    for _ in range(2):
        train_step(first)
    first.save_checkpoint(str(tmp_path / "ckpt"))
    expected = train_step(first)
    assert expected["lr"] == pytest.approx(SCHEDULED_RATES[2], rel=0, abs=tolerances.lr_schedule_gap(1e-2))
    expected_state = first.full_state_dict()

    second = _backend(model_path, strategy, **SCHEDULE)
    second.load_checkpoint(str(tmp_path / "ckpt"))
    got = train_step(second)
    assert got == expected
    for name, tensor in second.full_state_dict().items():
        torch.testing.assert_close(tensor, expected_state[name], rtol=0, atol=0)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_checkpoint_before_the_first_step_changes_nothing(model_path, tmp_path, strategy):
    """A model checkpointed before its first optimizer step (a policy during the critic's warm-up) takes the first
    step of one never checkpointed, and so does one resumed from that checkpoint: Adam's first update (its bias
    correction counts the steps) must not see a step that was never taken."""
    plain = _backend(model_path, strategy)
    expected = train_step(plain)
    expected_state = plain.full_state_dict()
    for resume in (False, True):
        saved = _backend(model_path, strategy)
        saved.save_checkpoint(str(tmp_path / f"ckpt-{resume}"))
        if resume:
            saved = _backend(model_path, strategy)
            saved.load_checkpoint(str(tmp_path / f"ckpt-{resume}"))
        assert train_step(saved) == expected, f"resumed: {resume}"
        for name, tensor in saved.full_state_dict().items():
            assert torch.equal(tensor, expected_state[name]), f"resumed: {resume}: {name}"


def test_on_policy_step_without_old_logprobs_equals_the_recomputed_one(model_path):
    """One optimizer step per rollout batch: the loss may take the training forward's own logprobs (detached) as the
    old ones, which is what the trainer does instead of a separate old-logprob pass. Oracle: the same step with the
    old logprobs recomputed by `logprobs()`, as the trainer does when a rollout batch has several mini-batches."""
    settings = LossSettings(use_kl_loss=False)
    results = {}
    for name in ("recomputed", "on_policy"):
        backend = _backend(model_path, "fsdp2")
        batch = small_batch()
        old = backend.logprobs(batch)[0] if name == "recomputed" else None
        normalizer = LossNormalizer.from_counts("token_mean", int(batch.loss_mask.sum()), 3)
        metrics = backend.forward_backward(batch.replace(old_logprobs=old), settings, normalizer)
        metrics.update(backend.optimizer_step())
        results[name] = (metrics, backend.full_state_dict())
    (want, want_state), (got, got_state) = results["recomputed"], results["on_policy"]
    assert want["grad_norm"] > 0 and want.keys() == got.keys()
    # `logprobs()` runs the training forward's operations in the same order (no dropout, the same attention and
    # log-softmax; no_grad changes no kernel), so the recomputed old logprobs equal the forward's own bit for bit,
    # the ratio is exactly 1 on both sides and the loss, its gradients and Adam's step are the same operations.
    assert got == want
    assert got["pg_clipfrac"] == 0.0
    for name, tensor in want_state.items():
        torch.testing.assert_close(got_state[name], tensor, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize(("strategy", "role"), [("fsdp2", "policy"), ("fsdp", "ref"), ("fsdp2", "ref")])
def test_cpu_offload_on_a_cpu_machine_trains_like_without_it(model_path, strategy, role, capsys):
    """`fsdp_config.cpu_offload` has nothing to move on a CPU machine: the backend says so and runs as without it
    (FSDP's offload needs an accelerator and would fail)."""
    from rl.backends import fsdp_config

    fsdp_config._say_once.cache_clear()  # said once per process: this case must hear it
    info = init_distributed(0, 1, "127.0.0.1", 0)
    built = {offload: build_backend(strategy, ModelSpec(path=model_path, role=role, temperature=1.0, lr=1e-2,
                                                        backend_options={"cpu_offload": offload}), info)
             for offload in (False, True)}
    assert "nothing to offload" in capsys.readouterr().out
    batch = small_batch()
    torch.testing.assert_close(built[True].logprobs(batch)[0], built[False].logprobs(batch)[0], rtol=0, atol=0)
    if role == "policy":
        assert train_step(built[True]) == pytest.approx(train_step(built[False]))
