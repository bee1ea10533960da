"""Entry point of every py_pytest_test: runs pytest on the test's own files so pytest's summary is in the log."""

import os
import sys

import pytest

NO_TESTS_COLLECTED = 5


def main() -> int:
    files = sys.argv[1:]
    # pytest's plugin autoload reads the entry points of every installed distribution, ~0.6 s of each target's start
    # with this environment; the one plugin the tests use is named instead.
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    args = ["-p", "hypothesis.extra.pytestplugin", "-p", "no:cacheprovider", "--import-mode=importlib",
            "-o", "console_output_style=classic", "-rs", *files]
    if os.environ.get("XML_OUTPUT_FILE"):
        args.append("--junitxml=" + os.environ["XML_OUTPUT_FILE"])
    code = pytest.main(args)
    if code == NO_TESTS_COLLECTED:
        print(f"pytest collected no tests from {files}: failing, since an empty test target proves nothing")
        return 1
    return int(code)


def exit_now(code: int) -> None:
    """Ends with `code` once the atexit handlers (the tests' Ray cluster, their temporary folders) have run and the
    output is flushed, skipping the interpreter's teardown of torch, transformers and Ray (about a second of every
    target); the report is written by then."""
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
