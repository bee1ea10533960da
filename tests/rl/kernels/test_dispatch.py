"""rl.kernels.ops: which implementation runs for each trainer.kernels value and device, the errors that name the
key, and the backends' hook (rl/backends/logits.py) giving the eager log-softmax numbers through it."""

import pytest
import torch

from rl.backends.logits import token_entropy, token_logprobs, token_logprobs_and_entropy
from rl.kernels import ops, reference


@pytest.fixture(autouse=True)
def _no_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def test_cpu_tensors_run_the_torch_reference():
    x = torch.zeros(2, 3)
    assert ops.resolve("auto", x) == "torch"
    assert ops.resolve("torch", x) == "torch"
    assert ops.backend("auto", x) is reference


@pytest.mark.parametrize("choice", ["triton", "cuda"])
def test_forcing_a_gpu_kernel_on_cpu_names_the_key(choice):
    with pytest.raises(ValueError, match=rf"trainer\.kernels={choice} needs CUDA tensors"):
        ops.token_logprobs_entropy(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), kernels=choice)


def test_triton_on_cpu_is_allowed_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert ops.resolve("triton", torch.zeros(1)) == "triton"


def test_unknown_choice_names_the_key():
    with pytest.raises(ValueError, match=r"trainer\.kernels must be one of"):
        ops.resolve("fast", torch.zeros(1))


def test_packing_ops_through_the_dispatch():
    lengths = torch.tensor([2, 0, 3])
    padded = torch.arange(12).reshape(3, 4)
    assert ops.pack(padded, lengths).tolist() == [0, 1, 8, 9, 10]
    assert ops.unpack(ops.pack(padded, lengths), lengths, 4, -1).tolist() == [[0, 1, -1, -1], [-1] * 4, [8, 9, 10, -1]]
    cu = ops.cu_seqlens_from_lengths(lengths)
    assert cu.tolist() == [0, 2, 2, 5] and ops.position_ids(cu).tolist() == [0, 1, 0, 1, 2]


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_backend_hook_matches_eager_log_softmax(temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 33, generator=g).requires_grad_()
    targets = torch.randint(0, 33, (9,), generator=g)
    eager = torch.log_softmax(logits / temperature, -1)
    want_lp = eager.gather(1, targets[:, None]).squeeze(1)
    want_h = -(eager.exp() * eager).sum(-1)
    lp, h = token_logprobs_and_entropy(logits, targets, temperature, kernels="torch")
    torch.testing.assert_close(lp, want_lp)
    torch.testing.assert_close(h, want_h)
    torch.testing.assert_close(token_logprobs(logits, targets, temperature), want_lp)
    torch.testing.assert_close(token_entropy(logits, temperature), want_h)
    grad = torch.autograd.grad((lp - 0.3 * h).sum(), logits)[0]
    torch.testing.assert_close(grad, torch.autograd.grad((want_lp - 0.3 * want_h).sum(), logits)[0])
