"""Finds the local CUDA toolkit (nvcc) so CUDA targets build where it exists and are skipped where it does not.

Search order: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, then `nvcc` on PATH. The repository exposes
`defs.bzl` (CUDA_FOUND, NVCC, CUDA_VERSION) and cc targets for the headers and the static runtime.
"""

def _find_cuda_root(rctx):
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = rctx.os.environ.get(var, "")
        if root and rctx.path(root + "/bin/nvcc").exists:
            return root
    if rctx.path("/usr/local/cuda/bin/nvcc").exists:
        return "/usr/local/cuda"
    nvcc = rctx.which("nvcc")
    if nvcc:
        return str(nvcc.dirname.dirname)
    return None

def _local_cuda_impl(rctx):
    root = _find_cuda_root(rctx)
    if not root:
        # buildifier: disable=print
        print("local_cuda: no CUDA toolkit found (set CUDA_HOME); CUDA kernel targets are skipped.")
        rctx.file("defs.bzl", "CUDA_FOUND = False\nNVCC = None\nCUDA_VERSION = None\n")
        rctx.file("BUILD.bazel", "")
        return
    result = rctx.execute([root + "/bin/nvcc", "--version"])
    version = "unknown"
    for word in result.stdout.replace(",", " ").replace("\n", " ").split(" "):
        if word.startswith("V") and word[1:2].isdigit():
            version = word[1:]
    rctx.symlink(root + "/include", "include")
    lib = root + "/lib64" if rctx.path(root + "/lib64").exists else root + "/lib"
    rctx.symlink(lib + "/libcudart_static.a", "lib/libcudart_static.a")
    rctx.file("defs.bzl", 'CUDA_FOUND = True\nNVCC = "{}/bin/nvcc"\nCUDA_VERSION = "{}"\n'.format(root, version))
    rctx.file("BUILD.bazel", """package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.inl"]),
    includes = ["include"],
)

# The static CUDA runtime: extensions do not depend on a libcudart.so at run time.
cc_library(
    name = "cudart_static",
    srcs = ["lib/libcudart_static.a"],
    linkopts = ["-ldl", "-lpthread", "-lrt"],
    deps = [":cuda_headers"],
)
""")

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    environ = ["CUDA_HOME", "CUDA_PATH", "PATH"],
    local = True,
)
