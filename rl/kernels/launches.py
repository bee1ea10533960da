"""Kernel launches measured per device: bench/tune_kernels.py times the candidate launches (`sizing.
candidate_launches`) on a device and records the fastest in launch_configs.json, so that no run searches them at
start. A launch is looked up by the device's name, the kernel and its size; a device, kernel or size with nothing
recorded gets `sizing.default_launch`.

The record, by device name (`torch.cuda.get_device_name()`):

    {"NVIDIA H100 80GB HBM3": {
        "measured": {"triton": "3.3.1", "torch": "2.11.0", "date": "...", ...},
        "kernels": {"logprobs_fwd": {"32768": {"BLOCK_V": 4096, "num_warps": 8, "of_peak": 0.71, ...}}}}}

Sizes are recorded by their power of two (a vocabulary of 151,936 under "262144"); a lookup takes the recorded size
nearest in powers of two, with blocks no wider than its own size needs. $RL_KERNEL_LAUNCHES names another record to
use instead (one tuned on a device this project has no figures for)."""

from __future__ import annotations

import functools
import json
import os
import tempfile
from pathlib import Path

from rl.kernels.sizing import (
    ROW_KERNELS,
    Device,
    candidate_launches,
    check_kernel,
    default_launch,
    next_power_of_2,
)

RECORD = Path(__file__).with_name("launch_configs.json")
RECORD_ENV = "RL_KERNEL_LAUNCHES"
FIGURES = ("gbps", "of_peak", "default_gbps", "default_of_peak")
"""What a recorded launch may carry beside its parameters: the figures it was chosen by."""


def launch(kernel: str, size: int, device: Device) -> dict[str, int]:
    """The launch parameters (constexpr blocks and num_warps) of `kernel` at `size` on `device`."""
    recorded = record().get(device.name, {}).get("kernels", {}).get(kernel)
    if not recorded:
        return default_launch(kernel, size)
    widest = next_power_of_2(size)
    bucket = min(recorded, key=lambda b: (abs(int(b).bit_length() - widest.bit_length()), -int(b)))
    chosen = {key: value for key, value in recorded[bucket].items() if key not in FIGURES}
    block = "BLOCK_V" if kernel in ROW_KERNELS else "BLOCK_D"
    chosen[block] = min(chosen[block], widest)
    return chosen


def record() -> dict:
    return load(os.environ.get(RECORD_ENV) or str(RECORD))


@functools.cache
def load(path: str) -> dict:
    """The record at `path`, every launch in it checked (a launch the tests do not cover is refused)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: cannot read the kernel launch record ({err}); fix or remove it"
                         f"{f' (or unset {RECORD_ENV})' if path != str(RECORD) else ''}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the kernel launch record must be an object of device names")
    for device, entry in data.items():
        kernels = entry.get("kernels") if isinstance(entry, dict) else None
        if not isinstance(kernels, dict):
            raise ValueError(f"{path}: {device!r} has no \"kernels\" object")
        _check_kernels(f"{path}: {device!r}", kernels)
    return data


def _check_kernels(where: str, kernels: dict) -> None:
    for kernel, sizes in kernels.items():
        for size, launch_ in (sizes or {}).items():
            _check_launch(f"{where} {kernel} at {size}", kernel, size, launch_)


def _check_launch(where: str, kernel: str, size: str, recorded) -> None:
    try:
        check_kernel(kernel)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    if not (size.isdigit() and next_power_of_2(int(size)) == int(size)):
        raise ValueError(f"{where}: sizes are recorded by their power of two, not {size!r}")
    if not isinstance(recorded, dict):
        raise ValueError(f"{where}: a launch is an object of parameters, not {recorded!r}")
    params = {key: value for key, value in recorded.items() if key not in FIGURES}
    if params not in candidate_launches(kernel, int(size)):
        raise ValueError(f"{where}: {params} is not one of the launches the tests check "
                         f"(rl.kernels.sizing.candidate_launches); re-run bench/tune_kernels.py to record another")


def save(path: str | Path, device: str, measured: dict, kernels: dict[str, dict[str, dict]]) -> None:
    """Writes `device`'s launches into the record at `path` (started from the packaged record when absent), keeping
    the other devices'; checked before it replaces the file, which is replaced whole or not at all."""
    path = Path(path)
    data = json.loads((path if path.exists() else RECORD).read_text())
    data[device] = {"measured": measured, "kernels": kernels}
    _check_kernels(repr(device), kernels)
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"  # a value a line, in one order: a re-tune's diff is small
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
        tmp.write(text)
    os.replace(tmp.name, path)
    load.cache_clear()
