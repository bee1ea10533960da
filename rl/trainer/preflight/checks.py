"""What must hold on this machine before a run spends anything (Ray, a model load, the embedded warm-up): the prompt
files read and hold the configured keys and enough prompts (built with the prompt template, so every row's prompt
suits it and the length checks below see the prompts the trainer encodes), the model path exists when it is local,
the reward is registered (and, when it runs model-written code, the jail of `rl.core.sandbox` can be built here), a
multi-turn environment builds and every prompt leaves room in its episodes, prompts fit
generator.max_prompt_length (data.truncation=error) and the model's positions, checkpoints and exports can be
written where the config says, a checkpoint to resume is complete, intact and of this strategy, the kernels
`trainer.kernels` names and nccl weight sync can run here (both need CUDA) and the Triton kernels' launch record
reads (rl.kernels.launches, $RL_KERNEL_LAUNCHES), the vLLM engines' KV cache fits this
machine (`rl.trainer.preflight.engine_memory`), the placement fits this machine, and the memory planner predicts the
layout fits its GPUs (`rl.trainer.preflight.memory_plan`). Every problem is reported at once as a
ConfigError naming the key."""

from __future__ import annotations

import dataclasses
import inspect
import os

import torch

from rl.core import batch_invariant
from rl.core.config import ConfigError
from rl.core.config.choices import MODEL_REWARDS
from rl.core.config.errors import did_you_mean
from rl.core.data import DataError, load_prompt_dataset, load_prompt_template, split_validation
from rl.tasks.jobs import BUILT_MODELS, EMBEDDED_JOBS, looks_local, model_at_hand
from rl.trainer.multi_turn.agents import agent_problems
from rl.trainer.preflight.companion_models import companion_model_problems
from rl.trainer.preflight.memory_plan import memory_problems
from rl.trainer.preflight.vision import image_rows_problems, image_size_problems, vision_language_problems
from rl.trainer.preflight.weights import weight_problems


def _data_problems(cfg, loaded: dict) -> list[str]:
    """The prompt files load; each loaded dataset is kept in `loaded` by its key for the checks after."""
    found = []
    from rl.trainer.multi_turn.row_environments import env_class_check

    try:  # checked when the config loaded; read again here, where the prompts are built from it
        template = load_prompt_template(cfg.data.prompt_template_file, cfg.data.system_prompt_file)
    except DataError as error:
        return [str(error)]
    keys = {"prompt_key": cfg.data.prompt_key, "answer_key": cfg.data.answer_key,
            "env_class_check": env_class_check(cfg), "template": template}
    for key, paths in (("data.train_data", cfg.data.train_data), ("data.val_data", cfg.data.val_data or [])):
        given = [path for path in paths if path not in EMBEDDED_JOBS]
        if not given:
            continue
        try:
            dataset = load_prompt_dataset(given, **keys)
        except DataError as error:
            found.append(f"{key}: {error}")
            continue
        loaded[key] = dataset
        found.extend(image_rows_problems(cfg, key, dataset) or image_size_problems(cfg, key, dataset))
        if key == "data.train_data":
            found.extend(_training_rows_problems(cfg, dataset))
    return found


def _training_rows_problems(cfg, dataset) -> list[str]:
    """The rows left for training (after data.val_split_size holds some out) fill a step."""
    rows, held_out = len(dataset), ""
    if cfg.data.val_split_size:
        try:
            rows = len(split_validation(dataset, cfg.data.val_split_size, cfg.data.val_split_seed)[0])
        except DataError as error:
            return [str(error)]
        held_out = f" after data.val_split_size holds out {len(dataset) - rows}"
    if rows >= cfg.trainer.train_batch_size:
        return []
    return [f"trainer.train_batch_size: {cfg.trainer.train_batch_size} prompts per step, but data.train_data holds "
            f"{rows}{held_out}; lower trainer.train_batch_size or add prompts"]


