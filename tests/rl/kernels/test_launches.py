"""The launch record (rl/kernels/launches.py): which measured launch a kernel gets on a device, what a record may
hold, and how the tuner's writes keep the other devices' launches."""

from __future__ import annotations

import json
import os

import pytest

from rl.kernels import launches
from rl.kernels.launches import RECORD_ENV, launch, load, save
from rl.kernels.sizing import CPU, Device, default_launch

H100 = Device("cuda", 132, 80 << 30, "NVIDIA H100 80GB HBM3")
A10 = Device("cuda", 72, 24 << 30, "NVIDIA A10")
H100_LAUNCHES = {
    "logprobs_fwd": {
        "32768": {"BLOCK_V": 2048, "num_warps": 4, "of_peak": 0.8},
        "131072": {"BLOCK_V": 16384, "num_warps": 16, "gbps": 2500.0},
    },
    "pack": {"4096": {"BLOCK_T": 16, "BLOCK_D": 256, "num_warps": 8}},
}


@pytest.fixture
def h100_record(tmp_path, monkeypatch):
    path = tmp_path / "launches.json"
    save(path, H100.name, {"triton": "3.3.1"}, H100_LAUNCHES)
    monkeypatch.setenv(RECORD_ENV, str(path))
    return path


def test_a_kernel_takes_the_launch_recorded_at_the_nearest_power_of_two(h100_record):
    # Qwen2's 151,936 rounds up to 262,144, one power of two from 131,072; Llama 3's 128,256 is at 131,072; 65,536
    # is one from each record: the wider is taken
    assert launch("logprobs_fwd", 151_936, H100) == {"BLOCK_V": 16384, "num_warps": 16}
    assert launch("logprobs_fwd", 128_256, H100) == {"BLOCK_V": 16384, "num_warps": 16}
    assert launch("logprobs_fwd", 65_536, H100) == {"BLOCK_V": 16384, "num_warps": 16}
    assert launch("logprobs_fwd", 32_000, H100) == {"BLOCK_V": 2048, "num_warps": 4}
    # never a block wider than the size needs
    assert launch("logprobs_fwd", 1000, H100) == {"BLOCK_V": 1024, "num_warps": 4}
    assert launch("pack", 896, H100) == {"BLOCK_T": 16, "BLOCK_D": 256, "num_warps": 8}
    assert launch("pack", 100, H100) == {"BLOCK_T": 16, "BLOCK_D": 128, "num_warps": 8}


def test_without_a_record_for_the_device_or_kernel_the_default_launch(h100_record):
    assert launch("logprobs_fwd", 151_936, A10) == default_launch("logprobs_fwd", 151_936) == {
        "BLOCK_V": 4096, "num_warps": 8}
    assert launch("logprobs_bwd", 151_936, H100) == default_launch("logprobs_bwd", 151_936)
    assert launch("unpack", 4096, H100) == default_launch("unpack", 4096)
    assert launch("pack", 4096, CPU) == default_launch("pack", 4096)


def test_the_tuner_keeps_the_other_devices_and_replaces_its_own(h100_record):
    save(h100_record, A10.name, {}, {"unpack": {"1": {"BLOCK_T": 128, "BLOCK_D": 1, "num_warps": 4}}})
    save(h100_record, H100.name, {"triton": "3.4.0"}, {"fused_loss": {"4096": {"BLOCK_V": 4096, "num_warps": 16}}})
    data = json.loads(h100_record.read_text())
    assert set(data) == {A10.name, H100.name}
    assert data[H100.name] == {"measured": {"triton": "3.4.0"},
                               "kernels": {"fused_loss": {"4096": {"BLOCK_V": 4096, "num_warps": 16}}}}
    assert launch("unpack", 1, A10) == {"BLOCK_T": 128, "BLOCK_D": 1, "num_warps": 4}
    assert launch("logprobs_fwd", 32768, H100) == default_launch("logprobs_fwd", 32768)  # replaced, not merged


