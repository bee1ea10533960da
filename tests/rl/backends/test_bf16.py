"""`trainer.bf16` (ModelSpec.bf16) on fsdp2, fsdp, deepspeed and megatron, on this machine's device (CPU included).

With `true` the forward's and backward's matrix products take bfloat16 operands while the weights the optimizer
updates, the logprobs and the gradient reduction stay float32; with `false` every product is float32. Checked against
a float64 transformers oracle of the same weights:

- the logprobs and the step-1 loss within the rounding the run's precision allows, propagated through the network
  to first order (`_first_order`): float32 within the worst case, bfloat16 within the probabilistic bound of
  independent roundings (a few times the measured gap); bfloat16 beyond the float32 bound (it did round);
- the logprobs by value: the float32 log-softmax of the logits the model produced, however it produced them;
- on two gloo ranks, every gradient reduction observed at the collective: its dtype, its result against the float64
  sum of the ranks' inputs, and what the optimizer then receives.
"""

import importlib.util
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from rl.backends.base import ModelSpec
from rl.backends.dist import init_distributed
from rl.backends.hf_forward import output_head, scored_inputs
from rl.backends.hf_model import attention_implementation, load_causal_lm
from rl.backends.registry import build_backend
from rl.core.algorithms import LossNormalizer, compute_policy_loss
from tests.testing import loss_gaps, tolerances
from tests.testing.backend_steps import small_batch, write_small_qwen
from tests.testing.bf16_models import SETTINGS, STRATEGIES, available, need, roundoff, torch_optimizers

MATMULS = {"mm": (0, 1), "addmm": (1, 2), "bmm": (0, 1), "baddbmm": (1, 2)}  # op -> its two operands' positions
F32, BF16, F64 = torch.float32, torch.bfloat16, torch.float64
# Probability that one compared value leaves the bfloat16 bound although every rounding stays within its own:
# Hoeffding's inequality for a sum of independent, mean-zero terms |X_i| <= c_i gives P(|sum X_i| >= lam * s) <=
# 2 exp(-lam^2 / 2), s = sqrt(sum c_i^2) (the model of N. J. Higham and T. Mary, "A new approach to probabilistic
# rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019).
FAILURE_PROBABILITY = 1e-6
LAMBDA = math.sqrt(2 * math.log(2 / FAILURE_PROBABILITY))  # 5.4


@pytest.fixture(scope="module")
def info():
    info = init_distributed(0, 1, "127.0.0.1", 0)
    yield info
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_small_qwen(str(tmp_path_factory.mktemp("model")))


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


# --- the oracle and the rounding it is compared within --------------------------------------------------------------
# Calls that move or select values without arithmetic: no rounding.
MOVES = {"view", "reshape", "transpose", "permute", "contiguous", "__getitem__", "index_select", "gather", "cat",
         "stack", "unsqueeze", "squeeze", "expand", "expand_as", "flatten", "split", "chunk", "narrow", "clone",
         "detach", "repeat_interleave", "index_copy", "index_copy_", "new_zeros", "zeros_like", "neg", "__neg__",
         "roll", "embedding", "masked_fill", "select", "t", "apply", "__get__"}
CASTS = {"to", "float", "type_as", "double", "bfloat16", "type"}
REDUCTIONS = {"linear", "matmul", "bmm", "mm", "sum", "mean"}
EVALUATION_ROUNDINGS = 8  # an elementwise function (rsqrt, silu, cos) within a few float32 ulps before its rounding


def _name(func) -> str:
    return getattr(func, "__name__", str(func))


