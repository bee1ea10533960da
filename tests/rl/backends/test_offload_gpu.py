"""`fsdp_config.cpu_offload` on a GPU: fsdp2's policy and both FSDP strategies' reference model keep their
parameters in host memory between uses, and compute what the same model without offload computes (logprobs, and
for the policy a training step). The CPU counterpart (nothing to offload, said once) is in test_backend_state.py."""

import pytest
import torch
import torch.distributed as dist

from rl.backends.base import ModelSpec
from rl.backends.dist import init_distributed
from rl.backends.registry import build_backend
from tests.testing import tolerances
from tests.testing.backend_steps import small_batch, train_step
from tests.testing.tiny_job import make_tiny_job

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    info = init_distributed(0, 1, "127.0.0.1", 0)
    assert info.device.type == "cuda"
    yield make_tiny_job(str(tmp_path_factory.mktemp("job"))).model_path
    dist.destroy_process_group()


def _parameter_devices(backend) -> set[str]:
    local = lambda p: p.to_local() if hasattr(p, "to_local") else p  # noqa: E731  (fsdp2's DTensor shards)
    return {local(p).device.type for p in backend.model.parameters()}


@pytest.mark.parametrize(("strategy", "role"), [("fsdp2", "policy"), ("fsdp2", "ref"), ("fsdp", "ref")])
def test_offloaded_parameters_live_on_the_host_and_compute_the_same(model_path, strategy, role):
    info = init_distributed(0, 1, "127.0.0.1", 0)
    built = {offload: build_backend(strategy, ModelSpec(path=model_path, role=role, temperature=1.0, lr=1e-2,
                                                        backend_options={"cpu_offload": offload}), info)
             for offload in (False, True)}
    assert _parameter_devices(built[True]) == {"cpu"}, "offloaded parameters wait in host memory"
    assert _parameter_devices(built[False]) == {"cuda"}
    batch = small_batch()
    # Offloading changes where a shard waits, not what runs: the same float32 shard is copied to the device and cast
    # to the compute dtype (one rounding of the same value) either before or after the copy, and the same kernels
    # run on the same values in the same order: bit for bit.
    torch.testing.assert_close(built[True].logprobs(batch)[0].cpu(), built[False].logprobs(batch)[0].cpu(),
                               rtol=0, atol=0)
    if role == "policy":
        steps = [train_step(built[offload]) for offload in (False, True)]
        assert _parameter_devices(built[True]) == {"cpu"} and _parameter_devices(built[False]) == {"cuda"}
        # The same gradients (the same kernels; attention's backward over these short sequences is one block, so no
        # atomic accumulation), whose norm sums squares on the host in one run and on the device in the other: per
        # tensor over its elements, then over the tensors, plus the squares' and the square root's roundings.
        sizes = [p.numel() for p in built[False].model.parameters()]
        rtol = tolerances.network_rtol([max(sizes), len(sizes), 2], torch.float32)
        assert steps[1]["grad_norm"] == pytest.approx(steps[0]["grad_norm"], rel=rtol, abs=0)
