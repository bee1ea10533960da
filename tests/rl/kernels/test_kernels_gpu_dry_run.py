"""bench/kernels_gpu.py's dry run: every path of the GPU benchmark runs on the CPU at a tiny size (Triton under its
interpreter), so a benchmark broken by a change is found before device time is spent on it."""

from __future__ import annotations

import json

from bench import kernels_gpu


def test_every_path_of_the_gpu_benchmark_runs_on_the_cpu(tmp_path, capsys):
    path = tmp_path / "figures.json"
    assert kernels_gpu.main(["--dry_run", "--json", str(path)]) == 0
    figures = json.loads(path.read_text())
    assert [(row["op"], row["impl"]) for row in figures["bandwidth"]] == [
        (op, "triton") for op in ("pack", "unpack", "logprobs fwd", "logprobs bwd", "fused loss")]
    assert all(row["ms"] > 0 for row in figures["bandwidth"])
    loss = {(row["path"].split(",")[0], row["impl"].split(" (")[0]): row for row in figures["loss"]}
    ran = [("logits -> loss", "eager torch"), ("logits -> loss", "fused triton"), ("hidden -> loss", "eager torch"),
           ("hidden -> loss", "chunked")]
    for key in ran:
        assert isinstance(loss[key]["ms"], float) and loss[key]["ms"] > 0, (key, loss[key])
    # the CUDA kernels take CUDA tensors: the row says why it has no figure instead of ending the benchmark
    assert "needs CUDA tensors" in loss[("logits -> loss", "fused cuda")]["ms"]
    assert ("hidden -> loss", "Liger GRPO") in loss
    assert "chunks of 256 tokens (1 chunks)" in capsys.readouterr().out