class _Dtypes(TorchFunctionMode):
    """Per call of a torch function with a floating-point result: its name, the result's dtype, its inputs'."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, torch.dtype, list[torch.dtype]]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            self.calls.append((_name(func), out.dtype, [a.dtype for a in args if isinstance(a, torch.Tensor)]))
        return out


class _RoundingSites(TorchFunctionMode):
    """Runs the float64 oracle and, at every call whose result the compared run (`runs`: its `_Dtypes` record per
    precision, the same calls in the same order) rounds, adds a zero leaf to the result: its gradient is the
    sensitivity of the outputs to that rounding. Per site and precision, the largest error the run can make there:
    the result rounded to its dtype (u|v|), the oracle's own rounding (u(float64 or float32)|v|), a float32
    evaluation of the function, and for a sum of k terms its float32 accumulation, gamma_k * sum|terms| (Higham,
    Lemma 3.1); attention's probabilities (kept in the run's dtype before they weigh the values) add u times the
    attention over |values|."""

    def __init__(self, runs: dict[str, list]):
        super().__init__()
        self.runs, self.i = runs, 0
        self.sites: list[tuple[torch.Tensor, dict[str, torch.Tensor]]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not (isinstance(out, torch.Tensor) and out.is_floating_point()):
            return out
        name, calls = _name(func), {key: run[self.i] for key, run in self.runs.items()}
        self.i += 1
        assert all(call[0] == name for call in calls.values()), f"call {self.i}: {name} vs {calls}"
        if name in MOVES or name.endswith("_"):
            return out
        bounds = {key: self._bound(name, func, args, kwargs, out, dtype, inputs)
                  for key, (_, dtype, inputs) in calls.items()}
        if all(b is None for b in bounds.values()):
            return out
        with torch.enable_grad():  # a site inside no_grad (rotary angles) still reaches what follows
            zero = torch.zeros_like(out, requires_grad=True)
            self.sites.append((zero, {k: (0 * out.detach() if b is None else b) for k, b in bounds.items()}))
            return out + zero

    @staticmethod
    def _bound(name, func, args, kwargs, out, dtype, inputs):
        if name in CASTS and all(roundoff(dtype) <= roundoff(d) for d in inputs if d.is_floating_point):
            return None  # widening or no cast: exact
        v = out.detach().abs().double()
        bound = (roundoff(dtype) + roundoff(out.dtype) + EVALUATION_ROUNDINGS * roundoff(F32)) * v
        if name in REDUCTIONS:
            x = args[0].detach().abs()
            if name == "linear":
                rest = [a.detach().abs() if isinstance(a, torch.Tensor) else a for a in args[1:]]
                terms, k = F.linear(x, *rest), x.shape[-1] + (len(rest) > 1 and rest[1] is not None)
            elif name in ("sum", "mean"):
                terms, k = func(x, *args[1:], **kwargs), max(args[0].numel() // max(out.numel(), 1), 1)
            else:
                terms, k = x @ args[1].detach().abs(), x.shape[-1]
            bound = bound + (tolerances.gamma(k, F32) + tolerances.gamma(k, out.dtype)) * terms.double()
        elif name == "scaled_dot_product_attention":
            q, key, value = (a.detach() for a in args[:3])
            weighted = func(q, key, value.abs(), *args[3:], **kwargs).double()  # softmax(q k^T) |v|
            scale = kwargs.get("scale") or q.shape[-1] ** -0.5
            largest_score = float(scale * q.abs().sum(-1).max() * key.abs().max())
            scores_error = 2 * tolerances.gamma(q.shape[-1], F32) * largest_score  # through the softmax
            sums = tolerances.gamma(key.shape[-2] + EVALUATION_ROUNDINGS, F32)
            bound = bound + (roundoff(dtype) + sums + scores_error) * weighted
        return bound


def _run_dtypes(model_path: str, kwargs: dict, bf16: bool) -> list:
    """The calls of the transformers model in the run's precision: bfloat16 parameters and activations (what
    fsdp2's and fsdp's param_dtype and DeepSpeed's bf16 make of it), or float32."""
    model = load_causal_lm(model_path, torch.device("cpu"), flash_attn=False).eval()
    if bf16:
        for p in model.parameters():
            p.data = p.data.to(BF16)
    with torch.no_grad(), _Dtypes() as record:
        model(**kwargs)
    return record.calls


