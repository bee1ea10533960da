"""Generation throughput of the vllm engine against the hf engine on the same prompts, at three model sizes (random
Llama weights, fp32, CPU unless a GPU is present), in one run.

    PYTHONPATH=. python -m bench.generation_engines [--sizes tiny,100m,500m --prompts 16 --n 4 --tokens 64]

Each size: a checkpoint is written (`bench.common.save_model`, vocabulary 32,000), each engine is built once (its
start-up reported apart), one warm-up call, then one timed `generate` of `--prompts` random prompts x `--n` samples x
up to `--tokens` new tokens (the end token is one of 32,000, so responses rarely stop early). Reported: generated
tokens per second and the ratio vLLM / HF.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from bench.common import ModelShape, format_table, save_model

# name -> shape: about 4M parameters (the embedded model's size), 100M and 500M
SIZES = {
    "tiny": ModelShape(hidden=128, layers=2, heads=4, intermediate=512, vocab_size=32000, max_positions=512),
    "100m": ModelShape(hidden=768, layers=10, heads=12, intermediate=2048, vocab_size=32000, max_positions=512),
    "500m": ModelShape(hidden=1280, layers=20, heads=20, intermediate=3584, vocab_size=32000, max_positions=512),
    # Qwen2.5-1.5B's hidden, layer and MLP sizes (1.4B parameters with this vocabulary): the GPU goal, `--sizes 1.5b`
    "1.5b": ModelShape(hidden=1536, layers=28, heads=12, intermediate=8960, vocab_size=32000, max_positions=512),
}


def measure(name: str, path: str, prompts: list[list[int]], params) -> tuple[float, float]:
    """(start-up seconds, generated tokens per second) of engine `name`."""
    from rl.core.generation import build_engine

    device = "cuda" if torch.cuda.is_available() else "cpu"
    kwargs = {"kv_cache_memory_bytes": 256 << 20} if name == "vllm" else {}  # the same cache on every machine
    started = time.perf_counter()
    engine = build_engine(name, path, path, device=device, **kwargs)
    startup = time.perf_counter() - started
    engine.generate(prompts[:2], params)
    started = time.perf_counter()
    rollouts = engine.generate(prompts, params)
    seconds = time.perf_counter() - started
    del engine
    return startup, sum(len(r.response_ids) for r in rollouts) / seconds


def main() -> None:
    from rl.core.generation import SamplingParams

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="tiny,100m,500m")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 32000, (24,), generator=g).tolist() for _ in range(args.prompts)]
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.tokens, seed=0)
    rows = []
    for size in args.sizes.split(","):
        with tempfile.TemporaryDirectory() as directory:
            path = save_model(os.path.join(directory, "model"), SIZES[size])
            hf_start, hf_rate = measure("hf", path, prompts, params)
            vllm_start, vllm_rate = measure("vllm", path, prompts, params)
        rows.append([size, hf_start, vllm_start, hf_rate, vllm_rate, vllm_rate / hf_rate])
        print(f"{size}: done", flush=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"{args.prompts} prompts x {args.n} samples x {args.tokens} new tokens, fp32, {device}")
    print(format_table(["model", "hf start s", "vllm start s", "hf tok/s", "vllm tok/s", "vllm / hf"], rows))


if __name__ == "__main__":
    main()
