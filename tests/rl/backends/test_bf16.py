"""`trainer.bf16` (ModelSpec.bf16) on fsdp2, fsdp, deepspeed and megatron, in one process on this machine's device
(CPU included): with `true` the forward's and backward's matrix products take bfloat16 operands while the weights
the optimizer updates and the logprobs stay float32, and the logprobs and the step-1 loss differ from a float32
transformers oracle by more than float32 rounding can explain yet within bfloat16 rounding; with `false` every
product is float32 and the results are the oracle's up to float32 rounding."""

import importlib.util
import itertools
import math

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rl.backends.base import ModelSpec
from rl.backends.dist import init_distributed
from rl.backends.hf_forward import batch_logprobs
from rl.backends.hf_model import attention_implementation
from rl.backends.registry import build_backend
from rl.core.algorithms import LossNormalizer, LossSettings, compute_policy_loss
from tests.testing import tolerances
from tests.testing.backend_steps import small_batch

STRATEGIES = ["fsdp2", "fsdp", "deepspeed", "megatron"]
NEEDS = {"deepspeed": "deepspeed", "megatron": "megatron.core"}
SETTINGS = LossSettings(use_kl_loss=False)
MATMULS = {"mm": (0, 1), "addmm": (1, 2), "bmm": (0, 1), "baddbmm": (1, 2)}  # op -> its two operands' positions


@pytest.fixture(scope="module")
def info():
    info = init_distributed(0, 1, "127.0.0.1", 0)
    yield info
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    path = str(tmp_path_factory.mktemp("model"))
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


class MatmulFlops(TorchDispatchMode):
    """Floating-point operations of the matrix products and attention kernels that run inside it (forward and
    backward), by the dtype of their operands."""

    def __init__(self):
        super().__init__()
        self.flops: dict[torch.dtype, float] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in MATMULS:
            a, b = (args[i] for i in MATMULS[name])
            self._count(a.dtype, 2 * math.prod(a.shape) * b.shape[-1])
        elif "scaled_dot_product" in name and "backward" not in name:
            q, k = args[0], args[1]
            self._count(q.dtype, 4 * math.prod(q.shape[:-1]) * k.shape[-2] * q.shape[-1])
        return func(*args, **(kwargs or {}))

    def _count(self, dtype: torch.dtype, flops: float) -> None:
        self.flops[dtype] = self.flops.get(dtype, 0.0) + flops

    def share(self, dtype: torch.dtype) -> float:
        return self.flops.get(dtype, 0.0) / sum(self.flops.values())


def _torch_optimizers(backend) -> list[torch.optim.Optimizer]:
    """The torch optimizers whose parameters are the weights the updates land in (DeepSpeed's and megatron's hold
    their float32 master copies)."""
    if hasattr(backend, "engine"):
        return [backend.engine.optimizer.optimizer]
    if hasattr(backend.optimizer, "torch_optimizers"):
        return backend.optimizer.torch_optimizers()
    return [backend.optimizer]


def _bf16_rtol(config) -> float:
    """Relative gap (to the largest |logit|) of a bfloat16 mixed-precision forward's logits or logprobs from a
    float32 one: products and sums accumulate in float32, and on the path to a logit every operand and output is
    rounded to bfloat16 once (`tolerances.rounded_gap`, chained): per layer two norms (normalized input, weight,
    product: 3 each), four attention projections and three MLP projections (weight and output: 2 each), the
    rotary embedding (cos, sin, output), the attention's scores, softmax and weighted sum, two residual sums, the
    MLP's activation and gate product: 30; the embedding, the final norm (3) and the head (weight, logits): 6. A
    logprob is a logit less a log-sum-exp of logits, each off by that much: twice gamma_n(bf16)."""
    return 2 * tolerances.gamma(6 + 30 * config.num_hidden_layers, torch.bfloat16)


