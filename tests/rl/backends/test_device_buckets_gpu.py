"""The GPU half of feeding engines from every rank (tagged gpu; skipped without one), on one GPU with one rank (nccl):
each strategy that gathers on every rank yields `device_buckets` on the GPU (the bytes never pass through host memory)
holding the values of its own `full_state_dict` (the oracle); a bucket of them laid out in a CUDA IPC buffer under
this GPU's key, as `TrainingWorker.share_weights` does, opens bit for bit in another process on that GPU, as an
engine worker there maps it. The choice of which rank feeds which engine worker, the same on CPU and GPU, is tested
on CPU (tests/rl/trainer/test_engine_feeds.py)."""

import importlib.util

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rl.backends.base import ModelSpec
from rl.backends.dist import init_distributed
from rl.backends.registry import build_backend
from tests.testing.tiny_job import make_tiny_job

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
BUCKET_BYTES = 1 << 16


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """(the tiny job's model, this process as the one rank of an nccl group)."""
    info = init_distributed(0, 1, "127.0.0.1", 0)
    assert info.device.type == "cuda"
    yield make_tiny_job(str(tmp_path_factory.mktemp("job"))).model_path, info
    dist.destroy_process_group()


def _open_in_child(handles, entries, out):
    from rl.core.generation.shared_weights import device_key, load_shared

    torch.cuda.set_device(0)
    bucket = load_shared(handles, entries, device_key("cuda"))
    torch.save([(name, tensor.cpu()) for name, tensor in bucket], out)
    torch.cuda.synchronize()


@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp", "deepspeed"])
def test_device_buckets_stay_on_the_gpu_and_open_in_another_process(one_rank, strategy, tmp_path):
    from rl.core.generation.shared_weights import device_key, shared

    if strategy == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("needs deepspeed")
    model_path, info = one_rank
    backend = build_backend(strategy, ModelSpec(path=model_path, role="policy", temperature=1.0, lr=1e-2), info)
    buckets = list(backend.device_buckets(BUCKET_BYTES))
    full = backend.full_state_dict()
    assert len(buckets) > 1
    sent = dict(item for bucket in buckets for item in bucket)
    assert set(full) - set(sent) <= {"lm_head.weight"}, "only a tied alias may be left out"
    for name, tensor in sent.items():
        assert tensor.is_cuda, name
        assert torch.equal(tensor.cpu(), full[name].cpu()), name

    bucket = buckets[0]
    out = str(tmp_path / "received")
    with shared(bucket, info.device, device_key(info.device)) as (handles, entries, _):
        assert next(iter(handles.values()))[0] == "cuda"
        child = mp.get_context("spawn").Process(target=_open_in_child, args=(handles, entries, out))
        child.start()
        child.join(300)
        assert child.exitcode == 0
    for (name, got), (want_name, want) in zip(torch.load(out), bucket, strict=True):
        assert name == want_name and got.dtype == want.dtype and torch.equal(got, want.cpu())
