"""NeMo RL keys of the run around the algorithm whose translation depends on other keys: LoRA, micro-batch
packing, engine placement, checkpoints, loggers, data and the math environment, reward shaping."""

from __future__ import annotations

from typing import Any

from rl.core.config.dialects.apply import take_all
from rl.core.config.dialects.layer import MISSING, Layer
from rl.core.config.dialects.nemo import DTENSOR, GEN, MC, VLLM, P
from rl.core.config.dialects.nemo_rules import NEMO, emit, inert, nemo_or_ours, number

LORA = "trainer.policy.model.lora."


def lora(layer: Layer) -> None:
    """NeMo RL's LoRA blocks (`dtensor_cfg.lora_cfg`, `megatron_cfg.peft`) as trainer.policy.model.lora."""
    for block in (*(prefix + "lora_cfg" for prefix in DTENSOR), MC + "peft"):
        keys = take_all(layer, block)
        if not keys:
            continue
        enabled = keys.pop(block + ".enabled", MISSING)
        if enabled is not True:
            inert(layer, {**keys, block + ".enabled": enabled}, f"{block} is not enabled")
            continue
        _lora_block(layer, block, keys)


def _lora_block(layer: Layer, block: str, keys: dict[str, Any]) -> None:
    get = {key.removeprefix(block + "."): value for key, value in keys.items()}
    anchor = next(iter(keys), block + ".enabled")
    targets, match_all = get.pop("target_modules", []), get.pop("match_all_linear", False)
    modules = ["all-linear"] if match_all or not targets else list(targets)
    layer.emit(LORA + "target_modules", modules, at=anchor)
    for name, ours in (("dim", "rank"), ("alpha", "alpha"), ("dropout", "dropout")):
        if name in get:
            emit(layer, f"{block}.{name}", LORA + ours, get.pop(name), at=anchor)
    excluded = get.pop("exclude_modules", None)
    layer.emit(LORA + "exclude_modules", list(excluded) if excluded else None, at=anchor)
    layer.alias(f"{block}.target_modules/match_all_linear/exclude_modules", LORA + "target_modules", NEMO)
    dropout = layer.current(LORA + "dropout")
    for name, value in get.items():
        key = f"{block}.{name}"
        if name == "dropout_position" and (value == "pre" or not dropout):
            layer.inert(key, "dropout on the adapter's input, as here" if value == "pre" else "no dropout")
        elif name in ("lora_A_init", "lora_A_init_method"):
            init = value if value in ("kaiming", "gaussian") else "kaiming"
            emit(
                layer,
                key,
                LORA + "init_method",
                init,
                at=anchor,
                note=""
                if init == value
                else f"A starts from {init} here ({value} in NeMo RL); B starts at zero in "
                "both, so training starts from the base model either way",
            )
        elif name == "lora_B_init_method" and value == "zero":
            layer.inert(key, "B starts at zero, as here")
        elif name in ("use_triton", "a2a_experimental"):
            layer.inert(key, "changes speed only")
        elif name == "lora_dtype" and value in (None, "None"):
            layer.inert(key, "adapters in the training precision, as here")
        else:
            layer.refuse(key, f"is {value!r}: no counterpart in trainer.policy.model.lora; remove it")