def _first_order(model_path: str, batch) -> dict:
    """The float64 oracle's logprobs [N] and step-1 loss (its own logprobs as the old ones), and how far a float32
    or a bfloat16 run of the same weights can be from them. Each rounding the run makes (`_RoundingSites`; the
    weights' cast to bfloat16 too) moves an output y by at most |dy/dv| times its bound, to first order (terms
    of order u^2, about the bound's square, left out), so:
    - `worst`: the sum of those over every site and element (all roundings the worst way: rigorous to first order);
    - `spread`: their root sum of squares; with independent mean-zero roundings, |error| <= LAMBDA * spread but
      with FAILURE_PROBABILITY.
    The sites are the transformers model's; megatron's model rounds at the corresponding points of the same
    computation. The logprobs' own float32 evaluation from the logits (`log_softmax_gaps`) comes on top."""
    kwargs, targets_at = scored_inputs(batch)
    runs = {"fp32": _run_dtypes(model_path, kwargs, False), "bf16": _run_dtypes(model_path, kwargs, True)}
    oracle = load_causal_lm(model_path, torch.device("cpu"), flash_attn=False).eval().double()
    with _RoundingSites(runs) as sites:
        logits = oracle(**kwargs).logits
    logits = logits.reshape(-1, logits.shape[-1])
    assert sites.i == len(runs["fp32"]) == len(runs["bf16"]), "the precisions' calls differ"
    targets = batch.input_ids[targets_at]
    lp = torch.log_softmax(logits, -1).gather(1, targets[:, None]).squeeze(1)
    full = torch.zeros(batch.num_tokens, dtype=F64).index_put((targets_at,), lp)
    normalizer = LossNormalizer.from_counts("token_mean", int(batch.loss_mask.sum()), batch.num_sequences)
    loss = compute_policy_loss(SETTINGS, full, full.detach(), batch.advantages.double(), batch.loss_mask,
                               normalizer)[0]
    leaves = [z for z, _ in sites.sites]
    params = list(oracle.parameters())
    rounding = {"fp32": [b["fp32"] for _, b in sites.sites] + [0 * p.detach() for p in params],
                "bf16": [b["bf16"] for _, b in sites.sites] + [roundoff(BF16) * p.detach().abs() for p in params]}
    outputs = [*lp, loss]
    worst = {key: torch.zeros(len(outputs), dtype=F64) for key in rounding}
    spread = {key: torch.zeros(len(outputs), dtype=F64) for key in rounding}
    for i, y in enumerate(outputs):
        grads = torch.autograd.grad(y, leaves + params, retain_graph=i + 1 < len(outputs), allow_unused=True)
        for key, bounds in rounding.items():
            moved = [g.abs() * b for g, b in zip(grads, bounds, strict=True) if g is not None]
            worst[key][i] = sum(float(m.sum()) for m in moved)
            spread[key][i] = math.sqrt(sum(float((m * m).sum()) for m in moved))
    own = loss_gaps.log_softmax_gaps(logits.detach(), targets)[0].double()  # the run's float32 log-softmax
    # The loss from float32 logprobs against the oracle's rounded to float32 (the run's old logprobs), and its own
    # float32 token mean of -A * ratio: |dloss/dlogprob| = |A| / tokens at ratio 1.
    slope = batch.advantages[targets_at].double().abs() / int(batch.loss_mask.sum())
    loss_own = float((slope * (own + roundoff(F32) * lp.detach().abs())).sum()) + tolerances.gamma(
        int(batch.loss_mask.sum()) + 4, F32) * float(slope.sum())
    return {"targets_at": targets_at, "logprobs": full.detach(), "loss": float(loss), "own": own,
            "loss_own": loss_own, "worst": worst, "spread": spread}


def _bounds(oracle: dict) -> dict:
    """Per precision: the logprob bound per scored token and the loss bound (see `_first_order`)."""
    worst, spread, own = oracle["worst"], oracle["spread"], oracle["own"]
    return {
        False: (worst["fp32"][:-1] + own, float(worst["fp32"][-1]) + oracle["loss_own"]),
        True: (LAMBDA * spread["bf16"][:-1] + own, LAMBDA * float(spread["bf16"][-1]) + oracle["loss_own"]),
    }


@pytest.fixture(scope="module")
def oracle(model_path):
    return _first_order(model_path, small_batch())


# --- the runs ---------------------------------------------------------------------------------------------------
def _head(backend) -> torch.nn.Module:
    return backend.chunks[0].output_layer if hasattr(backend, "chunks") else output_head(backend.model)


