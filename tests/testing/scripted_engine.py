"""A scripted generation engine for the agent endpoint's tests: known answers and known logprobs, every call
recorded; and the bearer header a request to the endpoint carries."""

from __future__ import annotations

import re

from rl.core.generation.engine import Rollout, SamplingParams


class ScriptedEngine:
    """Answers "#### 0" (wrong) on a first attempt and the right sum on a second, ending with the eos token; records
    every call. Logprobs are -0.1 * (position + 1), so each token's logprob is known."""

    def __init__(self, tokenizer, first_right: bool = False):
        self.tokenizer, self.first_right, self.calls = tokenizer, first_right, []

    def __call__(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]:
        out = []
        for index, prompt in enumerate(prompts):
            text = self.tokenizer.decode(prompt, skip_special_tokens=False)
            left, right = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", text)[-1])
            attempt = text.count("<|assistant|>")
            answer = left + right if (attempt == 2 or self.first_right) else 0
            ids = self.tokenizer(f"#### {answer}<|end|>", add_special_tokens=False)["input_ids"]
            out.append(Rollout(index, 0, list(prompt), ids, [-0.1 * (k + 1) for k in range(len(ids))], None,
                               "stop", f"#### {answer}"))
        self.calls.append((prompts, params, out))
        return out


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
