"""The CPU compatibility layer: pinned to the lock's megatron-core, active only inside its scope and only on the
CPU, restoring megatron-core exactly on exit, and making each patched CUDA path work on the CPU."""

import os
import re

import pytest
import torch
import torch.distributed as dist

from rl.backends.megatron import cpu_compat
from tests.testing import tolerances

LOCK = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "third_party", "python", "requirements_lock.txt")


@pytest.fixture(scope="module")
def parallel_state():
    from megatron.core import parallel_state as ps

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
    dist.init_process_group("gloo", rank=0, world_size=1)
    with cpu_compat.cpu_compat("cpu"):
        ps.initialize_model_parallel(1, 1)
    yield ps
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def _patched_attributes():
    import megatron.core.distributed.param_and_grad_buffer as buffers
    import megatron.core.optimizer.clip_grads as clip_grads
    import megatron.core.optimizer.optimizer as optimizer
    import megatron.core.tensor_parallel.random as random
    import megatron.core.utils as utils
    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    return (utils.torch, random._get_cuda_rng_state, LanguageModule.setup_embeddings_and_output_layer,
            buffers.torch, vars(DistributedOptimizer)["_build_model_and_main_param_groups"],
            clip_grads.clip_grad_by_total_norm_fp32, optimizer.clip_grad_by_total_norm_fp32)


def test_pinned_version_is_the_lock_pin_and_the_installed_one():
    with open(LOCK) as f:
        pins = re.findall(r"^megatron-core==(\S+)", f.read(), flags=re.M)
    assert pins == [cpu_compat.PINNED_VERSION]
    assert cpu_compat.installed_version() == cpu_compat.PINNED_VERSION


def test_other_version_is_refused_before_anything_is_patched(monkeypatch):
    before = _patched_attributes()
    monkeypatch.setattr(cpu_compat, "installed_version", lambda: "0.17.0")
    refused = pytest.raises(RuntimeError, match=r"megatron-core 0\.17\.0 is installed.*0\.16\.1.*requirements_lock")
    with refused, cpu_compat.cpu_compat("cpu"):
        pass
    assert _patched_attributes() == before


def test_patches_live_only_inside_the_cpu_scope():
    before = _patched_attributes()
    assert before[0] is torch and before[3] is torch
    with cpu_compat.cpu_compat("cpu"):
        inside = _patched_attributes()
        assert all(a is not b for a, b in zip(inside, before, strict=True))
        with cpu_compat.cpu_compat("cpu"):  # re-entrant: the inner exit leaves the outer scope patched
            pass
        assert _patched_attributes() == inside
    assert _patched_attributes() == before
    with cpu_compat.cpu_compat("cuda"):  # a GPU device: megatron-core untouched
        assert _patched_attributes() == before


def test_cuda_device_requests_land_on_the_cpu(parallel_state):
    import megatron.core.pipeline_parallel.schedules as schedules

    with cpu_compat.cpu_compat("cpu"):
        buffer = parallel_state.get_global_memory_buffer().get_tensor((2, 3), torch.float32, "test")
        zeros = schedules.torch.zeros([], dtype=torch.int, device="cuda")
        assert schedules.torch.cuda.current_device() == torch.device("cpu")
    assert buffer.device.type == "cpu" and buffer.shape == (2, 3)
    assert zeros.device.type == "cpu"


def test_rng_tracker_keeps_named_cpu_streams(parallel_state):
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker, model_parallel_cuda_manual_seed

    with cpu_compat.cpu_compat("cpu"):
        model_parallel_cuda_manual_seed(7)
        torch.manual_seed(0)
        outside = torch.rand(3)
        torch.manual_seed(0)
        with get_cuda_rng_tracker().fork():
            first = torch.rand(3)
        after = torch.rand(3)
        with get_cuda_rng_tracker().fork():
            second = torch.rand(3)
    assert torch.equal(after, outside), "forking must leave the default CPU stream where it was"
    assert not torch.equal(first, outside) and not torch.equal(first, second), "the tracked stream advances"


