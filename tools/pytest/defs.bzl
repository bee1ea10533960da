"""py_pytest_test: a py_test whose main runs pytest over its srcs, so pytest's own summary appears in the log.

py_pytest_tests: one py_pytest_test per test file, for a directory whose tests share their dependencies.
"""

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

def py_pytest_tests(srcs, deps = [], data = [], size = "small", sizes = {}, tags = {}, extra_deps = {}, **kwargs):
    """One py_pytest_test per file of `srcs`, named after the file: `test_foo.py` becomes `:test_foo`.

    Every target gets `deps`, `data` and `size`; `sizes`, `tags` and `extra_deps` map a target's name to its own
    size, its tags and the deps it needs beyond `deps`. A target that differs in anything else (data, env, gpu
    tags) is clearer as its own py_pytest_test, left out of `srcs`.
    """
    names = []
    for src in srcs:
        if not src.endswith(".py") or "/" in src:
            fail("py_pytest_tests takes test files of this package, got %s" % src)
        names.append(src[:-len(".py")])
    for per_target in (sizes, tags, extra_deps):
        for name in per_target:
            if name not in names:
                fail("py_pytest_tests: %s is not one of the targets %s" % (name, names))
    for src, name in zip(srcs, names):
        py_pytest_test(
            name = name,
            srcs = [src],
            deps = deps + extra_deps.get(name, []),
            data = data,
            size = sizes.get(name, size),
            tags = tags.get(name, []),
            **kwargs
        )