def _hub_problems(name: str, key: str = "trainer.policy.model.path") -> list[str]:
    """A hub name must be in the local Hugging Face cache, or the hub must answer (a HEAD request, 5 s at most):
    otherwise the first model load, after Ray and the workers started, would fail on the network."""
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return []
    cache = constants.HF_HUB_CACHE
    fix = (f"download it where the hub is reachable and point {key} at the directory, or set HF_HOME to a cache "
           "that holds it")
    if constants.HF_HUB_OFFLINE:
        return [f"{key}: {name} is a hub name that is not in the local cache ({cache}) and HF_HUB_OFFLINE is set; "
                f"{fix}"]
    import urllib.error
    import urllib.request

    endpoint = constants.ENDPOINT
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=5)
    except urllib.error.HTTPError:
        return []  # the hub answered
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        return [f"{key}: {name} is a hub name that is not in the local cache ({cache}), and {endpoint} cannot be "
                f"reached ({reason}); {fix}"]
    return []


def _model_path_problems(key: str, path: str) -> list[str]:
    """A local Hugging Face model directory (with config.json), or a hub name that can be had."""
    if not looks_local(path):
        return _hub_problems(path, key)
    local = os.path.expanduser(path)
    if not os.path.isdir(local):
        return [f"{key}: {path} is not a directory; point it at a local Hugging Face model directory (config.json, "
                "weights, tokenizer) or at a hub name such as Qwen/Qwen2.5-0.5B-Instruct"]
    if not os.path.isfile(os.path.join(local, "config.json")):
        return [f"{key}: {path} holds no config.json; point it at a Hugging Face model directory"]
    return weight_problems(key, local)


def _model_problems(cfg) -> list[str]:
    """The policy's model, and a reference or critic model that names its own."""
    paths = {"trainer.policy.model.path": cfg.trainer.policy.model.path,
             "trainer.ref.model.path": cfg.trainer.ref.model.path,
             "trainer.critic.model.path": cfg.trainer.critic.model.path}
    return [problem for key, path in paths.items() if path and path not in BUILT_MODELS
            for problem in _model_path_problems(key, path)]


def _reward_model_problems(cfg) -> list[str]:
    """The models of trainer.reward that data.reward_fn lists: present, a one-label classifier, a judge template
    and pattern that parse."""
    found, reward = [], cfg.trainer.reward
    if not {"reward_model", "llm_judge"} & set(cfg.data.reward_fn):
        return found  # nothing to check, and the model stack (transformers) stays unimported until Ray is up
    from rl.core.rewards.judge import check_pattern, check_template
    from rl.core.rewards.reward_model import ClassifierReward

    if "reward_model" in cfg.data.reward_fn and reward.model.path is not None:
        found += _model_path_problems("trainer.reward.model.path", reward.model.path)
        if not found and looks_local(reward.model.path):
            try:
                ClassifierReward.check_path(os.path.expanduser(reward.model.path))
            except ValueError as error:
                found.append(str(error))
    judge = reward.judge
    if "llm_judge" in cfg.data.reward_fn and None not in (judge.model_path, judge.template, judge.pattern):
        found += _model_path_problems("trainer.reward.judge.model_path", judge.model_path)
        for check, value, key in ((check_template, judge.template, "trainer.reward.judge.template"),
                                  (check_pattern, judge.pattern, "trainer.reward.judge.pattern")):
            try:
                check(value, key)
            except ValueError as error:
                found.append(str(error))
    return found


def _resume_problems(cfg) -> list[str]:
    """An explicit checkpoint to resume must be complete and match its manifest (checked before anything starts;
    `latest` picks the newest intact one itself)."""
    from rl.trainer.state import checkpoint

    path = cfg.trainer.resume_mode
    if path in (None, "none", "latest") or not os.path.isdir(os.path.expanduser(path)):
        return []  # the config check names a missing directory
    path = os.path.expanduser(path)
    if not checkpoint.is_complete(path):
        return [f"trainer.resume_mode: {path} is not a complete checkpoint (no {checkpoint.MARKER} marker); point it "
                "at a global_step_N directory that has one, or use latest"]
    damaged = checkpoint.verify(path)
    if damaged:
        return [f"trainer.resume_mode: {path} is damaged: {'; '.join(damaged)}; resume from another checkpoint "
                "(latest picks the newest intact one)"]
    mismatch = checkpoint.strategy_mismatch(path, cfg.trainer.strategy)
    return [f"trainer.resume_mode: {mismatch}"] if mismatch else []


