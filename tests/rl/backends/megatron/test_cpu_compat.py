"""The CPU compatibility layer: pinned to the lock's megatron-core, active only inside its scope and only on the
CPU, restoring megatron-core exactly on exit, and making each patched CUDA path work on the CPU."""

import os
import re

import pytest
import torch
import torch.distributed as dist

from rl.backends.megatron import cpu_compat

LOCK = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "third_party", "python", "requirements_lock.txt")


@pytest.fixture(scope="module")
def parallel_state():
    from megatron.core import parallel_state as ps

    from tests.rl.backends.megatron.harness import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    with cpu_compat.cpu_compat("cpu"):
        ps.initialize_model_parallel(1, 1)
    yield ps
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def _patched_attributes():
    import megatron.core.tensor_parallel.random as random
    import megatron.core.utils as utils
    from megatron.core.models.common.language_module.language_module import LanguageModule

    return utils.torch, random._get_cuda_rng_state, LanguageModule.setup_embeddings_and_output_layer


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
    assert before[0] is torch
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
