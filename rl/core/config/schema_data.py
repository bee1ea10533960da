"""The `data:` and `environment:` blocks of the config tree (datasets and rewards; multi-turn environments,
agents and the jail)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(kw_only=True)
class DataConfig:
    """Datasets and the reward."""

    train_data: list[str]
    """Training files (parquet or jsonl); at least one. `~` is expanded. A single path is accepted. `embedded` is the
    embedded default job's synthetic task (built in the run directory)."""

    val_data: list[str]
    """Evaluation files; may be empty (no evaluation). `~` is expanded."""

    val_split_size: float
    """Rows of data.train_data held out as the validation set (NeMo RL's `split_validation_size`): 0 holds out
    none; a fraction in (0, 1) holds out that share, rounded up; a whole number >= 1 that many rows. The rows are
    those Hugging Face's `train_test_split(test_size, seed=val_split_seed)` holds out; they are evaluated with the
    rows of data.val_data, if any (as NeMo RL merges them)."""

    val_split_seed: int
    """Seed of the permutation that picks the held-out rows of val_split_size (NeMo RL's dataset `seed`)."""

    prompt_key: str
    """Column holding the prompt."""

    answer_key: str
    """Column holding the reference answer given to the reward function. A row without that column takes its
    answer from `reward_spec.ground_truth` (the layout SkyRL's data preparation scripts write); a row with neither
    prompt_key nor answer_key but a `messages` conversation ending in an assistant message (NeMo RL's math data)
    takes the messages before it as the prompt and its content as the answer."""

    reward_fn: list[str]
    """The reward: a registered name (`gsm8k`, `gsm8k_flexible`, `gsm8k_skyrl`: SkyRL-gym's grading, the first
    `#### N` compared as text; `reward_model` and `llm_judge` for the models of
    trainer.reward), your own `package.module:function` or
    `path/to/file.py:function`, or a list of them (summed with reward_weights). A function is called as
    `fn(response, answer, **fields)` with the row's other columns it names (all with **kwargs; `prompt`,
    `data_source`, `index` always exist) and returns a number or a dict with `score` and further numbers (logged
    as reward/<function>/<name>). Checked (import, signature) before anything starts. A single name is accepted."""

    reward_weights: list[float] | None
    """Weight of each reward_fn entry in the sum (TRL's name); null weighs each 1."""

    reward_num_workers: int
    """Processes that run the reward functions in parallel, >= 0; 0 runs them in the driver, one after another
    (then reward_timeout_s must be null)."""

    reward_timeout_s: float | None
    """Seconds one reward call may take before its process is killed and the call counts as an error; null: no
    limit."""

    reward_on_error: str
    """What a reward call that raises, times out, kills its process or returns NaN / a non-number does: `fail`
    ends the run naming the function and the row; `zero` scores it 0, counts it in reward_errors and goes on."""

    prompt_template_file: str | None
    """A text file whose text, with the row's problem put in its one `{}`, is the user message of every prompt (NeMo
    RL's `prompt_file`; Python's str.format reads it, so a literal brace is written `{{` or `}}`). The problem is the
    row's prompt: text, or a chat of one user message (NeMo RL's math rows); any other chat is refused naming the
    row. The prompt then goes through the tokenizer's chat template with the generation prompt, as a chat prompt
    does. Read whole as UTF-8; `~` is expanded and a relative path is read from the working directory (under `bazel
    run`, the directory bazel was run from). A missing, empty or unreadable file, or a template without exactly one
    `{}`, is refused when the config loads. Applies to the training and evaluation prompts alike (and so to
    multi-turn episodes and agents, which start from them); null: the prompt as the data holds it."""

    system_prompt_file: str | None
    """A text file whose whole text is a system message put before the user message of every prompt (NeMo RL's
    `system_prompt_file`); the prompt is built as for prompt_template_file (which may be null: the user message is
    then the problem itself). Read and checked like prompt_template_file; null: no system message."""

    truncation: str
    """A prompt longer than generator.max_prompt_length tokens (after the chat template), as veRL's
    `data.truncation`: `left` keeps its last tokens, `right` its first, `middle` the first and last halves; each
    truncated row is named in a warning once and counted per step in `prompts_truncated`. `error` refuses such a
    prompt before anything starts (naming the file and row) where the model's tokenizer is at hand, else at the
    start of training."""