def _reward_problems(cfg) -> list[str]:
    """Every `data.reward_fn` entry is a registered reward (the tasks register theirs on import) or user code that
    imports and has a reward function's signature."""
    from rl.core.rewards.functions import load_reward_function
    from rl.tasks import rewards  # noqa: F401

    found = []
    for index, reference in enumerate(cfg.data.reward_fn):
        if reference in MODEL_REWARDS:
            continue  # trainer.reward's models: `_reward_model_problems`
        key = "data.reward_fn" if len(cfg.data.reward_fn) == 1 else f"data.reward_fn[{index}]"
        try:
            load_reward_function(reference, key)
        except ValueError as error:
            found.append(str(error))
    return found


def _sandbox_problems(cfg) -> list[str]:
    """A reward that runs model-written code (`rl.core.sandbox.runs_model_code`) needs the jail with every guarantee
    here, unless environment.sandbox.allow_weaker_isolation; with it, what is missing is said once."""
    from rl.core.rewards.functions import load_reward_function
    from rl.core.sandbox import WEAKER_ISOLATION_KEY, isolation
    from rl.tasks import rewards  # noqa: F401

    users = []
    for reference in cfg.data.reward_fn:
        try:
            if getattr(load_reward_function(reference), "runs_model_code", False):
                users.append(reference)
        except ValueError:
            continue  # named by _reward_problems
    found = isolation() if users else None
    if found is None or found.problem is None:
        return []
    if cfg.environment.sandbox.allow_weaker_isolation:
        print(f"warning: {WEAKER_ISOLATION_KEY}=true: {found.problem}; {found.weaker()}", flush=True)
        return []
    return [f"data.reward_fn: {', '.join(users)} runs the model's code in the jail, which this machine cannot give "
            f"every guarantee: {found.problem}. Fix that, or set {WEAKER_ISOLATION_KEY}=true, with which "
            f"{found.weaker()}"]


def _environment_problems(cfg) -> list[str]:
    """`environment.env_class` is a registered environment or user code that imports and subclasses Environment,
    and one instance builds with environment.env_options within environment.step_timeout_s (its `start` and `step`
    are the episodes' to call: their failures are named with the row and the turn)."""
    env = cfg.environment
    if env.env_class is None:
        return []
    from rl.core.environments import make_environment_factory
    from rl.tasks import environments  # noqa: F401
    from rl.trainer.multi_turn.env_calls import CallPool, describe_failure
    from rl.trainer.multi_turn.turns import environment_class_name

    try:
        make_env = make_environment_factory(env.env_class, "environment.env_class", env.env_options)
    except ValueError as error:
        return [str(error)]
    try:
        inspect.signature(getattr(make_env, "func", make_env)).bind(**env.env_options)
    except TypeError as error:
        if env.env_options:
            return [f"environment.env_options: {env.env_class} does not take {dict(env.env_options)}: {error}"]
        return [f"environment.env_options: {env.env_class} cannot be built without options: {error}; give them in "
                "environment.env_options"]
    except ValueError:
        pass  # no signature to read: building it tells
    [built] = CallPool(1, env.step_timeout_s).run([make_env])
    if not built.failed:
        return []
    problem, fix = describe_failure(built, "__init__", env.step_timeout_s)
    return [f"environment.env_class: {env.env_class}: {environment_class_name(make_env)}.__init__ (with "
            f"environment.env_options {dict(env.env_options)}) {problem}; {fix}".rstrip("; ")]


