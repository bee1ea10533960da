"""The critic (value model) on the fsdp2, fsdp and DeepSpeed (ZeRO-2, ZeRO-3) backends (one process), whole and with
LoRA, against independent plain-torch oracles: transformers' own one-label token classifier (the backbone plus a
linear `score` head) holding the same initial head, and for LoRA PEFT's token-classification model over it
(`task_type=TOKEN_CLS`: the adapters plus the `score` head trained whole as `modules_to_save`) with the same
initial adapters; values read off the positions before each token, PPO's clipped value loss written out here, AdamW
with the same clipping. Values, value losses and trained weights after two steps agree within float32 rounding, a
LoRA critic's base weights bit for bit; an export loads with `AutoModelForTokenClassification` to the critic's
values; a checkpoint resumes exactly and converts to the export's weights."""

import os

import pytest
import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForTokenClassification

from rl.backends.base import ModelSpec
from rl.backends.dist import init_distributed
from rl.backends.hf_model import save_hf_checkpoint
from rl.backends.registry import build_backend
from rl.backends.value_head import new_head
from rl.core.algorithms import LossNormalizer
from rl.core.algorithms.value_loss import ValueLossSettings
from rl.core.packing import pack_sequences
from tests.testing import tolerances
from tests.testing.backend_steps import write_small_qwen

LR = 1e-2
CLIP = 0.05  # small enough that the clipped term decides for some tokens at the second step
SETTINGS = ValueLossSettings(value_clip=CLIP, loss_reduction="token_mean")
STRATEGIES = {"fsdp2": ("fsdp2", None), "fsdp": ("fsdp", None), "zero2": ("deepspeed", None),
              "zero3": ("deepspeed", {"zero_optimization": {"stage": 3}})}
LORA = dict(rank=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"], exclude_modules=None,
            init_method="gaussian", merge_on_export=False)
PEFT_PREFIX = "base_model.model."  # PeftModel's prefix of the wrapped model's names


@pytest.fixture(scope="module", autouse=True)
def _process_group():
    init_distributed(0, 1, "127.0.0.1", 0)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_small_qwen(str(tmp_path_factory.mktemp("base")))


@pytest.fixture(params=list(STRATEGIES))
def strategy(request):
    return STRATEGIES[request.param]


@pytest.fixture(params=[None, LORA], ids=["whole", "lora"])
def lora(request):
    return request.param


def _critic(path, strategy, lora=None):
    name, options = strategy
    # float32 on every device (trainer.bf16=false): the oracle is float32
    spec = ModelSpec(path=path, role="critic", temperature=1.0, lr=LR, weight_decay=0.0, backend_options=options,
                     bf16=False, lora=lora)
    return build_backend(name, spec, init_distributed(0, 1, "127.0.0.1", 0))


def _oracle(path, critic=None, lora=None):
    """The token classifier with the critic's initial head; with `lora`, PEFT's adapters on it holding the critic's
    initial adapters. Returns (model, {oracle parameter name: the critic's own name})."""
    config = AutoConfig.from_pretrained(path, num_labels=1)
    config.classifier_dropout = 0.0
    model = AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=torch.float32)
    head = new_head(model.config.hidden_size)
    with torch.no_grad():
        model.score.weight.copy_(head["weight"])
        model.score.bias.copy_(head["bias"])
    if lora is None:
        return model, {name: name.replace("score.", "lm_head.") for name, _ in model.named_parameters()}
    peft_config = LoraConfig(task_type="TOKEN_CLS", r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=0.0,
                             target_modules=lora["target_modules"], init_lora_weights="gaussian")
    model = get_peft_model(model, peft_config)
    names = {}
    for name, _ in model.named_parameters():
        own = name.removeprefix(PEFT_PREFIX)
        if own.startswith("score.original_module."):
            continue  # PEFT's frozen copy of the head it trains
        names[name] = own.replace("score.modules_to_save.default.", "lm_head.")
    initial = critic.own_state_dict()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(initial[names[name]])
    return model, names


def _batch():
    """Three packed sequences with returns of either sign and the first two tokens of each outside the loss."""
    g = torch.Generator().manual_seed(1)
    seqs = []
    for n in (6, 9, 4):
        mask = torch.arange(n) >= 2
        seqs.append({"input_ids": torch.randint(3, 20, (n,), generator=g), "loss_mask": mask,
                     "returns": torch.randn(n, generator=g) * mask, "old_values": torch.zeros(n)})
    return pack_sequences(seqs)


def _oracle_values(model, batch):
    """Each sequence alone through the classifier; the value of token t is the output at position t - 1."""
    out = torch.zeros(batch.num_tokens)
    for start, end in zip(batch.cu_seqlens[:-1].tolist(), batch.cu_seqlens[1:].tolist(), strict=True):
        scores = model(input_ids=batch.input_ids[None, start:end]).logits[0, :, 0]
        out = out.index_put((torch.arange(start + 1, end),), scores[:-1])
    return out * batch.loss_mask


def _oracle_loss(values, old, returns, mask):
    """0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2), mean over the loss tokens."""
    clipped = old + torch.clamp(values - old, -CLIP, CLIP)
    per_token = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return per_token[mask].sum() / mask.sum()


