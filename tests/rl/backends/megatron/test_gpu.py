"""The megatron backend on one GPU (nccl, no CPU compatibility layer): logprobs match transformers on the same
device; a training step through megatron's DDP and distributed optimizer (or, with optimizer_cpu_offload, megatron's
non-distributed optimizer and HostAdamW) yields a finite gradient norm and changes the weights; a checkpoint of the
optimizer state saves and loads, and training goes on from it."""

import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rl.backends.base import ModelSpec
from rl.backends.dist import init_distributed
from rl.backends.logits import token_logprobs
from rl.backends.registry import build_backend
from rl.core.algorithms import LossNormalizer, LossSettings
from rl.core.packing import pack_sequences
from tests.rl.backends.megatron.harness import logprob_gap, sequences
from tests.testing import tolerances

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
VOCAB = 61


@pytest.mark.parametrize("options", [{}, {"optimizer_cpu_offload": True}], ids=["distributed-optimizer", "offload"])
def test_logprobs_match_transformers_and_a_step_trains(tmp_path, options):
    import megatron.core.utils as megatron_utils
    from megatron.core import parallel_state
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         max_position_embeddings=64)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    info = init_distributed(0, 1, "127.0.0.1", 0)
    try:
        # float32 (trainer.bf16=false), to compare with float32 transformers
        spec = ModelSpec(path=str(tmp_path), role="policy", temperature=1.0, lr=1e-2, backend_options=options,
                         bf16=False)
        backend = build_backend("megatron", spec, info)
        assert megatron_utils.torch is torch, "the CPU compatibility layer must stay off on GPU"
        distributed = isinstance(backend.optimizer.megatron.chained_optimizers[0], DistributedOptimizer)
        assert distributed != bool(options), "the distributed optimizer unless optimizer_cpu_offload"
        assert backend.model.embedding.word_embeddings.weight.main_grad.is_cuda, "megatron's DDP grad buffer"
        seqs = sequences(VOCAB)[:4]
        batch = pack_sequences(seqs)
        got, _ = backend.logprobs(batch)
        reference = AutoModelForCausalLM.from_pretrained(str(tmp_path)).cuda().eval()
        with torch.no_grad():
            want = torch.cat([torch.cat([torch.zeros(1), token_logprobs(
                reference(input_ids=s["input_ids"][None].cuda()).logits[0, :-1], s["input_ids"][1:].cuda()).cpu()])
                for s in seqs])
        # float32 on the GPU (TF32 off, torch's default) rounds as on the CPU: megatron's packed forward and
        # transformers' one sequence at a time are the same sums in other orders (`harness.logprob_gap`)
        tolerances.assert_within(got[batch.loss_mask], want[batch.loss_mask], logprob_gap(str(tmp_path), seqs),
                                 "megatron's logprobs")

        before = {k: v.clone() for k, v in backend.model.state_dict().items() if not k.endswith("_extra_state")}
        normalizer = LossNormalizer.from_counts("token_mean", int(batch.loss_mask.sum()), len(seqs))
        backend.forward_backward(batch.replace(old_logprobs=got), LossSettings(), normalizer)
        stats = backend.optimizer_step()
        assert 0 < stats["grad_norm"] < float("inf")
        after = backend.model.state_dict()
        assert any(not torch.equal(after[k], v) for k, v in before.items())

        backend.save_checkpoint(str(tmp_path / "ckpt"))
        backend.load_checkpoint(str(tmp_path / "ckpt"))
        backend.forward_backward(batch.replace(old_logprobs=got), LossSettings(), normalizer)
        assert 0 < backend.optimizer_step()["grad_norm"] < float("inf")
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