@dataclass(kw_only=True)
class SandboxConfig:
    """The jail model-written code runs in (`rl.core.sandbox`: bubblewrap, a seccomp filter and rlimits; its
    docstring says what it guarantees). A run whose reward runs model code (data.reward_fn=python_expression) is
    refused before anything starts where this machine cannot build the jail (no bubblewrap, no user namespaces) or
    give it its seccomp filter (a CPU other than x86_64), naming why."""

    allow_weaker_isolation: bool
    """`true` runs such a run anyway, with what the machine can give, and says what is missing at the start: without
    the seccomp filter the code runs in the jail without it; without a jail it runs unconfined (a child process
    with the limits and an empty environment, but able to read and write what the trainer's user can and to reach
    the network). `false` (the default) refuses it."""


@dataclass(kw_only=True)
class EnvironmentConfig:
    """Multi-turn environments (SkyRL's `environment` block)."""

    env_class: str | None
    """The environment each episode runs in: a registered name (`gsm8k_multi_turn`: SkyRL-gym's multi-turn GSM8K,
    rl/tasks/gsm8k/environments.py; `gsm8k`, SkyRL-gym's single-turn one, is read as data.reward_fn=gsm8k_skyrl
    with env_class null; `arith_retry`: the embedded task with a second
    attempt after a wrong answer) or your own `package.module:Class` / `path/to/file.py:Class`, a subclass of
    `rl.core.environments.Environment`. Its step rewards (summed) are the episode's reward, in place of
    data.reward_fn. null: single-turn generation scored by data.reward_fn."""

    env_options: dict[str, Any]
    """Keyword arguments for the environment class (e.g. {attempts: 3} for arith_retry; {max_turns: 5,
    chat_format: chatml} for gsm8k_multi_turn, whose max_turns is generator.max_turns unless given here, as SkyRL's
    generator sets it). A data row's own `env_class` column names the environment of that row's episodes in place
    of env_class, as in SkyRL, and gets no options; in a single-turn run (env_class null) a row may name only
    `gsm8k`, with data.reward_fn=gsm8k_skyrl. Any other row's env_class is refused naming the file and row."""

    step_timeout_s: float | None
    """Seconds one call into an environment (building it, `start`, each `step`) may take. Past it the call is
    abandoned and counts as a failed episode, handled as data.reward_on_error says (`fail` ends the run naming the
    environment, the row and the turn). null: no limit."""

    max_env_workers: int
    """Threads that run the environments' calls, >= 1 (SkyRL's `environment.skyrl_gym.max_env_workers`): the
    episodes of a turn are stepped side by side, each in its own environment instance; 1 steps them one after
    another. An environment that shares state between its instances must guard it, or use 1."""

    agent_fn: str | None
    """Agent code that plays each episode through the endpoint (generator.enable_http_endpoint=true): your own
    `path/to/file.py:run` or `package.module:run`, an `async def run(base_url, row, api_key)` that talks to the
    policy with any OpenAI client at `base_url`, sending `api_key` (the endpoint answers nothing else), and returns
    the episode's reward (a number, or a dict with `reward` and further numbers, logged as agent/<name>). `row` is
    the data row as a dict (`prompt`, `answer`, `data_source`, `index` and its other columns). Its return value
    replaces data.reward_fn. Checked (import, async, signature) before anything starts. null: no agent."""

    agent_timeout_s: float | None
    """Seconds one agent episode may take; past it the episode counts as failed (handled as data.reward_on_error
    says). null: no limit."""

    sandbox: SandboxConfig
    """The jail for model-written code."""
