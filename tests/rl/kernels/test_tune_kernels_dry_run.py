"""bench/tune_kernels.py on the CPU (Triton interpreted, tiny sizes): what it records, that a launch computing
something else than the default is refused, and that its time budget cuts the candidates, not the record."""

from __future__ import annotations

import pytest

from bench import kernels_gpu, tune_kernels
from rl.kernels import launches
from rl.kernels.sizing import KERNELS, candidate_launches, default_launch
from rl.kernels.triton import ops as tri


@pytest.fixture(autouse=True)
def _restored(monkeypatch):
    """--dry_run switches the benchmark's device and Triton's interpreter on for the process: undone after."""
    monkeypatch.setattr(kernels_gpu, "DEVICE", kernels_gpu.DEVICE)
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _tuned(tmp_path, *flags) -> tuple[int, dict]:
    path = tmp_path / "launches.json"
    code = tune_kernels.main(["--dry_run", "--record", str(path), *flags])
    return code, launches.load(str(path))["cpu"]


def test_every_kernel_and_size_gets_its_fastest_checked_launch(tmp_path, capsys):
    code, cpu = _tuned(tmp_path)
    assert code == 0
    # the dry run's sizes: a vocabulary of 300 (one block of 512) and 1 or 20 features (blocks of 1; 16 or 32)
    sizes = {"logprobs_fwd": 300, "logprobs_bwd": 300, "fused_loss": 300, "pack": 20, "unpack": 20}
    assert {kernel: sorted(by_size) for kernel, by_size in cpu["kernels"].items()} == {
        kernel: (["1", "32"] if kernel in ("pack", "unpack") else ["512"]) for kernel in KERNELS}
    for kernel, by_size in cpu["kernels"].items():
        best = by_size["32"] if kernel in ("pack", "unpack") else by_size["512"]
        params = {k: v for k, v in best.items() if k not in launches.FIGURES}
        assert params in candidate_launches(kernel, sizes[kernel])
        assert best["gbps"] >= best["default_gbps"] > 0  # the default is one of the candidates timed
    assert cpu["measured"]["partial"] is False
    out = capsys.readouterr().out
    assert out.count(" 3/3") == 3 and out.count(" 16/16") == 2 and out.count(" 8/8") == 2


def test_a_launch_that_computes_something_else_is_refused_and_never_recorded(tmp_path, monkeypatch, capsys):
    real_pack = tri.pack

    def pack_off_by_one_at_16_rows(padded, lengths, *, launch=None):
        out = real_pack(padded, lengths, launch=launch)
        if launch is not None and launch["BLOCK_T"] == 16:
            out.view(-1)[-1] += 1
        return out

    monkeypatch.setattr(tri, "pack", pack_off_by_one_at_16_rows)
    code, cpu = _tuned(tmp_path)
    assert code == 1
    out = capsys.readouterr().out
    refused = [line for line in out.splitlines() if line.startswith("REFUSED: ")]
    assert len(refused) == 6  # 16 rows x (4, 8 warps) x features of 16 or 32 at 20 and of 1 at 1
    assert "REFUSED: pack at 20: {'BLOCK_T': 16, 'BLOCK_D': 16, 'num_warps': 4} differs from the default" in out
    assert all(best["BLOCK_T"] != 16 for best in cpu["kernels"]["pack"].values())
    assert " 12/16" in out and " 6/8" in out  # each pack row timed the launches that were not refused


def test_a_spent_budget_records_the_defaults_it_timed(tmp_path, capsys):
    code, cpu = _tuned(tmp_path, "--budget_s", "0")
    assert code == 0 and cpu["measured"]["partial"] is True
    tuned_sizes = {"512": 300, "1": 1, "32": 20}
    for kernel, by_size in cpu["kernels"].items():
        for size, best in by_size.items():
            assert {k: v for k, v in best.items() if k not in launches.FIGURES} == default_launch(
                kernel, tuned_sizes[size])
            assert best["gbps"] == best["default_gbps"]
    out = capsys.readouterr().out
    assert "--budget_s 0 was spent" in out and " 1/16" in out and " 1/3" in out