def packing(layer: Layer) -> None:
    """`sequence_packing` is our packing with its token budget; `dynamic_batching` (padded micro-batches of a token
    budget) is packed here with the same budget; both off is our padded micro-batches."""
    blocks = {name: take_all(layer, P + name) for name in ("sequence_packing", "dynamic_batching")}
    on = {name: keys.pop(P + f"{name}.enabled", MISSING) for name, keys in blocks.items()}
    if on["sequence_packing"] is True and on["dynamic_batching"] is True:
        layer.refuse(
            P + "dynamic_batching.enabled",
            "cannot be true with sequence_packing.enabled (NeMo RL refuses it too); keep sequence_packing",
        )
        return
    chosen = next((name for name in blocks if on[name] is True), None)
    for name, keys in blocks.items():
        if name != chosen:
            inert(layer, keys, f"{P}{name} is not enabled")
    if chosen is None:
        if on["sequence_packing"] is False:
            emit(layer, P + "sequence_packing.enabled", "trainer.use_sample_packing", False)
        if on["dynamic_batching"] is False:
            layer.inert(P + "dynamic_batching.enabled", "off")
        return
    block, keys = P + chosen, blocks[chosen]
    if chosen == "sequence_packing" and on["dynamic_batching"] is False:
        layer.inert(P + "dynamic_batching.enabled", "off")
    note = (
        ""
        if chosen == "sequence_packing"
        else (
            "sequences are packed into micro-batches of that token budget "
            "here (NeMo RL pads them): the same tokens per micro-batch"
        )
    )
    emit(layer, block + ".enabled", "trainer.use_sample_packing", True, note=note)
    train = keys.pop(block + ".train_mb_tokens", MISSING)
    if number(train):
        emit(layer, block + ".train_mb_tokens", "trainer.max_tokens_per_micro_batch", int(train))
    logprob = keys.pop(block + ".logprob_mb_tokens", MISSING)
    if logprob is not MISSING and logprob != train:
        layer.differs(
            block + ".logprob_mb_tokens",
            NEMO,
            f"forward-only passes use the training budget ({train}) here, not {logprob}",
        )
    elif logprob is not MISSING:
        layer.inert(block + ".logprob_mb_tokens", "the same budget as training, as here")
    inert(layer, keys, "how micro-batches are filled: the same numbers up to summation order")