def _rtol(config, batch, lora=None) -> float:
    reductions = tolerances.decoder_reductions(config, int(batch.seq_lengths.max()), int(batch.loss_mask.sum()),
                                               lora["rank"] if lora else 0)
    return tolerances.network_rtol(reductions, torch.float32)


def test_two_steps_match_the_token_classifier_oracle(model_path, strategy, lora):
    critic = _critic(model_path, strategy, lora)
    oracle, names = _oracle(model_path, critic, lora)
    start = {name: value.clone() for name, value in critic.own_state_dict().items()}
    params = {name: param for name, param in oracle.named_parameters() if param.requires_grad}
    assert {names[name] for name in params} >= {"lm_head.weight", "lm_head.bias"}
    assert lora is None or all("lora_" in name or "score." in name for name in params)
    optimizer = torch.optim.AdamW(params.values(), lr=LR, weight_decay=0.0, fused=True)
    grads = {name: [] for name in params}

    def record_gradients(*_):  # the oracle's clipped gradients, as Adam sees them
        for name, param in params.items():
            grads[name].append(param.grad.clone())

    optimizer.register_step_pre_hook(record_gradients)
    batch = _batch()
    rtol = _rtol(oracle.config, batch, lora)
    first = None  # the values before the first step stay the old ones (PPO epochs over one batch): step 2 clips
    for step in range(2):
        got_old = critic.values(batch)
        want_old = _oracle_values(oracle.eval(), batch).detach()
        tolerances.assert_within(got_old, want_old, rtol * float(want_old.abs().max()), msg=f"values, step {step}")
        first = want_old if first is None else first
        step_batch = batch.replace(old_values=first)
        normalizer = LossNormalizer.from_counts("token_mean", int(batch.loss_mask.sum()), 3)
        got = critic.forward_backward(step_batch, SETTINGS, normalizer)
        critic.optimizer_step()
        values = _oracle_values(oracle.train(), batch)
        loss = _oracle_loss(values, step_batch.old_values, batch.returns, batch.loss_mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        # the loss is a mean of squared gaps of size ~|R - V|: rounding relative to its terms
        scale = float(((values - batch.returns) ** 2)[batch.loss_mask].mean())
        assert got["vf_loss"] == pytest.approx(float(loss), rel=rtol, abs=rtol * scale), f"step {step}"
    assert got["vf_clipfrac"] > 0, "the clipped term decided for some tokens"
    state = critic.own_state_dict()  # the head under its place in the module tree, `lm_head`
    for name, value in oracle.state_dict().items():
        own = names.get(name)
        if own is None:
            continue
        if name not in params:  # frozen (a LoRA critic's base): never rounded, so bit for bit
            assert torch.equal(state[own], start[own]) and torch.equal(state[own], value), f"{own} moved"
            continue
        # gradients within rtol * max|g| of the oracle's; Adam turns that into `adam_gap`; each run rounds the
        # weight once per step
        bound = tolerances.adam_gap(grads[name], [rtol * g.abs().max() for g in grads[name]], LR)
        bound += 2 * 2 * tolerances.unit_roundoff(torch.float32) * value.abs().double()
        tolerances.assert_within(state[own], value, bound, msg=name)


def test_export_loads_as_a_token_classifier_and_a_checkpoint_resumes_exactly(model_path, strategy, lora, tmp_path):
    critic = _critic(model_path, strategy, lora)
    batch = _batch()
    normalizer = LossNormalizer.from_counts("token_mean", int(batch.loss_mask.sum()), 3)

    def step():
        old = critic.values(batch)
        out = critic.forward_backward(batch.replace(old_values=old), SETTINGS, normalizer)
        critic.optimizer_step()
        return out["vf_loss"]

    step()
    folder = str(tmp_path / "export")
    save_hf_checkpoint(model_path, critic.full_state_dict(), folder, critic=True)  # a LoRA critic's merged
    loaded = AutoModelForTokenClassification.from_pretrained(folder, dtype=torch.float32).eval()
    want = critic.values(batch)
    got = _oracle_values(loaded, batch).detach()
    tolerances.assert_within(got, want, _rtol(loaded.config, batch, lora) * float(want.abs().max()), msg="exported")
    path = str(tmp_path / "ckpt")
    critic.save_checkpoint(path)
    converted = type(critic).checkpoint_weights(path, model_path)  # what `rl.launch.convert --model=critic` reads
    exported = load_file(os.path.join(folder, "model.safetensors"))
    assert {n.replace("lm_head.", "score.") for n in converted} >= exported.keys()
    for name, value in converted.items():
        if name.replace("lm_head.", "score.") in exported:  # merged in float32 alike: the same rounding
            assert torch.equal(value, exported[name.replace("lm_head.", "score.")]), name
    continued = [step(), step()]
    resumed = _critic(model_path, strategy, lora)
    resumed.load_checkpoint(path)
    critic = resumed
    assert [step(), step()] == continued, "resumed from the checkpoint, the same steps give the same losses"
    # a critic that starts from the export keeps its trained head
    again = _critic(folder, strategy)
    tolerances.assert_within(again.values(batch), want, _rtol(loaded.config, batch) * float(want.abs().max()),
                             msg="restarted from the export")
