"""`python_expression`: a code-execution reward for tasks whose answers are Python expressions. The response's
expression (after its last `####`, else in its last ```python block, else the whole response) is evaluated in the
jail (`rl.core.sandbox`: bubblewrap, a seccomp filter, no network, a read-only root of only the interpreter, a capped
scratch tmpfs, CPU, memory, process and output limits, a deadline); the reward is 1 when the value's repr equals that
of the row's answer (also evaluated in the jail), else 0. A machine that cannot build the jail refuses the run
before anything starts, with the reason (unless environment.sandbox.allow_weaker_isolation)."""

from __future__ import annotations

import re

from rl.core.rewards.registry import REWARD_FUNCTIONS
from rl.core.sandbox import SandboxLimits, run_python, runs_model_code

LIMITS = SandboxLimits(wall_s=10, cpu_s=2, memory_mb=256, processes=8, output_bytes=4096, file_mb=1)
BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def expression_of(response: str) -> str:
    if "####" in response:
        return response.rsplit("####", 1)[1].strip()
    blocks = BLOCK.findall(response)
    return (blocks[-1] if blocks else response).strip()


def _value(expression: str) -> tuple[str | None, str]:
    """(repr of the value, or None, and how the run ended)."""
    program = f"print(repr(eval(compile({expression!r}, '<answer>', 'eval'), {{}})))"
    result = run_python(program, LIMITS)
    return (result.stdout.strip() if result.ok else None), result.status


@REWARD_FUNCTIONS.register("python_expression")
@runs_model_code
def python_expression_reward(response: str, answer: str) -> dict[str, float]:
    """1 when the response's expression evaluates (in the jail) to the answer's value; `sandbox_ok` logs the
    share of responses whose code ran to the end."""
    expression = expression_of(response)
    if not expression:
        return {"score": 0.0, "sandbox_ok": 0.0}
    got, status = _value(expression)
    expected, _ = _value(answer)
    return {"score": float(got is not None and got == expected), "sandbox_ok": float(status == "ok")}
