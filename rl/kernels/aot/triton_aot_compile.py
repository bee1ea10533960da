"""Compiles every Triton kernel in rl/kernels/triton/aot_specs.py for one CUDA architecture, without a GPU.

    triton_aot_compile.py --arch 90 --out_dir DIR [--expect NAME ...]

writes DIR/NAME.sm90.cubin and DIR/NAME.sm90.ptx per kernel. `--expect` lists the names the build declared;
a mismatch with aot_specs.py fails with the names to add or remove in rl/kernels/aot/BUILD.bazel.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, required=True, help="compute capability as an integer: 80, 90")
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--expect", nargs="*", default=None)
    args = parser.parse_args(argv)
    # Hermetic: a private Triton cache, never ~/.triton.
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton_aot_")
    os.environ.pop("TRITON_INTERPRET", None)

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from rl.kernels.triton.aot_specs import SPECS

    names = [spec.name for spec in SPECS]
    if args.expect is not None and sorted(args.expect) != sorted(names):
        missing, extra = sorted(set(names) - set(args.expect)), sorted(set(args.expect) - set(names))
        print(
            f"triton_aot kernels out of date: add {missing}, remove {extra} in rl/kernels/aot/BUILD.bazel",
            file=sys.stderr,
        )
        return 1
    os.makedirs(args.out_dir, exist_ok=True)
    target = GPUTarget("cuda", args.arch, 32)
    for spec in SPECS:
        source = ASTSource(fn=spec.fn, signature=spec.signature, constexprs=spec.constexprs)
        kernel = compile(source, target=target, options={"num_warps": spec.num_warps})
        stem = os.path.join(args.out_dir, f"{spec.name}.sm{args.arch}")
        with open(stem + ".cubin", "wb") as f:
            f.write(kernel.asm["cubin"])
        with open(stem + ".ptx", "w") as f:
            f.write(kernel.asm["ptx"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