def _prompt_room_problems(cfg, loaded: dict) -> list[str]:
    """Multi-turn: every prompt, encoded as the trainer encodes it, leaves room for a response within an episode's
    context limit (`multi_turn.turns.context_limit`). Needs the model's tokenizer, so a model built at the start (the
    embedded one) or one that cannot be had here is left to the check at the first step."""
    path = cfg.trainer.policy.model.path
    if cfg.environment.env_class is None or not loaded or not model_at_hand(path):
        return []
    from rl.core.data.records import describe_row
    from rl.trainer.multi_turn.turns import context_limit, no_room_message
    from rl.trainer.rollout.prompt_encoding import render_ids

    try:
        from transformers import AutoTokenizer

        path = os.path.expanduser(path) if looks_local(path) else path
        tokenizer = AutoTokenizer.from_pretrained(path)
        limit = context_limit(cfg, path)
    except Exception:  # whatever keeps the tokenizer from loading here is reported where the trainer loads it
        return []
    gen = cfg.generator
    key = "generator.max_input_length" if gen.max_input_length else "generator.max_prompt_length"
    found = []
    for data_key, dataset in loaded.items():
        lengths = [(min(len(render_ids(tokenizer, record)), gen.max_prompt_length), record) for record in dataset]
        long = [(length, record) for length, record in lengths if length >= limit]
        if long:
            length, record = long[0]
            found.append(f"{key}: {no_room_message(describe_row(record), length, limit)} ({len(long)} of the "
                         f"{len(lengths)} prompts of {data_key} leave no room)")
    return found


def _prompt_length_problems(cfg, loaded: dict) -> list[str]:
    """Prompts longer than generator.max_prompt_length with data.truncation=error, and single-turn prompts that
    leave no room for a response within the model's positions (`prompt_encoding.prompt_problems`; the model's
    config.json is read first, and the tokenizer loaded only when a check needs the prompts encoded). A model built
    at the start (the embedded one) is checked when the trainer starts."""
    path = cfg.trainer.policy.model.path
    if not loaded or not model_at_hand(path):
        return []
    from rl.trainer.rollout.prompt_encoding import model_positions, needs_encoding, prompt_problems

    path = os.path.expanduser(path) if looks_local(path) else path
    try:
        positions = model_positions(path)
        if not needs_encoding(cfg, positions):
            return []
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception:  # whatever keeps the config or tokenizer from loading here is reported where the trainer loads it
        return []
    return prompt_problems(cfg, tokenizer, loaded, positions)


def _writable_problems(cfg) -> list[str]:
    """Checkpoint and export roots the run will write to: a directory, or creatable in a writable one."""
    found = []
    for key, path in (("trainer.ckpt_path", cfg.trainer.ckpt_path), ("trainer.export_path", cfg.trainer.export_path)):
        if path is None:
            continue  # inside the run directory
        existing = os.path.abspath(os.path.expanduser(path))
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            found.append(f"{key}: {existing} is a file, so {path} cannot be a directory; choose another path")
        elif not os.access(existing, os.W_OK | os.X_OK):
            found.append(f"{key}: {existing} is not writable, so {path} cannot be written; choose a writable path")
    return found


def _lacks_cuda(ray_address: str | None) -> bool:
    """No CUDA device here, and no cluster whose workers may have the GPUs this driver lacks."""
    return not (ray_address or torch.cuda.is_available())


def _kernel_problems(cfg, ray_address: str | None) -> list[str]:
    kernels = cfg.trainer.kernels
    if kernels in ("auto", "triton"):  # the Triton kernels read their launch record at their first launch
        from rl.kernels.launches import RECORD_ENV, record

        try:
            record()
        except ValueError as err:
            return [f"{RECORD_ENV}: {err}"]
    if not _lacks_cuda(ray_address) or kernels not in ("cuda", "triton"):
        return []
    if kernels == "triton" and os.environ.get("TRITON_INTERPRET") == "1":
        return []
    return [f"trainer.kernels: {kernels} needs a CUDA device and this machine has none; use trainer.kernels=auto "
            "(torch on CPU) or torch"]


def _exact_on_policy_problems(cfg) -> list[str]:
    """The machine's side of trainer.exact_on_policy (the config's: `rl.core.config.checks_exact`): CPU only, and a
    text model."""
    if not cfg.trainer.exact_on_policy:
        return []
    problems = []
    if torch.cuda.is_available():  # on a cluster's GPU workers, `batch_invariant.make_batch_invariant` refuses
        problems.append(f"trainer.exact_on_policy: is true on a machine with GPUs; {batch_invariant.CPU_ONLY}")
    path = cfg.trainer.policy.model.path
    if path and path not in BUILT_MODELS and os.path.isfile(os.path.join(os.path.expanduser(path), "config.json")):
        from transformers import AutoConfig

        from rl.core.model_class import is_vision_language

        if is_vision_language(AutoConfig.from_pretrained(os.path.expanduser(path))):
            problems.append(f"trainer.exact_on_policy: {path} is a vision-language model, whose vision tower the "
                            "batch-invariant arithmetic does not cover; set trainer.exact_on_policy=false")
    return problems