def _oracle(model_path, batch):
    """float32 transformers on CPU: the logprobs, and the largest |logit| of each sequence alone (their scale)."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        logprobs, _ = batch_logprobs(model, batch, 1.0, False)
        bounds = batch.cu_seqlens.tolist()
        scale = max(
            float(model(input_ids=batch.input_ids[None, s:e]).logits.abs().max()) for s, e in itertools.pairwise(bounds)
        )
    return model.config, logprobs, scale


def _run(info, model_path, strategy: str, bf16: bool, old_logprobs: torch.Tensor) -> dict:
    """Builds the backend, takes its logprobs and one step of the policy loss against `old_logprobs`."""
    spec = ModelSpec(path=model_path, role="policy", temperature=1.0, lr=1e-2, weight_decay=0.0, bf16=bf16)
    backend = build_backend(strategy, spec, info)
    try:
        batch = small_batch()
        normalizer = LossNormalizer.from_counts("token_mean", int(batch.loss_mask.sum()), batch.num_sequences)
        with MatmulFlops() as counted:
            logprobs, _ = backend.logprobs(batch)
            loss = backend.forward_backward(batch.replace(old_logprobs=old_logprobs), SETTINGS, normalizer)["loss"]
            stats = backend.optimizer_step()
        masters = {p.dtype for opt in _torch_optimizers(backend) for group in opt.param_groups for p in group["params"]}
        return {
            "logprobs": logprobs,
            "loss": loss,
            "grad_norm": stats["grad_norm"],
            "counted": counted,
            "masters": masters,
        }
    finally:
        if strategy == "megatron":
            from megatron.core import parallel_state

            parallel_state.destroy_model_parallel()


def _need(strategy: str) -> None:
    if strategy in NEEDS:
        pytest.importorskip(NEEDS[strategy])


def _bounds(model_path, batch):
    """The float32 oracle's logprobs and loss, and the logprob and loss gaps float32 and bfloat16 rounding allow."""
    config, want, scale = _oracle(model_path, batch)
    mask = batch.loss_mask
    fp32_gap = tolerances.logprob_gap(config, torch.tensor(scale), int(batch.seq_lengths.max()))
    bf16_gap = fp32_gap + _bf16_rtol(config) * scale
    # The step's loss is a token mean of -advantage * exp(logprob - old) (no clipping this close to 1): off by at
    # most mean |advantage| * (exp(logprob gap) - 1) from the oracle's, whose ratio is exactly 1.
    adv_scale = float(batch.advantages[mask].abs().mean())
    normalizer = LossNormalizer.from_counts("token_mean", int(mask.sum()), batch.num_sequences)
    loss = float(compute_policy_loss(SETTINGS, want, want, batch.advantages, mask, normalizer)[0])
    return want, loss, fp32_gap, bf16_gap, adv_scale * math.expm1(fp32_gap), adv_scale * math.expm1(bf16_gap)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bf16_computes_in_bfloat16_with_float32_weights_and_logprobs(info, model_path, strategy):
    _need(strategy)
    batch = small_batch()
    mask = batch.loss_mask
    want, oracle_loss, fp32_gap, bf16_gap, fp32_loss_gap, bf16_loss_gap = _bounds(model_path, batch)
    runs = {bf16: _run(info, model_path, strategy, bf16, want) for bf16 in (False, True)}

    fp32, bf16 = runs[False], runs[True]
    for run in (fp32, bf16):
        assert run["logprobs"].dtype == torch.float32
        assert run["masters"] == {torch.float32}, "the optimizer updates float32 weights"
        assert 0 < run["grad_norm"] < math.inf
    assert fp32["counted"].share(torch.bfloat16) == 0, fp32["counted"].flops
    # A model may keep a small float32 product of its own (a rotary embedding's angles): not 1, but nearly.
    assert bf16["counted"].share(torch.bfloat16) > 0.99, bf16["counted"].flops

    tolerances.assert_within(fp32["logprobs"][mask], want[mask], fp32_gap, msg="float32 logprobs")
    gap = float((bf16["logprobs"][mask] - want[mask]).abs().max())
    assert gap > fp32_gap, f"bf16 logprobs within float32 rounding ({gap:.3g} <= {fp32_gap:.3g}): not bf16"
    tolerances.assert_within(bf16["logprobs"][mask], want[mask], bf16_gap, msg="bf16 logprobs")

    assert fp32["loss"] == pytest.approx(oracle_loss, abs=fp32_loss_gap)
    assert bf16["loss"] != fp32["loss"]
    assert bf16["loss"] == pytest.approx(oracle_loss, abs=bf16_loss_gap)


def test_the_strategies_bf16_step_losses_agree(info, model_path):
    """Each installed strategy's bfloat16 step-1 loss within bfloat16 rounding of the float32 oracle's, so within
    twice that of each other's."""
    batch = small_batch()
    want, oracle_loss, _, _, _, bf16_loss_gap = _bounds(model_path, batch)
    available = [s for s in STRATEGIES if s not in NEEDS or importlib.util.find_spec(NEEDS[s].split(".")[0])]
    losses = {s: _run(info, model_path, s, True, want)["loss"] for s in available}
    for strategy, loss in losses.items():
        assert loss == pytest.approx(oracle_loss, abs=bf16_loss_gap), strategy
        for other, other_loss in losses.items():
            assert loss == pytest.approx(other_loss, abs=2 * bf16_loss_gap), (strategy, other)


def test_flash_attn_true_is_refused_where_flash_attention_cannot_run():
    device = torch.device("cpu")
    with pytest.raises(ValueError, match=r"trainer\.flash_attn is true, but .*the device is cpu, not a GPU"):
        attention_implementation(device, flash_attn=True, bf16=True)
    assert attention_implementation(device, flash_attn=False) == "sdpa_varlen"
    assert attention_implementation(device) == "sdpa_varlen"
    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        assert attention_implementation(torch.device("cuda"), flash_attn=None, bf16=True) == "flash_attention_2"
        with pytest.raises(ValueError, match=r"trainer\.bf16 is false"):
            attention_implementation(torch.device("cuda"), flash_attn=True, bf16=False)
