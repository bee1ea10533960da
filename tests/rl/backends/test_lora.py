"""LoRA on the fsdp2, fsdp and DeepSpeed (ZeRO-2, ZeRO-3) backends (one process), against plain transformers + PEFT
as the oracle: the same losses and adapter weights after three steps, base weights bit-identical, the reference
(adapters off) equal to the base model, merged weights equal to PEFT's merge, an exported adapter folder that PEFT
loads to the trainer's logits, and a checkpoint of the adapters alone that resumes exactly."""

import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from peft import PeftModel
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from transformers import AutoModelForCausalLM

from rl.backends.base import ModelSpec
from rl.backends.dist import init_distributed
from rl.backends.hf_forward import batch_logprobs, scored_logits
from rl.backends.lora import add_lora, save_adapter
from rl.backends.registry import build_backend
from rl.core.algorithms import LossNormalizer, LossSettings
from tests.testing import tolerances
from tests.testing.backend_steps import oracle_step, small_batch, write_small_qwen

LORA = dict(rank=8, alpha=16, dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                           "up_proj", "down_proj"],
            exclude_modules=None, init_method="gaussian", merge_on_export=False)
SETTINGS = LossSettings(use_kl_loss=False)
LR = 1e-2


@pytest.fixture(scope="module", autouse=True)
def _process_group():
    init_distributed(0, 1, "127.0.0.1", 0)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_small_qwen(str(tmp_path_factory.mktemp("base")))


STRATEGIES = {"fsdp2": ("fsdp2", None), "fsdp": ("fsdp", None), "zero2": ("deepspeed", None),
              "zero3": ("deepspeed", {"zero_optimization": {"stage": 3}})}


@pytest.fixture(params=list(STRATEGIES))
def strategy(request):
    return STRATEGIES[request.param]


def _backend(path, strategy=STRATEGIES["fsdp2"], lora=LORA):
    """float32 on every device (trainer.bf16=false): the oracle is float32 PEFT."""
    name, options = strategy
    spec = ModelSpec(path=path, role="policy", temperature=1.0, lr=LR, weight_decay=0.0, lora=lora,
                     backend_options=options, bf16=False)
    return build_backend(name, spec, init_distributed(0, 1, "127.0.0.1", 0))


def _own(backend):
    return {k: v.clone() for k, v in backend.own_state_dict().items()}


def _oracle(path, backend):
    """The base model with the same adapters (copied from the backend), on plain torch."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    add_lora(model, LORA, path)
    missing, unexpected = model.load_state_dict(_own(backend), strict=False)
    assert not missing and not unexpected
    return model


def _batch_step(batch, old):
    return batch.replace(old_logprobs=old)


def _float32_rtol(config, batch) -> float:
    """`tolerances.network_rtol` of this model's float32 forward and backward over the batch's tokens and its longest
    sequence, the adapters' rank included (`tolerances.decoder_reductions`)."""
    reductions = tolerances.decoder_reductions(config, int(batch.seq_lengths.max()), int(batch.input_ids.numel()),
                                               LORA["rank"])
    return tolerances.network_rtol(reductions, torch.float32)


def _logprob_gap(model, batch, adapter_rank: int = 0) -> float:
    """`tolerances.logprob_gap` of `model`'s float32 forward over the batch (its longest sequence, the adapters'
    two reductions when `adapter_rank`), relative to its largest logit on the scored positions."""
    with torch.no_grad():
        logits = scored_logits(model, batch).logits
    reductions = tolerances.decoder_reductions(model.config, int(batch.seq_lengths.max()), 0, adapter_rank)
    return tolerances.network_rtol(reductions, torch.float32) * float(logits.abs().max())


