"""The critic (value model) on the fsdp2, fsdp and DeepSpeed (ZeRO-2, ZeRO-3) backends (one process), against an
independent plain-torch oracle: transformers' own one-label token classifier (the backbone plus a linear `score`
head) holding the same initial head, its values read off the positions before each token, PPO's clipped value
loss written out here, AdamW with the same clipping. Values, value losses and weights after two steps agree
within float32 rounding; an export loads with `AutoModelForTokenClassification` to the critic's values; a
checkpoint resumes exactly."""

import pytest
import torch
import torch.distributed as dist
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

PORT = 29673
LR = 1e-2
CLIP = 0.05  # small enough that the clipped term decides for some tokens at the second step
SETTINGS = ValueLossSettings(value_clip=CLIP, loss_reduction="token_mean")
STRATEGIES = {"fsdp2": ("fsdp2", None), "fsdp": ("fsdp", None), "zero2": ("deepspeed", None),
              "zero3": ("deepspeed", {"zero_optimization": {"stage": 3}})}


@pytest.fixture(scope="module", autouse=True)
def _process_group():
    init_distributed(0, 1, "127.0.0.1", PORT)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_small_qwen(str(tmp_path_factory.mktemp("base")))


@pytest.fixture(params=list(STRATEGIES))
def strategy(request):
    return STRATEGIES[request.param]


def _critic(path, strategy):
    name, options = strategy
    # float32 on every device (trainer.bf16=false): the oracle is float32
    spec = ModelSpec(path=path, role="critic", temperature=1.0, lr=LR, weight_decay=0.0, backend_options=options,
                     bf16=False)
    return build_backend(name, spec, init_distributed(0, 1, "127.0.0.1", PORT))


def _oracle(path):
    config = AutoConfig.from_pretrained(path, num_labels=1)
    config.classifier_dropout = 0.0
    model = AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=torch.float32)
    head = new_head(model.config.hidden_size)
    with torch.no_grad():
        model.score.weight.copy_(head["weight"])
        model.score.bias.copy_(head["bias"])
    return model


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


def _rtol(config, batch) -> float:
    reductions = tolerances.decoder_reductions(config, int(batch.seq_lengths.max()), int(batch.loss_mask.sum()))
    return tolerances.network_rtol(reductions, torch.float32)


def test_two_steps_match_the_token_classifier_oracle(model_path, strategy):
    critic, oracle = _critic(model_path, strategy), _oracle(model_path)
    params = dict(oracle.named_parameters())
    optimizer = torch.optim.AdamW(params.values(), lr=LR, weight_decay=0.0, fused=True)
    grads = {name: [] for name in params}

    def record_gradients(*_):  # the oracle's clipped gradients, as Adam sees them
        for name, param in params.items():
            grads[name].append(param.grad.clone())

    optimizer.register_step_pre_hook(record_gradients)
    batch = _batch()
    rtol = _rtol(oracle.config, batch)
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
        own = name.replace("score.", "lm_head.")
        # gradients within rtol * max|g| of the oracle's; Adam turns that into `adam_gap`; each run rounds the
        # weight once per step
        bound = tolerances.adam_gap(grads[name], [rtol * g.abs().max() for g in grads[name]], LR)
        bound += 2 * 2 * tolerances.unit_roundoff(torch.float32) * value.abs().double()
        tolerances.assert_within(state[own], value, bound, msg=name)


def test_export_loads_as_a_token_classifier_and_a_checkpoint_resumes_exactly(model_path, strategy, tmp_path):
    critic = _critic(model_path, strategy)
    batch = _batch()
    normalizer = LossNormalizer.from_counts("token_mean", int(batch.loss_mask.sum()), 3)

    def step():
        old = critic.values(batch)
        out = critic.forward_backward(batch.replace(old_values=old), SETTINGS, normalizer)
        critic.optimizer_step()
        return out["vf_loss"]

    step()
    folder = str(tmp_path / "export")
    save_hf_checkpoint(model_path, critic.full_state_dict(), folder, critic=True)
    loaded = AutoModelForTokenClassification.from_pretrained(folder, dtype=torch.float32).eval()
    want = critic.values(batch)
    got = _oracle_values(loaded, batch).detach()
    tolerances.assert_within(got, want, _rtol(loaded.config, batch) * float(want.abs().max()), msg="exported")
    path = str(tmp_path / "ckpt")
    critic.save_checkpoint(path)
    continued = [step(), step()]
    resumed = _critic(model_path, strategy)
    resumed.load_checkpoint(path)
    critic = resumed
    assert [step(), step()] == continued, "resumed from the checkpoint, the same steps give the same losses"
    # a critic that starts from the export keeps its trained head
    again = _critic(folder, strategy)
    tolerances.assert_within(again.values(batch), want, _rtol(loaded.config, batch) * float(want.abs().max()),
                             msg="restarted from the export")