def _weight_sync_problems(cfg, ray_address: str | None) -> list[str]:
    if not _lacks_cuda(ray_address) or cfg.generator.weight_sync_backend != "nccl":
        return []
    return ["generator.weight_sync_backend: nccl needs a CUDA device and this machine has none; use gloo (the same "
            "broadcast from rank 0 over gloo), or leave it unset to pick one for the placement"]


def _engine_kwargs_problems(cfg) -> list[str]:
    """generator.engine_init_kwargs name arguments of this vLLM's engine (vLLM would refuse them in every engine
    actor, after Ray and the workers started)."""
    extra = cfg.generator.engine_init_kwargs
    if not extra:
        return []
    try:
        import vllm
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:  # the engines' own vLLM checks them
        return []
    known = [field.name for field in dataclasses.fields(EngineArgs)]
    return [f"generator.engine_init_kwargs.{name}: not an argument of vllm.LLM (vLLM {vllm.__version__}'s "
            f"EngineArgs){did_you_mean(name, known)}" for name in extra if name not in known]


def _on_this_machine(ray_address: str | None) -> bool:
    """The run's actors start on this machine: its own Ray, or a cluster whose head is one of its addresses."""
    if ray_address in (None, "local"):
        return True
    import socket

    host = ray_address.removeprefix("ray://").rsplit(":", 1)[0]
    try:
        return host in ("localhost", "127.0.0.1", socket.gethostbyname(socket.gethostname()))
    except OSError:
        return False


def _engine_memory_problems(cfg, ray_address: str | None) -> list[str]:
    from rl.trainer.preflight.engine_memory import engine_memory_problems
    from rl.trainer.preflight.memory_plan import model_config

    model = model_config(cfg.trainer.policy.model.path) if cfg.generator.backend == "vllm" else None
    on_cpu = not torch.cuda.is_available() and _on_this_machine(ray_address)
    return engine_memory_problems(cfg, model, on_cpu)


def _host_memory_problems(cfg, ray_address: str | None) -> list[str]:
    """On a machine without GPUs whose Ray is its own: the planner's estimate against the host's memory."""
    placement = cfg.trainer.placement
    if torch.cuda.is_available() or placement.gpu_memory_gb is not None or not _on_this_machine(ray_address):
        return []
    from rl.trainer.preflight.memory_plan import host_memory_problems

    return host_memory_problems(cfg)


def _placement_problems(cfg, ray_address: str | None) -> list[str]:
    from rl.trainer.workers.placement import fit_problems, machine_cores

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return fit_problems(cfg, gpus, machine_cores(), remote=ray_address is not None)


def preflight(cfg, ray_address: str | None = None) -> None:
    """Raises ConfigError listing every problem found (see the module docstring)."""
    loaded: dict = {}
    problems = [*_data_problems(cfg, loaded), *_model_problems(cfg), *_reward_problems(cfg),
                *_sandbox_problems(cfg), *_reward_model_problems(cfg), *_environment_problems(cfg),
                *_prompt_room_problems(cfg, loaded), *_prompt_length_problems(cfg, loaded), *agent_problems(cfg),
                *_resume_problems(cfg), *_writable_problems(cfg), *_kernel_problems(cfg, ray_address),
                *_exact_on_policy_problems(cfg),
                *_weight_sync_problems(cfg, ray_address), *_engine_kwargs_problems(cfg),
                *_engine_memory_problems(cfg, ray_address), *_host_memory_problems(cfg, ray_address),
                *_placement_problems(cfg, ray_address), *companion_model_problems(cfg), *memory_problems(cfg),
                *vision_language_problems(cfg)]
    if problems:
        raise ConfigError(problems)
