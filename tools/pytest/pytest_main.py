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


if __name__ == "__main__":
    sys.exit(main())
