"""Prompt templates (data.prompt_template_file, data.system_prompt_file; NeMo RL's `prompt_file` and
`system_prompt_file`, read as its math data processor reads them).

A row's prompt is its problem: text, or a chat of one user message (NeMo RL's math rows). With a template it becomes
a chat: a system message holding the system prompt file's text (when given), then a user message holding the
template file's text with the problem in its one `{}`, as Python's `str.format` puts it (`{{` and `}}` are literal
braces); without a template file the user message is the problem itself. Files are read whole as UTF-8; a relative
path is read from the directory the command runs in (under `bazel run`, the one bazel was run from). Any other chat
is refused naming the row: a template has one problem to put in.
"""

from __future__ import annotations

import os
import string
from dataclasses import dataclass

from rl.core.data.errors import DataError
from rl.core.data.records import ChatMessage, Prompt

TEMPLATE_KEY = "data.prompt_template_file"
SYSTEM_KEY = "data.system_prompt_file"


def resolve(path: str) -> str:
    """The absolute path `path` is read from: `~` expanded, a relative path from the working directory."""
    return os.path.abspath(os.path.join(os.environ.get("BUILD_WORKING_DIRECTORY", ""), os.path.expanduser(path)))


def placeholder_problem(text: str) -> str | None:
    """Why `text` is not a template with exactly one `{}` (or `{0}`) for the problem, or None."""
    braces = "write a literal brace doubled, {{ or }}, as Python's str.format reads them"
    try:
        fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(text)
                  if name is not None]
    except ValueError as error:
        return f"is not a valid template ({error}); {braces}"
    if not fields:
        return f"has no {{}} where the problem goes; add one ({braces})"
    shown = ", ".join("{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
                      for name, spec, conversion in fields)
    if len(fields) > 1 or fields[0] not in (("", "", None), ("0", "", None)):
        return f"has the placeholders {shown}; it needs exactly one {{}} where the problem goes ({braces})"
    return None


def read_prompt_file(path: str, template: bool) -> str:
    """The whole text of `path`; a template must have its one `{}`. Raises DataError (without the key) naming the
    path and the fix."""
    resolved = resolve(path)
    shown = path if path == resolved else f"{path} (read as {resolved})"
    try:
        with open(resolved, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise DataError(f"{shown} does not exist; give the path of the file (a relative path is read from the "
                        "working directory) or null for none") from None
    except IsADirectoryError:
        raise DataError(f"{shown} is a directory; give the path of a text file") from None
    except UnicodeDecodeError as error:
        raise DataError(f"{shown} is not UTF-8 text ({error.reason} at byte {error.start}); save it as UTF-8") from None
    except OSError as error:
        raise DataError(f"{shown} cannot be read ({error.strerror}); fix its permissions or give another "
                        "file") from None
    if not text.strip():
        raise DataError(f"{shown} is empty; write the {'template' if template else 'system prompt'} in it, or set "
                        "the key to null")
    problem = placeholder_problem(text) if template else None
    if problem:
        raise DataError(f"{shown} {problem}")
    return text


def prompt_file_problem(path: str | None, template: bool) -> str | None:
    """What keeps `path` from serving as the template (`template`) or system prompt, or None (also for null)."""
    if path is None:
        return None
    try:
        read_prompt_file(path, template)
    except DataError as error:
        return str(error)
    return None


@dataclass(frozen=True)
class PromptTemplate:
    """The texts a prompt is built from: `user` with one `{}` for the problem (None: the problem as it is) and
    `system` (None: no system message)."""

    user: str | None = None
    system: str | None = None

    def apply(self, prompt: Prompt, where: str) -> Prompt:
        """The chat for a row's `prompt` ([system,] user), NeMo RL's math processor's messages."""
        problem = _problem(prompt, where)
        content = self.user.format(problem) if self.user is not None else problem
        system = (ChatMessage("system", self.system),) if self.system is not None else ()
        return (*system, ChatMessage("user", content))


def load_prompt_template(template_file: str | None, system_file: str | None) -> PromptTemplate | None:
    """The template of the two files (None when both are null). Raises DataError naming the key and path."""
    if template_file is None and system_file is None:
        return None
    texts = {}
    for key, path, template in ((TEMPLATE_KEY, template_file, True), (SYSTEM_KEY, system_file, False)):
        try:
            texts[key] = read_prompt_file(path, template) if path is not None else None
        except DataError as error:
            raise DataError(f"{key}: {error}") from None
    return PromptTemplate(user=texts[TEMPLATE_KEY], system=texts[SYSTEM_KEY])


def _problem(prompt: Prompt, where: str) -> str:
    if isinstance(prompt, str):
        return prompt
    if len(prompt) == 1 and prompt[0].role == "user":
        return prompt[0].content
    roles = ", ".join(message.role for message in prompt)
    raise DataError(f"{where}: the prompt is a chat of {len(prompt)} messages ({roles}), but {TEMPLATE_KEY} / "
                    f"{SYSTEM_KEY} build the chat from one problem: give the row's prompt as text or as one user "
                    "message, or set both keys to null to use the conversation as written")
