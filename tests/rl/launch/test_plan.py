"""`bazel run //rl/launch:plan`: its main prints the model, the GPUs and one row per candidate layout with the
per-GPU terms, the peak, whether it fits and why a row is excluded; `--strategy=auto` also prints the choice."""

from __future__ import annotations

import re

from rl.launch import plan
from tests.testing.model_configs import QWEN25_7B, write_config_dir


def _run(capsys, *args):
    code = plan.main(["plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_table_for_7b_on_8_gpus(tmp_path, capsys):
    path = write_config_dir(str(tmp_path / "qwen7b"), QWEN25_7B)
    code, out, _ = _run(capsys, f"trainer.policy.model.path={path}", "trainer.placement.gpu_memory_gb=80",
                        "trainer.placement.policy_num_gpus_per_node=8")
    assert code == 0
    assert "7.616B parameters; hidden 3584, 28 layers, 28 heads / 4 key-value heads" in out
    assert "GPUs: 8 (8 per node) of 80.0 GiB (trainer.placement.gpu_memory_gb)" in out
    header = next(line for line in out.splitlines() if line.startswith("layout"))
    for column in ("params", "grads", "optimizer", "gathered", "activations", "logits", "ref", "critic", "engine",
                   "peak", "phase", "fits", "note"):
        assert column in header
    rows = {line[2:].split("  ")[0]: line for line in out.splitlines() if line.startswith(("* ", "  "))}
    assert rows["fsdp2"].startswith("* ") and " fits" in rows["fsdp2"]
    for label in ("fsdp2 ckpt", "fsdp ckpt", "fsdp2 offload ref_offload", "deepspeed zero=3",
                  "deepspeed zero=2 ckpt offload_opt", "deepspeed zero=3 ckpt offload_opt offload_param",
                  "megatron tp=2 pp=1 sp", "megatron tp=1 pp=2 recompute=full"):
        assert label in rows, label
    assert re.search(r"megatron tp=8 pp=1 sp .*excluded\s+TP 8 does not divide the 28 attention / 4 key-value heads",
                     rows["megatron tp=8 pp=1 sp"])


def test_auto_prints_its_choice(capsys):
    code, out, _ = _run(capsys, "--strategy=auto", "trainer.placement.gpu_memory_gb=24")
    assert code == 0
    assert "trainer.strategy=auto chose fsdp2" in out and "< 14B -> fsdp2" in out
    assert "model: embedded (llama)" in out


def test_unreadable_model(tmp_path, capsys):
    code, _, err = _run(capsys, f"trainer.policy.model.path={tmp_path}/nothing")
    assert code == 2 and "cannot read the config.json" in err