def colocation(layer: Layer) -> None:
    """`colocated.resources` gives the engines devices of their own when `colocated.enabled` is false: as many
    engines as those devices hold at the engines' tensor-parallel size."""
    block = GEN + "colocated.resources"
    keys = take_all(layer, block)
    if not keys:
        return
    colocated = nemo_or_ours(layer, GEN + "colocated.enabled", "trainer.placement.colocate_all")
    if colocated is not False:
        inert(layer, keys, "used only with colocated.enabled=false")
        return
    gpus, nodes = keys.get(block + ".gpus_per_node"), keys.get(block + ".num_nodes") or 1
    tp = nemo_or_ours(layer, VLLM + "tensor_parallel_size", "generator.inference_engine_tensor_parallel_size")
    if not (number(gpus) and number(nodes) and number(tp)) or (gpus * nodes) % tp:
        layer.refuse(
            block + ".gpus_per_node",
            f"{gpus!r} devices per node on {nodes!r} nodes must be a multiple of "
            f"the engines' tensor-parallel size {tp!r}; or set "
            "generator.num_inference_engines",
        )
        return
    emit(layer, block + ".gpus_per_node", "generator.num_inference_engines", int(gpus * nodes // tp))
    if block + ".num_nodes" in keys:
        layer.inert(block + ".num_nodes", "counted in generator.num_inference_engines")


def metric_key(name: str) -> str | None:
    """NeMo RL's checkpoint metric (`val:accuracy`, `train:loss`) as a metrics.jsonl key here (validation metrics
    carry a `val_` prefix, training ones none); None when it is neither kind."""
    kind, _, metric = name.partition(":")
    if not metric or kind not in ("val", "train"):
        return None
    return f"val_{metric}" if kind == "val" else metric


def checkpointing(layer: Layer) -> None:
    enabled, keep = layer.take("checkpointing.enabled"), layer.take("checkpointing.keep_top_k")
    consolidated = layer.take("checkpointing.save_consolidated")
    if enabled is False:
        emit(layer, "checkpointing.enabled", "trainer.ckpt_interval", 0)
        rest = take_all(layer, "checkpointing")
        inert(
            layer,
            {**rest, "checkpointing.keep_top_k": keep, "checkpointing.save_consolidated": consolidated},
            "checkpointing is off",
        )
        return
    if enabled is True:
        layer.inert("checkpointing.enabled", "checkpoints every checkpointing.save_period steps")
    metric, higher = layer.take("checkpointing.metric_name"), layer.take("checkpointing.higher_is_better")
    if number(keep):
        emit(layer, "checkpointing.keep_top_k", "trainer.max_ckpts_to_keep", int(keep))
        if isinstance(metric, str):
            ours = metric_key(metric)
            if ours is None:
                layer.refuse("checkpointing.metric_name", f"got {metric!r}; NeMo RL names a metric 'val:<name>' or "
                             "'train:<name>' (e.g. val:accuracy), or null for the newest checkpoints")
            else:
                emit(layer, "checkpointing.metric_name", "trainer.ckpt_keep_metric", ours,
                     note=f"ranked by metrics.jsonl's {ours} at each checkpoint's step")
        if isinstance(higher, bool):
            emit(layer, "checkpointing.higher_is_better", "trainer.ckpt_keep_higher_is_better", higher)
    else:
        inert(layer, {"checkpointing.keep_top_k": keep, "checkpointing.metric_name": metric,
                      "checkpointing.higher_is_better": higher}, "keep every checkpoint, as here")
    if consolidated is True:
        period = nemo_or_ours(layer, "checkpointing.save_period", "trainer.ckpt_interval")
        emit(layer, "checkpointing.save_consolidated", "trainer.hf_save_interval", period)
    elif consolidated is not MISSING:
        layer.inert("checkpointing.save_consolidated", "off")


def loggers(layer: Layer) -> None:
    keys = take_all(layer, "logger")
    if not keys:
        return
    enabled = {
        name: keys.pop(f"logger.{name}_enabled", MISSING) for name in ("wandb", "tensorboard", "mlflow", "swanlab")
    }
    for name in ("mlflow", "swanlab"):
        if enabled[name] is True:
            layer.refuse(
                f"logger.{name}_enabled",
                f"asks for {name}, which is not available here; trainer.logger takes console, tensorboard and wandb",
            )
    if enabled["wandb"] is not MISSING or enabled["tensorboard"] is not MISSING:
        sinks = ["console", *(name for name in ("tensorboard", "wandb") if enabled[name] is True)]
        at = next(f"logger.{name}_enabled" for name in ("wandb", "tensorboard") if enabled[name] is not MISSING)
        emit(layer, "logger.wandb_enabled/tensorboard_enabled", "trainer.logger", sinks, at=at)
    for name in ("mlflow", "swanlab"):
        if enabled[name] is False:
            layer.inert(f"logger.{name}_enabled", "off")
    for field, ours in (("project", "trainer.project_name"), ("name", "trainer.run_name")):
        value = keys.pop(f"logger.wandb.{field}", MISSING)
        if value is not MISSING and enabled["wandb"] is True:
            emit(layer, f"logger.wandb.{field}", ours, value)
        elif value is not MISSING:
            layer.inert(f"logger.wandb.{field}", "used only with wandb_enabled")
    inert(layer, keys, "logging details of NeMo RL: metrics go to trainer.logger and the run directory here")


def data(layer: Layer) -> None:
    """NeMo RL's datasets: local files (`data_path`) are our data.train_data / val_data, their input and output
    keys our prompt_key / answer_key, their prompt files our prompt templates (`_prompt_files`); hub datasets by
    name and a validation split carved from the training data are not available."""
    keys = {
        key: layer.take(key)
        for key in [
            *layer.names("data.train"),
            *layer.names("data.validation"),
            *layer.names("data.default"),
            *(
                f"data.{name}"
                for name in (
                    "dataset_name",
                    "prompt_file",
                    "system_prompt_file",
                    "shuffle",
                    "num_workers",
                    "use_multiple_dataloader",
                )
            ),
        ]
    }
    keys = {key: value for key, value in keys.items() if value is not MISSING}
    _prompt_files(layer, keys)
    _columns(layer, keys)
    _validation_split(layer, keys)
    for key, value in keys.items():
        if key.rsplit(".", 1)[-1] not in (*PROMPT_FILES, *COLUMNS, *SPLIT):
            _data_key(layer, key, value, keys)


PROMPT_FILES = {"prompt_file": "data.prompt_template_file", "system_prompt_file": "data.system_prompt_file"}
COLUMNS = {"input_key": ("data.prompt_key", "input"), "output_key": ("data.answer_key", "output")}
"""NeMo RL's ResponseDataset (the class that reads `data_path`): its columns, our keys and its defaults."""
SPLIT = ("split_validation_size", "seed")


def _given(keys: dict[str, Any], split: str, name: str) -> str | None:
    """The key that sets a dataset's `name`: its own, else data.default's, else the older top-level one (NeMo RL's
    update_single_dataset_config fills a dataset's missing keys from data.default)."""
    return next((key for key in (f"data.{split}.{name}", f"data.default.{name}", f"data.{name}") if key in keys),
                None)


def _reading_files(keys: dict[str, Any]) -> list[str]:
    return [split for split in ("train", "validation") if f"data.{split}.data_path" in keys]


def _columns(layer: Layer, keys: dict[str, Any]) -> None:
    """`input_key` / `output_key` as data.prompt_key / answer_key, with ResponseDataset's defaults (`input`,
    `output`) where a dataset that reads files names none; a file whose rows are `messages` is read as such either
    way. One pair of columns serves every file here, so training and validation columns that differ are refused."""
    splits = _reading_files(keys)
    for name, (ours, default) in COLUMNS.items():
        given = [key for key in keys if key.rsplit(".", 1)[-1] == name]
        if not splits:
            inert(layer, {key: keys[key] for key in given}, "no dataset of data_path is read")
            continue
        used = {split: _given(keys, split, name) for split in splits}
        values = {split: keys[key] if key else default for split, key in used.items()}
        if len(set(values.values())) > 1:
            layer.refuse(used["validation"] or f"data.validation.{name}",
                         f"gives the validation data column {values['validation']!r} and the training data "
                         f"{values['train']!r}; one column serves every file here ({ours}): give both the same")
            continue
        chosen = [key for key in given if key in used.values()]
        for key in chosen:
            emit(layer, key, ours, values[splits[0]])
        if not chosen and not layer.has(ours):
            at = f"data.{splits[0]}.data_path"
            emit(layer, at, ours, default, note=f"ResponseDataset reads the {default!r} column when {name} is not "
                                               "given; so does this run")
        inert(layer, {key: keys[key] for key in given if key not in chosen},
              f"{name} of data.train / data.validation is used")


def _validation_split(layer: Layer, keys: dict[str, Any]) -> None:
    """The training dataset's `split_validation_size` / `seed` as data.val_split_size / val_split_seed: the same
    rows held out (Hugging Face's train_test_split), evaluated with the validation files as NeMo RL merges them."""
    size_key, seed_key = _given(keys, "train", SPLIT[0]), _given(keys, "train", SPLIT[1])
    size = keys[size_key] if size_key else 0
    if size_key and size:
        emit(layer, size_key, "data.val_split_size", size)
        if seed_key:
            emit(layer, seed_key, "data.val_split_seed", keys[seed_key])
        else:
            layer.emit("data.val_split_seed", 42, at=size_key)  # ResponseDataset's default seed
    for key in keys:
        name = key.rsplit(".", 1)[-1]
        if name not in SPLIT or (size and key in (size_key, seed_key)):
            continue
        if key.startswith("data.validation.") and name == SPLIT[0] and keys[key]:
            layer.refuse(key, f"is {keys[key]}: NeMo RL would evaluate the rest of a split validation file; here "
                              "data.validation's rows are evaluated whole: set it to 0")
        else:
            layer.inert(key, "no validation split is carved from the training data")


def _prompt_files(layer: Layer, keys: dict[str, Any]) -> None:
    """`prompt_file` / `system_prompt_file` as data.prompt_template_file / data.system_prompt_file: the same files
    with the same meaning (NeMo RL's math processor: a system message, then the template with the problem in its
    `{}`), read, as NeMo RL reads them, from the working directory. NeMo RL reads each dataset with its own files (a
    dataset's key, even null, over `data.default`'s, over the older top-level `data.prompt_file`); one pair serves
    every prompt here, so training and validation files that differ are refused."""
    splits = ("train", "validation") if any(key.startswith("data.validation.") for key in keys) else ("train",)
    for name, ours in PROMPT_FILES.items():
        given = [key for key in keys if key.rsplit(".", 1)[-1] == name]
        if not given:
            continue
        used = {split: next((key for key in (f"data.{split}.{name}", f"data.default.{name}", f"data.{name}")
                             if key in keys), None) for split in splits}
        values = {split: keys[key] if key else None for split, key in used.items()}
        if len(splits) == 2 and values["train"] != values["validation"]:
            at = used["validation"] if (used["validation"] or "").startswith("data.validation.") else used["train"]
            layer.refuse(at, f"gives the validation data {values['validation']!r} and the training data "
                             f"{values['train']!r}; one file serves every prompt here ({ours}): give both the same")
            continue
        chosen = [key for key in given if key in used.values()]
        for key in chosen:
            emit(layer, key, ours, values["train"])
        inert(layer, {key: keys[key] for key in given if key not in chosen},
              f"{name} of data.train / data.validation is used")


def _data_key(layer: Layer, key: str, value: Any, keys: dict[str, Any]) -> None:
    name = key.rsplit(".", 1)[-1]
    split = key.split(".")[1] if key.count(".") >= 2 else ""
    files = {"train": "data.train_data", "validation": "data.val_data"}
    if key == "data.validation" and value is None:
        emit(layer, key, "data.val_data", [])
    elif name == "data_path" and split in files:
        emit(layer, key, files[split], value if isinstance(value, list) else [value])
    elif name == "dataset_name":
        if any(other.endswith(".data_path") for other in keys) or value in ("ResponseDataset", None):
            layer.inert(key, "the files of data_path are read, as NeMo RL's ResponseDataset reads them")
        else:
            layer.refuse(
                key,
                f"is {value!r}, a dataset NeMo RL downloads by name: not available here; prepare it as "
                "parquet or jsonl and give data.train.data_path (or data.train_data)",
            )
    elif name == "env_name":
        _environment(layer, key, value)
    elif name == "processor":
        layer.inert(key, "the prompt column is used as it is, with the model's chat template")
    elif name == "shuffle" and value is True:
        layer.inert(key, "prompts are shuffled with trainer.seed each epoch, as here")
    elif name == "num_workers" or (name == "use_multiple_dataloader" and value is False):
        layer.inert(key, "changes speed only")
    else:
        layer.refuse(key, f"is {value!r}: no counterpart in data.* here; remove it")


def _environment(layer: Layer, key: str, name: Any) -> None:
    if name == "math":
        layer.emit("data.reward_fn", ["gsm8k_flexible"], at=key)
        layer.alias(key, "data.reward_fn=gsm8k_flexible", NEMO)
        layer.differs(
            key,
            NEMO,
            "NeMo RL's math environment checks the answer with math-verify (symbolic "
            "equivalence); gsm8k_flexible here compares the final number (\\boxed{N}, `#### N`, "
            "an answer phrase or the last number) with the answer as a value",
        )
    else:
        layer.refuse(
            key,
            f"is {name!r}, a NeMo RL environment that is not built in here; give a reward "
            "(data.reward_fn) or an environment class (environment.env_class=package.module:Class)",
        )


def environments(layer: Layer) -> None:
    for key in layer.names("env"):
        value = layer.take(key)
        if key == "env.math.num_workers":
            emit(layer, key, "data.reward_num_workers", value)
        elif key.startswith("env.math."):
            layer.inert(key, "the math environment's checker: gsm8k_flexible here")
        else:
            layer.refuse(key, f"configures NeMo RL's {key.split('.')[1]} environment, which is not built in here")


def reward_shaping(layer: Layer) -> None:
    """DAPO's overlong penalty (`grpo.reward_shaping`) is trainer.algorithm.overlong_buffer; reward scaling is
    accepted when it maps the rewards to themselves."""
    shaping = take_all(layer, "grpo.reward_shaping")
    if shaping.get("grpo.reward_shaping.enabled") is True:
        shaping.pop("grpo.reward_shaping.enabled")
        layer.alias("grpo.reward_shaping.enabled", "trainer.algorithm.overlong_buffer", NEMO)
        for name, ours in (("overlong_buffer_length", "len"), ("overlong_buffer_penalty", "penalty_factor")):
            key = f"grpo.reward_shaping.{name}"
            if key in shaping:
                emit(layer, key, f"trainer.algorithm.overlong_buffer.{ours}", shaping.pop(key))
        length = shaping.pop("grpo.reward_shaping.max_response_length", MISSING)
        if length is not MISSING:
            layer.later("grpo.reward_shaping.max_response_length", _equals_generate_length(length))
            layer.inert("grpo.reward_shaping.max_response_length", "generator.max_generate_length (checked)")
        coefficient = shaping.pop("grpo.reward_shaping.stop_properly_penalty_coef", None)
        if coefficient is not None:
            layer.refuse(
                "grpo.reward_shaping.stop_properly_penalty_coef",
                "a penalty for responses that do not stop properly is not available here",
            )
    inert(layer, shaping, "grpo.reward_shaping is not enabled")
    scaling = take_all(layer, "grpo.reward_scaling")
    if scaling.get("grpo.reward_scaling.enabled") is True:
        get = {key.rsplit(".", 1)[-1]: value for key, value in scaling.items()}
        identity = (get.get("source_min", 0.0), get.get("source_max", 1.0)) == (
            get.get("target_min", 0.0),
            get.get("target_max", 1.0),
        )
        if not identity:
            layer.refuse(
                "grpo.reward_scaling.enabled",
                "a linear map of the rewards is not available here; use data.reward_weights to scale them",
            )
            return
    inert(layer, scaling, "rewards are not rescaled (off, or the identity map)")


def _equals_generate_length(length: Any):
    def check(cfg) -> str | None:
        have = cfg.generator.max_generate_length
        return (
            None
            if have == length
            else (
                f"is {length!r}; the overlong penalty counts from "
                f"generator.max_generate_length ({have}) here; make them equal"
            )
        )

    return check


def sampling(layer: Layer) -> None:
    """DAPO's dynamic sampling, the tokenizer and evaluation's top-p/top-k, which follow the training settings."""
    dynamic = layer.take("grpo.use_dynamic_sampling")
    if dynamic is True:
        emit(layer, "grpo.use_dynamic_sampling", "trainer.algorithm.dynamic_sampling.type", "filter")
    elif dynamic is not MISSING:
        layer.inert("grpo.use_dynamic_sampling", "off")
    for key, ours in (
        (P + "tokenizer.name", "trainer.policy.model.path"),
        (GEN + "val_top_p", "generator.top_p"),
        (GEN + "val_top_k", "generator.top_k"),
    ):
        value = layer.take(key)
        if value is MISSING:
            continue
        expected = -1 if key.endswith("top_k") and value is None else value
        layer.later(key, _equals(key, ours, expected))
        layer.inert(key, f"equal to {ours} (checked)")


def _equals(key: str, ours: str, value: Any):
    def check(cfg) -> str | None:
        from rl.core.config.defaults import get

        have = get(cfg, ours)
        if have == value:
            return None
        return f"is {value!r}, but {ours} is {have!r} and is used for it here; make them equal"

    return check


RULES = (lora, packing, colocation, checkpointing, loggers, data, environments, reward_shaping, sampling)
