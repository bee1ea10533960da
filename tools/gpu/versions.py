"""What a GPU acceptance run ran on: Python, torch, CUDA, the GPUs and the packages the tests and benchmarks use
(a missing optional package is a reason for skips in the report). Run by tools/gpu/acceptance.sh with the machine's
python3, or through Bazel (`bazel run --config=gpu //tools/gpu:versions`) with the GPU lock's environment."""

import importlib
import importlib.util
import platform
import sys

PACKAGES = ("triton", "transformers", "peft", "pybind11", "pytest", "pytest_timeout", "numpy", "pyarrow",
            "safetensors", "absl", "ray", "vllm", "deepspeed", "megatron.core", "liger_kernel", "flash_attn")


def main() -> int:
    print("python", sys.version.replace("\n", " "), "at", sys.executable)
    import torch

    print("torch", torch.__version__, "| cuda", torch.version.cuda, "| cudnn", torch.backends.cudnn.version())
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(f"gpu {i}: {p.name}, sm_{p.major}{p.minor}, {p.total_memory / 2**30:.1f} GiB, "
                  f"{p.multi_processor_count} SMs")
    else:
        print("gpu: none visible (torch.cuda.is_available() is False)")
    for name in PACKAGES:
        if importlib.util.find_spec(name.split(".")[0]) is None:
            print(f"{name}: not installed")
            continue
        try:
            module = importlib.import_module(name)
            print(f"{name}: {getattr(module, '__version__', '(no __version__)')}")
        except Exception as err:  # a broken install is a finding of the run, not its end
            print(f"{name}: import fails: {type(err).__name__}: {err}")
    print("platform", platform.platform())
    return 0


if __name__ == "__main__":
    sys.exit(main())
