"""HF <-> megatron conversion: exact round trips over TP/PP/EP layouts, the fused QKV layout checked against a
hand-built one, and the `convert` launcher's output loading in transformers with the original logits."""

import os
import subprocess
import sys

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from rl.backends.megatron.convert import hf_to_megatron, megatron_to_hf
from rl.backends.megatron.model import Layout

SMALL = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
MODELS = {
    "qwen2-tied": (Qwen2ForCausalLM, Qwen2Config(**SMALL, tie_word_embeddings=True)),
    "llama-untied": (LlamaForCausalLM, LlamaConfig(**SMALL, tie_word_embeddings=False)),
    "mixtral": (MixtralForCausalLM, MixtralConfig(**SMALL, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                                                  tie_word_embeddings=False)),
}


def _model(name: str):
    torch.manual_seed(0)
    cls, config = MODELS[name]
    return cls(config).eval()


def _shards(hf: dict, config, tp: int, pp: int, ep: int) -> dict:
    return {(t, p, e): hf_to_megatron(hf, config, Layout(tp=tp, pp=pp, ep=ep, tp_rank=t, pp_rank=p, ep_rank=e))
            for t in range(tp) for p in range(pp) for e in range(ep)}


@pytest.mark.parametrize(("name", "tp", "pp", "ep"), [
    ("qwen2-tied", 2, 1, 1), ("qwen2-tied", 2, 2, 1), ("qwen2-tied", 1, 4, 1), ("llama-untied", 2, 2, 1),
    ("mixtral", 2, 1, 2), ("mixtral", 1, 2, 4),
])
def test_round_trip_is_exact(name, tp, pp, ep):
    model = _model(name)
    hf = model.state_dict()
    back = megatron_to_hf(_shards(hf, model.config, tp, pp, ep), model.config, tp, pp, ep)
    assert back.keys() == hf.keys()
    for key, tensor in hf.items():
        assert torch.equal(back[key], tensor), key


def test_shards_split_qkv_by_query_group_and_pad_the_vocabulary():
    model = _model("qwen2-tied")
    hf, d = model.state_dict(), 8  # head_dim = 32 / 4; 2 query heads per group
    shard = hf_to_megatron(hf, model.config, Layout(tp=2, tp_rank=1))
    q, k, v = (hf[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qkv")
    # TP rank 1 owns query group 1: its two query heads (rows 16..31 of q), then k and v of group 1.
    expected = torch.cat([q[2 * d:4 * d], k[d:2 * d], v[d:2 * d]])
    assert torch.equal(shard["decoder.layers.0.self_attention.linear_qkv.weight"], expected)
    gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(shard["decoder.layers.0.mlp.linear_fc1.weight"], torch.cat([gate[24:], up[24:]]))
    embedding = shard["embedding.word_embeddings.weight"]  # vocab 61 -> 62 rows, 31 per rank, last one padding
    assert embedding.shape == (31, 32)
    assert torch.equal(embedding[:30], hf["model.embed_tokens.weight"][31:]) and not embedding[30].any()


def test_expert_parallel_shards_hold_their_experts():
    model = _model("mixtral")
    hf = model.state_dict()
    shard = hf_to_megatron(hf, model.config, Layout(ep=2, ep_rank=1))
    gate_up = hf["model.layers.0.mlp.experts.gate_up_proj"]
    assert torch.equal(shard["decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight"], gate_up[2])
    assert "decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight" not in shard


def _run_convert(*args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-m", "rl.launch.convert", *args], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize(("name", "layout"), [("qwen2-tied", ("--tp=2", "--pp=2")), ("mixtral", ("--tp=2", "--ep=2"))])
def test_launcher_output_loads_in_transformers_with_the_same_logits(tmp_path, name, layout):
    from rl.tasks.embedded.tokenizer import build_tokenizer

    model = _model(name)
    source = str(tmp_path / "hf")
    model.save_pretrained(source)
    build_tokenizer().save_pretrained(source)
    mcore, back = str(tmp_path / "mcore"), str(tmp_path / "back")
    if name == "qwen2-tied":  # the binary with its flags, once; the same functions directly otherwise
        _run_convert("--direction=hf_to_megatron", f"--input={source}", f"--run_dir={mcore}", *layout)
        _run_convert("--direction=megatron_to_hf", f"--input={mcore}", f"--run_dir={back}")
    else:
        from rl.backends.megatron.hf_io import hf_to_megatron_checkpoint, megatron_checkpoint_to_hf

        hf_to_megatron_checkpoint(source, mcore, tp=2, pp=1, ep=2)
        megatron_checkpoint_to_hf(mcore, back)
    assert os.path.exists(os.path.join(mcore, "mp_rank_01_000_000", "model_optim_rng.pt"))
    loaded = AutoModelForCausalLM.from_pretrained(back).eval()
    ids = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)
