"""py_pytest_test: a py_test whose main runs pytest over its srcs, so pytest's own summary appears in the log."""

def py_pytest_test(name, srcs, deps = [], data = [], args = [], tags = [], size = "small", env = {}, **kwargs):
    """One Bazel test target running pytest on `srcs`.

    Tag accelerator tests with tags = ["gpu"]: the default `cpu` config neither builds nor runs them.
    """
    native.py_test(
        name = name,
        srcs = srcs + ["//tools/pytest:pytest_main.py"],
        main = "//tools/pytest:pytest_main.py",
        deps = deps,
        data = data,
        args = args + ["$(location %s)" % src for src in srcs],
        tags = tags,
        size = size,
        env = dict({"OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}, **env),
        python_version = "PY3",
        **kwargs
    )