def test_three_steps_match_plain_torch_and_leave_the_base_untouched(model_path, strategy):
    backend = _backend(model_path, strategy)
    oracle = _oracle(model_path, backend)
    initial = _own(backend)
    before = {k: v for k, v in initial.items() if "lora_" not in k}
    trainable = [p for p in oracle.parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n, p in oracle.named_parameters() if p.requires_grad)
    optimizer = torch.optim.AdamW(trainable, lr=LR, weight_decay=0.0, fused=True)
    names = {id(p): n for n, p in oracle.named_parameters()}
    grads = {names[id(p)]: [] for p in trainable}  # the oracle's clipped gradients, as Adam sees them

    def record_gradients(*_):
        for p in trainable:
            grads[names[id(p)]].append(p.grad.clone())

    optimizer.register_step_pre_hook(record_gradients)
    for step in range(3):
        batch = small_batch()
        old, _ = backend.logprobs(batch)
        batch = _batch_step(batch, old)
        normalizer = LossNormalizer.from_counts("token_mean", int(batch.loss_mask.sum()), 3)
        got = backend.forward_backward(batch, SETTINGS, normalizer)
        backend.optimizer_step()
        loss = oracle_step(oracle, batch, SETTINGS, normalizer, trainable, optimizer)
        # The loss is a token mean of terms of size ~|advantage|: the network's float32 bound relative to them.
        rtol = _float32_rtol(oracle.config, batch)
        scale = float(batch.advantages[batch.loss_mask].abs().mean())
        assert got["loss"] == pytest.approx(loss, rel=rtol, abs=rtol * scale), f"step {step}"
    after = _own(backend)
    for name, value in oracle.state_dict().items():
        if name not in grads:  # frozen: never rounded, so bit for bit
            assert torch.equal(after[name], value), f"{name} differs from the oracle's"
            continue
        # Each gradient element is within rtol * (its tensor's largest |g|) of the oracle's (rounding relative to
        # the terms' size, not to an element that cancels to ~0); Adam turns that into a per-element weight gap
        # (`tolerances.adam_gap`: ~lr * r/|g| where |g| >> r, up to ~2 lr per step where a gradient sits in its
        # rounding noise). Each run also rounds the weight once per step. A weight gap feeding the next step's
        # gradients enters through the next steps' r only to second order.
        rtol = _float32_rtol(oracle.config, small_batch())
        bound = tolerances.adam_gap(grads[name], [rtol * g.abs().max() for g in grads[name]], LR)
        bound += 2 * 3 * tolerances.unit_roundoff(torch.float32) * value.abs().double()
        tolerances.assert_within(after[name], value, bound, msg=name)
    for name, value in before.items():
        assert torch.equal(after[name], value), f"{name} changed"
    assert all(not torch.equal(after[n], v) for n, v in initial.items() if "lora_B" in n), "every B trained"


