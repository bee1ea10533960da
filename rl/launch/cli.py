"""What every launcher shares on its command line: `--help` prints the usage and every flag the launcher takes and
exits 0; a flag that does not parse (unknown, or a config key written as `--key=value`) is a usage error, exit 2, with
what to write instead. Exit codes, for all launchers: 0 done, 1 the run failed (its last line says why), 2 refused
before anything started (the command line, the config, the data or the machine), 130 interrupted."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

from absl import app, flags

HELP = ("-h", "--help", "--helpshort", "--helpfull", "-?")
OLD_NAMES: dict[str, str] = {}
"""A flag's old name -> its name now (`--output` -> `--run_dir`): still read, with a note saying so."""
OVERRIDE_AS_FLAG = re.compile(r"^--?((?:trainer|generator|data|environment|sft|dpo)\.[\w.]+=.*)$")


def run(main: Callable[[list[str]], int | None], flag_modules: tuple[str, ...] = ("__main__",)) -> None:
    """`main` under absl with the conventions above; `flag_modules`: where the launcher's flags are defined."""
    argv = sys.argv
    if any(arg in HELP for arg in argv[1:]):
        sys.exit(_help(flag_modules))
    if override_as_flag(argv):
        sys.exit(2)
    try:
        flags.FLAGS(argv, known_only=False)
    except flags.Error as error:
        print(f"error: {error}; `{argv[0]} --help` lists the flags", file=sys.stderr)
        sys.exit(2)
    for old, name in OLD_NAMES.items():
        if flags.FLAGS[old].present:
            print(f"note: --{old} is the old name of --{name}, the output folder's flag of every launcher; it still "
                  "works", file=sys.stderr)
    flags.FLAGS.unparse_flags()
    try:
        app.run(main)
    except SystemExit as done:  # absl ends every run this way, main's return value as the code
        code = done.code
    exit_now(code if isinstance(code, int) else 0 if code is None else 1)


def exit_now(code: int) -> None:
    """Ends the process with `code` once the output is flushed and the atexit handlers have run, skipping the
    interpreter's teardown of its modules (about a second with torch, transformers and Ray loaded): the run has
    closed what it wrote by then."""
    import atexit
    import os

    atexit._run_exitfuncs()  # logging's flush and close, Ray's and the libraries' own handlers
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def define_old_name(old: str, name: str, module_name: str) -> None:
    """`--old` read as `--name` (a launcher's earlier spelling), noted when used; listed by `--help` with the flags of
    `module_name` (the launcher's `__name__`)."""
    # absl files a launcher's own flags under its path when it runs as __main__
    flags.DEFINE_alias(old, name, module_name=sys.argv[0] if module_name == "__main__" else module_name)
    OLD_NAMES[old] = name


def _help(flag_modules: tuple[str, ...]) -> int:
    doc = (sys.modules["__main__"].__doc__ or "").strip()
    print(doc, end="\n\n")
    print("flags:")
    for module in flag_modules:
        text = flags.FLAGS.main_module_help() if module == "__main__" else flags.FLAGS.module_help(module)
        print("\n".join(line for line in text.splitlines() if not line.endswith(":") or line.startswith(" ")))
    print("\n" + OVERRIDES_HELP)
    return 0


OVERRIDES_HELP = ("Config overrides follow the flags as bare key=value arguments (lists as \"['a','b']\"), not "
                  "--key=value.")


def override_as_flag(argv: list[str]) -> bool:
    """Whether a config override was written as a flag (`--trainer.seed=3`, a Hydra habit): says what to write."""
    for arg in argv[1:]:
        found = OVERRIDE_AS_FLAG.match(arg)
        if found:
            print(f"error: {arg}: config overrides are bare key=value arguments after the flags: write "
                  f"{found.group(1)}", file=sys.stderr)
            return True
    return False


def refused(error: Exception) -> int:
    """A refused config (`ConfigError`: its own header, then one line per problem) on stderr; the exit code, 2."""
    print(error, file=sys.stderr)
    return 2
