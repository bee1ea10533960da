"""Rules that compile CUDA with the local nvcc and bind kernels into Python extensions with pybind11.

Without a CUDA toolkit the targets are marked incompatible: `bazel build //...` skips them, and building one by
name fails with Bazel's "incompatible" message, while the repository rule prints why.
"""

load("@local_cuda//:defs.bzl", "CUDA_FOUND", "NVCC")

DEFAULT_GENCODES = [
    "arch=compute_80,code=sm_80",
    "arch=compute_90,code=sm_90",
    "arch=compute_90,code=compute_90",
]

def _cuda_object_impl(ctx):
    headers = depset(ctx.files.hdrs, transitive = [dep[CcInfo].compilation_context.headers for dep in ctx.attr.deps])
    include_dirs = depset(transitive = [dep[CcInfo].compilation_context.includes for dep in ctx.attr.deps] +
                                       [dep[CcInfo].compilation_context.system_includes for dep in ctx.attr.deps])
    objects = []
    for src in ctx.files.srcs:
        obj = ctx.actions.declare_file("_objs/{}/{}.o".format(ctx.label.name, src.basename))
        args = ctx.actions.args()
        args.add_all(["-c", "-Xcompiler", "-fPIC", "-std=c++17", "-O3", "--expt-relaxed-constexpr"])
        for gencode in ctx.attr.gencodes:
            args.add("-gencode", gencode)
        args.add_all(include_dirs, before_each = "-I")
        args.add("-I", ".")
        args.add_all(ctx.attr.copts)
        args.add("-o", obj)
        args.add(src)
        ctx.actions.run(
            executable = ctx.attr.nvcc,
            arguments = [args],
            inputs = depset([src], transitive = [headers]),
            outputs = [obj],
            mnemonic = "NvccCompile",
            progress_message = "nvcc {} ({})".format(src.short_path, ", ".join(ctx.attr.gencodes)),
            use_default_shell_env = True,
        )
        objects.append(obj)
    return [DefaultInfo(files = depset(objects))]

cuda_object = rule(
    implementation = _cuda_object_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "gencodes": attr.string_list(default = DEFAULT_GENCODES),
        "copts": attr.string_list(),
        "nvcc": attr.string(mandatory = True),
    },
    doc = "Compiles .cu files with nvcc into relocatable objects for the given gencodes (sm_80, sm_90 + PTX).",
)

def _compatible():
    return [] if CUDA_FOUND else ["@platforms//:incompatible"]

def cuda_library(name, srcs, hdrs = [], deps = [], gencodes = DEFAULT_GENCODES, copts = [], **kwargs):
    """A cc_library made of nvcc-compiled objects; skipped on machines without a CUDA toolkit."""
    cuda_object(
        name = name + "_objects",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + (["@local_cuda//:cuda_headers"] if CUDA_FOUND else []),
        gencodes = gencodes,
        copts = copts,
        nvcc = NVCC or "nvcc",
        target_compatible_with = _compatible(),
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_objects"],
        hdrs = hdrs,
        deps = deps + (["@local_cuda//:cudart_static"] if CUDA_FOUND else []),
        linkstatic = True,
        alwayslink = True,
        target_compatible_with = _compatible(),
        **kwargs
    )

def py_cuda_extension(name, srcs, cuda_srcs, hdrs = [], deps = [], gencodes = DEFAULT_GENCODES, **kwargs):
    """A Python extension module `name`.so: pybind11 bindings (`srcs`) over kernels in `cuda_srcs`.

    The kernels are bound over raw device pointers and a stream handle, so the extension does not depend on the
    C++ ABI of the torch it runs beside, and the CUDA runtime is linked statically.
    """
    cuda_library(name = name + "_kernels", srcs = cuda_srcs, hdrs = hdrs, deps = deps, gencodes = gencodes)
    native.cc_binary(
        name = name + ".so",
        srcs = srcs + hdrs,
        deps = [":" + name + "_kernels", "@python_env//:pybind11"],
        linkshared = True,
        copts = ["-fvisibility=hidden", "-std=c++17"],
        target_compatible_with = _compatible(),
    )
    native.py_library(
        name = name,
        data = [":" + name + ".so"],
        target_compatible_with = _compatible(),
        **kwargs
    )
