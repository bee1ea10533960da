"""One layout's estimate: the terms each option changes, against hand arithmetic (Qwen2.5-0.5B's shape)."""

from __future__ import annotations

import pytest

from rl.backends.planner import EngineInputs, Knobs, Layout, PlanInputs, estimate, shape_from_config
from rl.backends.planner.terms import GIB
from tests.testing.model_configs import QWEN25_05B

SHAPE = shape_from_config(QWEN25_05B)
P = 494_032_768
V = 151936


def _estimate(knobs=None, **kw):
    knobs = knobs or Knobs("fsdp2")
    inputs = PlanInputs(shape=SHAPE, **{"train_tokens": 1024, "forward_tokens": 1024, **kw})
    return estimate(inputs, Layout(knobs.strategy), knobs)


def test_plain_fsdp2_terms():
    e = _estimate(world=4)
    assert e.terms["params"] == e.terms["grads"] == 4 * P / 4 and e.terms["optimizer"] == 8 * P / 4
    assert e.terms["logits"] == 1024 * V * 2 * 2  # bf16 logits and their gradient
    assert e.terms["runtime"] == GIB and set(e.phases) == {"train", "optimizer", "logprobs"}


def test_lora_trains_adapters_only():
    adapters = SHAPE.lora_params(8, ("all-linear",))
    e = _estimate(lora_rank=8)
    assert e.terms["params"] == 4 * (P + adapters)
    assert (e.terms["grads"], e.terms["optimizer"]) == (4 * adapters, 8 * adapters)


def test_fused_loss_replaces_the_logits():
    assert _estimate(fused=True).terms["logits"] == 2 * 110 * V * 4  # 64 MiB of fp32 logits: 110 tokens a chunk
    assert _estimate(fused=True, fused_chunk=4096).terms["logits"] == 2 * 1024 * V * 4  # no more than the tokens


def test_critic_and_reference():
    e = _estimate(critic_shape=SHAPE, ref_shape=SHAPE)
    assert e.terms["critic"] == 4 * P + 8 * P and e.terms["ref"] == 4 * P
    assert "critic" in e.phases


def test_colocated_vllm_claims_its_share_while_generating():
    e = _estimate(gpu_bytes=80 * GIB, engine=EngineInputs("vllm", 0.5, sequence_tokens=1024))
    resident = e.terms["params"] + e.terms["optimizer"] + e.terms["runtime"]
    assert e.phases["generate"] == pytest.approx(resident + 40 * GIB)
    starved = _estimate(gpu_bytes=2 * GIB, engine=EngineInputs("vllm", 0.4, sequence_tokens=1024))
    assert starved.engine_problem and "generator.gpu_memory_utilization" in starved.engine_problem
    assert starved.fits(2 * GIB) is False


def test_checkpointing_keeps_layer_inputs():
    plain, ckpt = _estimate(), _estimate(Knobs("fsdp2", checkpointing=True))
    assert ckpt.terms["activations"] < plain.terms["activations"] / 10