def test_reference_view_is_the_base_model_and_merged_weights_are_pefts(model_path, strategy, tmp_path):
    backend = _backend(model_path, strategy)
    batch = small_batch()
    old, _ = backend.logprobs(batch)
    normalizer = LossNormalizer.from_counts("token_mean", int(batch.loss_mask.sum()), 3)
    backend.forward_backward(_batch_step(batch, old), SETTINGS, normalizer)
    backend.optimizer_step()
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    with backend.reference_view():
        ref, _ = backend.logprobs(batch)
    with torch.no_grad():
        want, _ = batch_logprobs(base, batch, 1.0, False)
    # The backend attends per sequence (sdpa_varlen), plain transformers over the packed row with a block mask:
    # the same sums in other orders, within `tolerances.logprob_gap` (masked positions add exact zeros, so the
    # attention's sums run over the longest sequence).
    ref_gap = _logprob_gap(base, batch)
    tolerances.assert_within(ref, want, ref_gap, "reference view vs the base model")
    trained, _ = backend.logprobs(batch)
    # One step moves every B from 0 to +-lr (Adam's first step is the gradient's sign), so the policy must move by
    # more than rounding alone can explain (the reference comparison's bound just above).
    moved = float((trained - want).abs().max())
    assert moved > ref_gap, f"the adapters change the policy: max |change| {moved:.3g} <= rounding {ref_gap:.3g}"
    # the exported adapter folder, loaded by PEFT on the base model, gives the trainer's logprobs
    folder = str(tmp_path / "adapter")
    save_adapter(folder, backend.adapter_state_dict(), LORA, model_path)
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32),
                                           folder).eval()
    with torch.no_grad():
        loaded, _ = batch_logprobs(peft_model, batch, 1.0, False)
    tolerances.assert_within(loaded, trained, _logprob_gap(peft_model, batch, LORA["rank"]), "PEFT's logprobs")
    # merged weights (what the engines get) are PEFT's merge: W + s (B @ A) on both sides (`lora.merged_items`,
    # PEFT's `get_delta_weight` and in-place add), the same operations in the same order, so bit for bit
    merged = backend.full_state_dict()
    expected = peft_model.merge_and_unload().state_dict()
    tied = {"lm_head.weight"}  # DeepSpeed names a tied weight once, as the embedding
    assert set(merged) - tied == set(expected) - tied
    for name, value in merged.items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=0, msg=name)
    buckets = {name: t for bucket in backend.weight_buckets(1 << 12) for name, t in bucket}
    assert set(buckets) - tied == set(merged) - tied
    for name, value in buckets.items():
        torch.testing.assert_close(value, merged[name], rtol=0, atol=0, msg=name)


def test_checkpoint_holds_the_adapters_and_resumes_exactly(model_path, strategy, tmp_path):
    backend = _backend(model_path, strategy)
    batch = small_batch()

    def step():
        old, _ = backend.logprobs(batch)
        normalizer = LossNormalizer.from_counts("token_mean", int(batch.loss_mask.sum()), 3)
        loss = backend.forward_backward(_batch_step(batch, old), SETTINGS, normalizer)["loss"]
        backend.optimizer_step()
        return loss

    step()
    path = str(tmp_path / "ckpt")
    backend.save_checkpoint(path)
    model_keys = _stored_model_keys(path)
    assert model_keys and all(".lora_A." in key or ".lora_B." in key for key in model_keys), model_keys
    if strategy[0] in ("fsdp2", "fsdp"):  # DCP lists every tensor it stored
        listed = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        adapters = [v.numel() for k, v in _own(backend).items() if "lora_" in k]
        stored = sum(math.prod(entry.size) for entry in listed.values() if isinstance(entry, TensorStorageMetadata))
        assert stored == 3 * sum(adapters) + len(adapters), "adapters, their Adam moments and steps; no base"
    converted = type(backend).checkpoint_weights(path, model_path)  # rl.launch.convert: base + adapters merged
    merged = backend.full_state_dict()
    assert set(merged) <= set(converted)
    for name, value in merged.items():  # `lora.merge_into` and `lora.merged_items`: the same W + s (B @ A)
        torch.testing.assert_close(converted[name], value, rtol=0, atol=0, msg=name)
    losses = [step(), step()]
    after = _own(backend)
    backend.load_checkpoint(path)
    assert [step(), step()] == losses
    for name, value in _own(backend).items():
        assert torch.equal(value, after[name]), name


def _stored_model_keys(path: str) -> list[str]:
    """The model tensors a checkpoint holds: DCP's metadata, or DeepSpeed's module state file."""
    if os.path.isfile(os.path.join(path, ".metadata")):
        listed = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        return [key for key in listed if key.startswith("model.")]
    (found,) = [f for f in os.listdir(os.path.join(path, "state")) if f.endswith("model_states.pt")]
    return list(torch.load(os.path.join(path, "state", found), weights_only=False)["module"])


def test_a_target_the_model_lacks_is_refused(model_path):
    with pytest.raises(ValueError, match="target_modules: Qwen2ForCausalLM has no linear layer named qkv_proj"):
        _backend(model_path, lora=dict(LORA, target_modules=["q_proj", "qkv_proj"]))
