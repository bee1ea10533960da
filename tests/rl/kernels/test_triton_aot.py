"""//rl/kernels/aot:triton: every Triton kernel compiled ahead of time for sm_80 and sm_90 on a machine without a
GPU. The outputs must be real CUDA ELF cubins whose entry is the kernel, and PTX for the right target."""

import os

import pytest

from rl.kernels.triton.aot_specs import SPECS
from tests.rl.kernels.artifacts import cuobjdump, find


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_cubin_is_cuda_elf_with_kernel_entry(spec, arch):
    path = find(os.path.join("rl", "kernels", "aot", f"triton_sm{arch}", f"{spec.name}.sm{arch}.cubin"))
    with open(path, "rb") as f:
        assert f.read(4) == b"\x7fELF"
    assert f"sm_{arch}" in cuobjdump("--list-elf", path)
    entries = [line.split()[-1] for line in cuobjdump("-symbols", path).splitlines() if "STO_ENTRY" in line]
    assert entries == [spec.entry]


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_ptx_targets_the_architecture(spec, arch):
    path = find(os.path.join("rl", "kernels", "aot", f"triton_sm{arch}", f"{spec.name}.sm{arch}.ptx"))
    with open(path) as f:
        ptx = f.read()
    # sm_90 kernels target sm_90a (Hopper-specific features); the prefix is what matters
    assert f".target sm_{arch}" in ptx
    assert f".entry {spec.entry}(" in ptx
