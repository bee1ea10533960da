"""A pinned Python environment built by Bazel from a hash-locked requirements file, registered as the toolchain.

The venv lives in this repository's directory under a name that contains a digest of the lock and the interpreter,
so a changed lock gives every py_binary/py_test a new interpreter path and cached test results are invalidated.
The installer (install_env.py) installs with `--require-hashes --no-deps` (uv, else pip): the lock is the whole truth.
`RL_PYTHON_LOCK=gpu` selects the GPU lock (CUDA build of torch, vllm) instead of the CPU one.
"""

def _run(rctx, args, what):
    result = rctx.execute(args, timeout = 3600, quiet = True)
    if result.return_code != 0:
        fail("python_env: {} failed:\n{}{}".format(what, result.stdout, result.stderr))
    return result.stdout.strip()

def _python_env_impl(rctx):
    python = rctx.which(rctx.attr.python)
    if not python:
        fail("python_env: interpreter '%s' not found on PATH" % rctx.attr.python)
    flavour = rctx.os.environ.get("RL_PYTHON_LOCK", "cpu")
    if flavour not in ("cpu", "gpu"):
        fail("python_env: RL_PYTHON_LOCK must be 'cpu' or 'gpu', got '%s'" % flavour)
    lock = rctx.path(rctx.attr.lock if flavour == "cpu" else rctx.attr.gpu_lock)
    version = _run(rctx, [python, "-c", "import sys; print(sys.version)"], "reading the interpreter version")
    rctx.file("lock_key.txt", rctx.read(lock) + version + flavour + rctx.read(rctx.attr._installer) +
                              rctx.read(rctx.attr._torchvision_cpu))
    venv = str(rctx.path("venv-" + _run(rctx, ["sha256sum", "lock_key.txt"], "hashing the lock")[:12]))

    rctx.report_progress("installing the pinned environment from " + lock.basename)
    args = [python, rctx.path(rctx.attr._installer), "--lock", lock, "--venv", venv]
    for name in rctx.attr.sdist_packages:
        args += ["--sdist", name]
    _run(rctx, args, "building the environment")

    py = venv + "/bin/python3"
    rctx.symlink(
        _run(rctx, [py, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"], "headers"),
        "python_include",
    )
    rctx.symlink(_run(rctx, [py, "-c", "import pybind11; print(pybind11.get_include())"], "pybind11"), "pybind11_include")
    rctx.template("BUILD.bazel", rctx.attr._build_tpl, {"{FLAVOUR}": flavour, "{VENV}": venv}, executable = False)
    rctx.file("venv_path.txt", venv + "\n")

python_env = repository_rule(
    implementation = _python_env_impl,
    attrs = {
        "gpu_lock": attr.label(default = "//third_party/python:requirements_lock_gpu.txt", allow_single_file = True),
        "lock": attr.label(mandatory = True, allow_single_file = True),
        "python": attr.string(default = "python3"),
        "sdist_packages": attr.string_list(doc = "Packages published only as source, built without isolation."),
        "_build_tpl": attr.label(default = "//third_party/python:python_env.BUILD.tpl"),
        "_installer": attr.label(default = "//third_party/python:install_env.py"),
        "_torchvision_cpu": attr.label(default = "//third_party/python:torchvision_cpu.py"),
    },
    environ = ["RL_PYTHON_LOCK"],
)
