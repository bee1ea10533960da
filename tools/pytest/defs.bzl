"""py_pytest_test: a py_test whose main runs pytest over its srcs, so pytest's own summary appears in the log.

py_pytest_tests: one py_pytest_test per test file, for a directory whose tests share their dependencies, or one
per group of files (fast unit tests: each target pays the interpreter's, pytest's and torch's start, ~2-3 s).
"""

_SIZES = ["small", "medium", "large", "enormous"]

# Bazel's default timeout of each size, in seconds
_TIMEOUTS = [60, 300, 900, 3600]

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

def py_pytest_tests(
        srcs,
        deps = [],
        data = [],
        size = "small",
        sizes = {},
        tags = {},
        extra_deps = {},
        groups = {},
        **kwargs):
    """One py_pytest_test per file of `srcs`, named after the file: `test_foo.py` becomes `:test_foo`.

    Every target gets `deps`, `data` and `size`; `sizes`, `tags` and `extra_deps` map a target's name to its own
    size, its tags and the deps it needs beyond `deps`. `groups` maps a target's name to the files (names without
    `.py`) it runs together in one pytest process instead of one target each: its size is the smallest whose timeout
    covers its files' timeouts added up (they run one after another), at most one above its largest file's; its
    tags and extra deps are theirs together. A target that differs in anything else (data, env, gpu tags) is clearer
    as its own py_pytest_test, left out of `srcs`.
    """
    names = []
    for src in srcs:
        if not src.endswith(".py") or "/" in src:
            fail("py_pytest_tests takes test files of this package, got %s" % src)
        names.append(src[:-len(".py")])
    grouped = {}
    for group, members in groups.items():
        if group in names:
            fail("py_pytest_tests: group %s has the name of a test file" % group)
        for member in members:
            if member not in names:
                fail("py_pytest_tests: group %s names %s, not one of %s" % (group, member, names))
            if member in grouped:
                fail("py_pytest_tests: %s is in groups %s and %s" % (member, grouped[member], group))
            grouped[member] = group
    for per_target in (sizes, tags, extra_deps):
        for name in per_target:
            if name not in names and name not in groups:
                fail("py_pytest_tests: %s is not one of the targets %s" % (name, names + groups.keys()))
    for src, name in zip(srcs, names):
        if name in grouped:
            continue
        py_pytest_test(
            name = name,
            srcs = [src],
            deps = deps + extra_deps.get(name, []),
            data = data,
            size = sizes.get(name, size),
            tags = tags.get(name, []),
            **kwargs
        )
    for group, members in groups.items():
        group_deps, group_tags = list(deps), []
        for member in members + [group]:
            group_deps += [dep for dep in extra_deps.get(member, []) if dep not in group_deps]
            group_tags += [tag for tag in tags.get(member, []) if tag not in group_tags]

        # the files run one after another: the group gets the time they would have had each, up to one size above
        # its largest file's (a group of unit files stays short enough to name a hang)
        member_sizes = [_SIZES.index(sizes.get(member, size)) for member in members]
        group_seconds = 0
        for index in member_sizes:
            group_seconds += _TIMEOUTS[index]
        group_size = min(max(member_sizes) + 1, len(_SIZES) - 1)
        for index in range(len(_SIZES)):
            if _TIMEOUTS[index] >= group_seconds:
                group_size = min(group_size, index)
                break
        group_size = max(group_size, max(member_sizes), _SIZES.index(sizes.get(group, size)))
        py_pytest_test(
            name = group,
            srcs = [member + ".py" for member in members],
            deps = group_deps,
            data = data,
            size = _SIZES[group_size],
            tags = group_tags,
            **kwargs
        )
