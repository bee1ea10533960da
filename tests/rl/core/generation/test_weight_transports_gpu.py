"""The GPU weight transports (tagged gpu; skipped without one):

- CUDA IPC (`shared_weights`, `generator.weight_sync_backend=ipc` colocated): a bucket of mixed dtypes laid out in a
  CUDA buffer arrives bit for bit in another process that maps it by handle; a vllm engine of real size (Qwen2,
  1.4B parameters, bf16) takes every weight of a changed model over CUDA IPC and then samples with that model's
  logprobs (a transformers forward on the same GPU), far from the logprobs it had before; sleep mode frees the
  engine's memory and wake-up gives the same seeded rollouts.
- NCCL (`weight_stream`, engines on GPUs of their own): the same 1.4B model streamed from GPU 0 in 512 MiB buckets
  arrives bit for bit on GPU 1 (needs 2 GPUs).
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.multiprocessing as mp

from tests.testing import tolerances
from tests.testing.rendezvous import rendezvous

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _bf16_logprob_gap(largest_logit: float) -> float:
    """vLLM's bf16 kernels against transformers' on the same bf16 weights: each engine's logits are bf16 values, and
    a logprob z_t - logsumexp(z) of logits each rounded once (|fl(z) - z| <= u|z|, `tolerances.rounded_gap`) moves
    by at most 2u max|z| (the target's logit, and the log-sum-exp, 1-Lipschitz in the max norm): two engines whose
    logits agree before their last rounding differ by at most twice that. Each engine rounds every layer's output to
    bf16 as well, in its own kernels; over 28 layers those roundings compound past any worst-case bound (gamma_n of
    bf16 passes 1 at 256 roundings), so the check holds the engines to their logits' own rounding, scaled by the
    largest |logit| they produce."""
    return 2 * float(tolerances.rounded_gap(torch.tensor(largest_logit), 0.0, torch.bfloat16))


def _bucket(device):
    g = torch.Generator().manual_seed(0)
    cpu = [("a.weight", torch.randn(300, 517, generator=g)), ("b.bias", torch.randn(7, generator=g).bfloat16()),
           ("c.scale", torch.tensor(2.5)), ("d.ids", torch.arange(9)), ("e.half", torch.randn(5, generator=g).half())]
    return [(name, tensor.to(device)) for name, tensor in cpu]


def _open_in_child(handles, entries, out):
    from rl.core.generation.shared_weights import device_key, load_shared

    torch.cuda.set_device(0)
    bucket = load_shared(handles, entries, device_key("cuda"))
    torch.save([(name, tensor.cpu()) for name, tensor in bucket], out)
    torch.cuda.synchronize()


def test_cuda_ipc_bucket_arrives_bit_for_bit_in_another_process(tmp_path):
    from rl.core.generation.shared_weights import SharedBuffer, device_key, layout

    bucket = _bucket("cuda")
    entries, size = layout(bucket)
    buffer = SharedBuffer(size, "cuda")
    buffer.fill(bucket, entries)
    assert buffer.handle[0] == "cuda"
    out = str(tmp_path / "received")
    child = mp.get_context("spawn").Process(target=_open_in_child,
                                            args=({device_key("cuda"): buffer.handle}, entries, out))
    child.start()
    child.join(300)
    assert child.exitcode == 0
    for (name, got), (want_name, want) in zip(torch.load(out), bucket, strict=True):
        assert name == want_name and got.dtype == want.dtype and torch.equal(got, want.cpu())
    buffer.close()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random Qwen2 of Qwen2.5-1.5B's layer shape (vocabulary 32,000: 1.4B parameters), bf16, untied."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path = str(tmp_path_factory.mktemp("qwen2-1.4b"))
    config = Qwen2Config(vocab_size=32000, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=False, dtype="bfloat16")
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    vocab = {f"t{i}": i for i in range(32000)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")),
                                        eos_token="t1", pad_token="t0", unk_token="t0")
    tokenizer.save_pretrained(path)
    return path


def _hf_logprobs(model, rollouts) -> tuple[list[torch.Tensor], float]:
    """Each rollout's response logprobs under `model`, and the largest |logit| met."""
    found, largest = [], 0.0
    for rollout in rollouts:
        ids = torch.tensor([rollout.prompt_ids + rollout.response_ids], device="cuda")
        with torch.no_grad():
            logits = model(ids).logits[0, len(rollout.prompt_ids) - 1:-1].float()
        largest = max(largest, float(logits.abs().max()))
        found.append(torch.log_softmax(logits, -1).gather(1, ids[0, len(rollout.prompt_ids):, None])[:, 0].cpu())
    return found, largest


def test_vllm_engine_takes_a_real_model_over_cuda_ipc_and_sleeps(checkpoint):
    from transformers import AutoModelForCausalLM

    from rl.backends.weight_sync import bucketed
    from rl.core.generation import SamplingParams, build_engine
    from rl.core.generation.shared_weights import device_key, shared

    engine = build_engine("vllm", checkpoint, checkpoint, device="cuda", gpu_memory_utilization=0.35,
                          max_model_len=256)
    assert engine.device_keys() == [device_key("cuda")]
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, 32000, (16,), generator=g).tolist() for _ in range(4)]
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=16, seed=3)
    before = engine.generate(prompts, params)

    # a changed model: the LM head scaled so that its logprobs are far from the random model's near-uniform ones
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).cuda().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    weights = [(name, tensor.detach()) for name, tensor in model.state_dict().items()]
    started, total = time.perf_counter(), 0
    for bucket in bucketed(weights, 512 << 20):
        with shared(bucket, "cuda") as (handles, entries, size):
            engine.load_shared(handles, entries)
        total += size
    seconds = time.perf_counter() - started
    print(f"CUDA IPC sync of {total / 1e9:.2f} GB: {seconds:.2f} s")

    after = engine.generate(prompts, params)
    wanted, largest_after = _hf_logprobs(model, after)
    olds, largest_before = _hf_logprobs(model, before)
    bound = _bf16_logprob_gap(max(largest_after, largest_before))
    gap = max(float((torch.tensor(r.rollout_logprobs) - w).abs().max()) for r, w in zip(after, wanted, strict=True))
    print(f"vLLM against transformers: logprob gap {gap:.3g}, bound {bound:.3g} (largest |logit| "
          f"{max(largest_after, largest_before):.3g})")
    for rollout, want in zip(after, wanted, strict=True):
        tolerances.assert_within(torch.tensor(rollout.rollout_logprobs), want, bound, "vLLM logprobs")
    moved = max(float((torch.tensor(r.rollout_logprobs) - old).abs().max()) for r, old in zip(before, olds,
                                                                                             strict=True))
    assert moved > 10 * bound  # the engine really changed weights

    free_awake = torch.cuda.mem_get_info()[0]
    engine.offload()
    freed = torch.cuda.mem_get_info()[0] - free_awake
    assert freed > total / 2, f"sleep freed {freed / 1e9:.2f} GB of a {total / 1e9:.2f} GB model"
    with pytest.raises(RuntimeError, match="offloaded"):
        engine.generate(prompts, params)
    engine.reload()
    again = engine.generate(prompts, params)
    assert [r.response_ids for r in again] == [r.response_ids for r in after]
    assert [r.rollout_logprobs for r in again] == [r.rollout_logprobs for r in after]