def _ddp_linear():
    """A Linear in megatron's DDP with the distributed optimizer (its buffers need item 6), and a plain twin."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.manual_seed(0)
    module, twin = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    twin.load_state_dict(module.state_dict())
    config = TransformerConfig(num_layers=1, hidden_size=4, num_attention_heads=1, use_cpu_initialization=True)
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True)
    with pytest.raises((AssertionError, RuntimeError)):  # outside: buffers on torch.cuda.current_device()
        DistributedDataParallel(config, ddp_config, torch.nn.Linear(4, 3))
    with cpu_compat.cpu_compat("cpu"):
        return DistributedDataParallel(config, ddp_config, module), module, twin


def test_ddp_distributed_optimizer_and_clipping_step_like_torch(parallel_state):
    """Items 6-8 together: megatron's DDP, finalize_model_grads, DistributedOptimizer and grad clipping take the step
    torch's clip_grad_norm_ + AdamW take."""
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp, module, twin = _ddp_linear()
    x = torch.randn(5, 4)
    config = OptimizerConfig(optimizer="adam", lr=0.1, weight_decay=0.01, clip_grad=0.5, use_distributed_optimizer=True)
    with cpu_compat.cpu_compat("cpu"):
        optimizer = get_megatron_optimizer(config, [ddp], config_overrides={})
        ddp(x).pow(2).sum().backward()
        finalize_model_grads([ddp])
        success, norm, _ = optimizer.step()
    twin(x).pow(2).sum().backward()
    want_norm = torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.5)
    reference = torch.optim.AdamW(twin.parameters(), lr=0.1, weight_decay=0.01)
    reference.step()
    # Both sum the batch's 5 terms per gradient element and the 15 elements' squares for the norm (which sets the
    # clip coefficient), in their own orders; one Adam step then moves each weight within `adam_bulk_gap`.
    grad_rtol = tolerances.network_rtol([5, 15], torch.float32)
    assert success and norm == pytest.approx(float(want_norm), rel=tolerances.network_rtol([5, 15], torch.float32))
    for name, param in twin.named_parameters():
        bound = tolerances.adam_bulk_gap(param, 0.1, 1, grad_rtol, torch.float32)
        tolerances.assert_within(module.get_parameter(name), param, bound, msg=name)
    assert all("type" not in vars(p) for p in module.parameters()), "item 7 leaves no attribute behind"


def test_fp32_cpu_parameters_pass_the_distributed_optimizer_type_check(parallel_state):
    """Item 7: outside the scope megatron rejects CPU parameters with TypeError; inside it takes its fp32 branch."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    ddp, module, _ = _ddp_linear()
    config = OptimizerConfig(optimizer="adam", lr=0.1, use_distributed_optimizer=True)
    with cpu_compat.cpu_compat("cpu"):
        optimizer = get_megatron_optimizer(config, [ddp], config_overrides={}).chained_optimizers[0]
    args = (optimizer.gbuf_ranges, optimizer.model_param_gbuf_map, optimizer.opt_group_ranges, config)
    with pytest.raises(TypeError, match=r"must be one of torch\.cuda\.FloatTensor"):
        DistributedOptimizer._build_model_and_main_param_groups(*args)
    with cpu_compat.cpu_compat("cpu"):
        _, fp32_groups, _, shard_groups, _ = DistributedOptimizer._build_model_and_main_param_groups(*args)
    assert {id(p) for p in fp32_groups[0]} == {id(p) for p in module.parameters()}
    assert [s.numel() for s in shard_groups[0]] == [p.numel() for p in fp32_groups[0]]  # DP=1: whole tensors
    assert all(p.type() == "torch.FloatTensor" for p in module.parameters())


def test_grad_clipping_accepts_fp32_cpu_gradients():
    """Item 8: megatron's clip_grad_by_total_norm_fp32 asserts CUDA grads outside the scope and clips CPU ones in it."""
    import megatron.core.optimizer.clip_grads as clip_grads

    param = torch.nn.Parameter(torch.ones(3))
    param.grad = torch.full((3,), 2.0)
    with pytest.raises(AssertionError):
        clip_grads.clip_grad_by_total_norm_fp32([param], 1.0, 4.0)
    with cpu_compat.cpu_compat("cpu"):
        clip_grads.clip_grad_by_total_norm_fp32([param], 1.0, 4.0)
    torch.testing.assert_close(param.grad, torch.full((3,), 2.0 / (4.0 + 1e-6)))
    assert "type" not in vars(param.grad)