def _run(info, model_path, strategy: str, bf16: bool, old_logprobs: torch.Tensor) -> dict:
    """Builds the backend, takes its logprobs (and the logits its head produced for them) and one step of the
    policy loss against `old_logprobs`."""
    spec = ModelSpec(path=model_path, role="policy", temperature=1.0, lr=1e-2, weight_decay=0.0, bf16=bf16)
    backend = build_backend(strategy, spec, info)
    try:
        batch = small_batch()
        normalizer = LossNormalizer.from_counts("token_mean", int(batch.loss_mask.sum()), batch.num_sequences)
        produced = []
        hook = _head(backend).register_forward_hook(
            lambda module, args, out: produced.append((out[0] if isinstance(out, tuple) else out).detach()))
        with MatmulFlops() as counted:
            logprobs, _ = backend.logprobs(batch)
            hook.remove()
            loss = backend.forward_backward(batch.replace(old_logprobs=old_logprobs), SETTINGS, normalizer)["loss"]
            stats = backend.optimizer_step()
        masters = {p.dtype for opt in torch_optimizers(backend) for group in opt.param_groups for p in group["params"]}
        return {"logprobs": logprobs, "logits": produced[0], "loss": loss, "grad_norm": stats["grad_norm"],
                "counted": counted, "masters": masters}
    finally:
        if strategy == "megatron":
            from megatron.core import parallel_state

            parallel_state.destroy_model_parallel()


def _scored_logits(logits: torch.Tensor, targets_at: torch.Tensor) -> torch.Tensor:
    """[M, V] logits of the scored positions: transformers' head runs over them only, megatron's over the row."""
    logits = logits.reshape(-1, logits.shape[-1])
    return logits if logits.shape[0] == targets_at.numel() else logits[targets_at - 1]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bf16_computes_in_bfloat16_with_float32_weights_and_logprobs(info, model_path, oracle, strategy):
    need(strategy)
    batch = small_batch()
    at, want = oracle["targets_at"], oracle["logprobs"]
    bounds = _bounds(oracle)
    runs = {bf16: _run(info, model_path, strategy, bf16, want.float()) for bf16 in (False, True)}

    fp32, bf16 = runs[False], runs[True]
    for run in (fp32, bf16):
        assert run["logprobs"].dtype == F32
        assert run["masters"] == {F32}, "the optimizer updates float32 weights"
        assert 0 < run["grad_norm"] < math.inf
    assert fp32["counted"].share(BF16) == 0, fp32["counted"].flops
    # A model may keep a small float32 product of its own (a rotary embedding's angles): not 1, but nearly.
    assert bf16["counted"].share(BF16) > 0.99, bf16["counted"].flops
    assert bf16["logits"].dtype == BF16 and fp32["logits"].dtype == F32

    for precision, run in runs.items():
        assert bool(torch.isfinite(run["logprobs"]).all()) and math.isfinite(run["loss"])
        # by value: the float32 log-softmax of the logits the model produced (one float32 evaluation each side)
        logits = _scored_logits(run["logits"], at).double()
        own = torch.log_softmax(logits, -1).gather(1, batch.input_ids[at][:, None]).squeeze(1)
        tolerances.assert_within(run["logprobs"][at], own, loss_gaps.log_softmax_gaps(logits, batch.input_ids[at])[0],
                                 msg=f"bf16={precision}: logprobs against the log-softmax of the model's own logits")
        logprob_bound, loss_bound = bounds[precision]
        tolerances.assert_within(run["logprobs"][at], want[at], logprob_bound, msg=f"bf16={precision}: logprobs")
        assert abs(run["loss"] - oracle["loss"]) <= loss_bound, (precision, run["loss"], oracle["loss"], loss_bound)
    gap = float((bf16["logprobs"][at].double() - want[at]).abs().max())
    fp32_bound = float(bounds[False][0].max())
    assert gap > fp32_bound, f"bf16 logprobs within float32 rounding ({gap:.3g} <= {fp32_bound:.3g}): not bf16"
    assert bf16["loss"] != fp32["loss"]


def test_the_strategies_bf16_step_losses_agree(info, model_path, oracle):
    """Each installed strategy's bfloat16 step-1 loss within bfloat16 rounding of the float64 oracle's, so within
    twice that of each other's."""
    loss_bound = _bounds(oracle)[True][1]
    losses = {s: _run(info, model_path, s, True, oracle["logprobs"].float())["loss"] for s in available()}
    for strategy, loss in losses.items():
        assert abs(loss - oracle["loss"]) <= loss_bound, (strategy, loss, oracle["loss"], loss_bound)
        for other, other_loss in losses.items():
            assert abs(loss - other_loss) <= 2 * loss_bound, (strategy, other)


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