@pytest.mark.parametrize(("kernels", "complaint"), [
    ({"softmax": {"1024": {"BLOCK_V": 1024, "num_warps": 4}}}, "'dev' softmax at 1024: no kernel named 'softmax'"),
    ({"logprobs_fwd": {"30000": {"BLOCK_V": 1024, "num_warps": 4}}}, "sizes are recorded by their power of two"),
    ({"logprobs_fwd": {"4096": {"BLOCK_V": 3000, "num_warps": 4}}}, "{'BLOCK_V': 3000, 'num_warps': 4} is not one"),
    ({"logprobs_fwd": {"4096": {"BLOCK_V": 1024, "num_warps": 32}}}, "is not one of the launches the tests check"),
    ({"pack": {"64": {"BLOCK_T": 64, "BLOCK_D": 64}}}, "{'BLOCK_T': 64, 'BLOCK_D': 64} is not one"),
    ({"pack": {"64": {"BLOCK_T": 64, "BLOCK_D": 64, "num_warps": 4, "speed": 1}}}, "is not one"),
    ({"pack": {"64": [64, 64, 4]}}, "a launch is an object of parameters"),
])
def test_a_launch_the_tests_do_not_cover_is_refused_with_its_place(tmp_path, kernels, complaint):
    path = tmp_path / "launches.json"
    path.write_text(json.dumps({"dev": {"kernels": kernels}}))
    with pytest.raises(ValueError) as err:
        load(str(path))
    assert str(err.value).startswith(f"{path}: 'dev' ") and complaint in str(err.value)
    with pytest.raises(ValueError, match="'dev' "):  # and the tuner cannot write one either
        save(tmp_path / "other.json", "dev", {}, kernels)
    assert not (tmp_path / "other.json").exists()


def test_an_unreadable_record_names_its_file_and_the_variable(tmp_path, monkeypatch):
    path = tmp_path / "launches.json"
    path.write_text("{not json")
    monkeypatch.setenv(RECORD_ENV, str(path))
    with pytest.raises(ValueError, match=rf"^{path}: cannot read the kernel launch record .* unset {RECORD_ENV}"):
        launch("pack", 1, H100)
    path.write_text(json.dumps({"dev": {"launches": {}}}))
    with pytest.raises(ValueError, match="'dev' has no \"kernels\" object"):
        load(str(path))


def test_a_failed_write_leaves_the_record_as_it_was(h100_record):
    before = h100_record.read_bytes()
    with pytest.raises(ValueError):
        save(h100_record, A10.name, {}, {"pack": {"64": {"BLOCK_T": 3, "BLOCK_D": 64, "num_warps": 4}}})
    assert h100_record.read_bytes() == before
    assert [p.name for p in h100_record.parent.iterdir()] == [h100_record.name]


def test_a_record_is_written_in_one_order_a_value_a_line_through_its_own_folder(tmp_path, monkeypatch):
    """Re-tuning a device with the same results gives the same bytes (so a committed record's diff shows only the
    launches that changed), and the file is replaced from a temporary file beside it (one filesystem: atomic)."""
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    save(first, H100.name, {"triton": "3.3.1", "date": "d"}, H100_LAUNCHES)
    backwards = {kernel: dict(reversed(by_size.items())) for kernel, by_size in reversed(H100_LAUNCHES.items())}
    save(second, H100.name, {"date": "d", "triton": "3.3.1"}, backwards)
    assert first.read_bytes() == second.read_bytes()
    lines = [line.strip() for line in first.read_text().splitlines()]
    assert '"BLOCK_V": 16384,' in lines and '"num_warps": 16' in lines
    replaced = []
    real_replace = launches.os.replace
    monkeypatch.setattr(launches.os, "replace", lambda src, dst: replaced.append((src, dst)) or real_replace(src, dst))
    save(first, A10.name, {}, {})
    (src, dst), = replaced
    assert os.path.dirname(src) == str(tmp_path) and os.path.basename(src).startswith(".a.json.") and dst == first


def test_the_packaged_record_loads(monkeypatch):
    monkeypatch.delenv(RECORD_ENV, raising=False)
    assert isinstance(launches.record(), dict)
    assert launches.record() is load(str(launches.RECORD))