def _nccl_member(rank: int, port: int, checkpoint: str, out: str) -> None:
    """Both ranks load the same checkpoint; rank 0 streams its weights in 512 MiB buckets, rank 1 compares each
    tensor it receives with its own copy."""
    from transformers import AutoModelForCausalLM

    from rl.backends.dist import connect_store
    from rl.backends.weight_stream import join_group, receive_buckets, send_bucket, send_end
    from rl.backends.weight_sync import bucketed

    torch.cuda.set_device(rank)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).cuda()
    own = model.state_dict()
    group = join_group(connect_store("127.0.0.1", port, 2), rank, 2, "nccl")
    started = time.perf_counter()
    if rank == 0:
        for bucket in bucketed(own.items(), 512 << 20):
            send_bucket(group, "nccl", bucket)
        send_end(group, "nccl")
        return
    names, different, size = [], [], 0
    for bucket in receive_buckets(group, "nccl"):
        for name, tensor in bucket:
            names.append(name)
            size += tensor.numel() * tensor.element_size()
            if not torch.equal(tensor, own[name]):
                different.append(name)
    torch.cuda.synchronize()
    torch.save({"missing": sorted(set(own) - set(names)), "repeated": len(names) - len(set(names)),
                "different": different, "bytes": size, "s": time.perf_counter() - started}, out)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL between two processes needs two GPUs")
def test_nccl_stream_of_a_real_model_arrives_bit_for_bit_on_another_gpu(checkpoint, tmp_path):
    out = str(tmp_path / "received")
    with rendezvous(2) as port:
        mp.spawn(_nccl_member, args=(port, checkpoint, out), nprocs=2)
    result = torch.load(out)
    print(f"NCCL stream of {result['bytes'] / 1e9:.2f} GB: {result['s']:.2f} s")
    assert result["missing"] == [] and result["repeated"] == 0 and result["different"] == []
