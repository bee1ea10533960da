"""The bad-input catalogue: one row per mistake, each run through the launcher in this process
(`tests.testing.launcher.launch_refused`: exit code 2 within seconds, Ray never started, no run directory, no
traceback), with the refusal naming the key, and for data the file and the row.

Config rows: every row of `tests.testing.bad_configs.BAD` (what `load_config` refuses) and the rows below that only
the machine can answer (`rl.trainer.preflight.checks`: files, model directories, checkpoints, kernels) or that come in a
`--config` file. Data rows: prompt files with one defect each, in jsonl and parquet."""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import save_file

import rl.backends.registry  # noqa: F401  (the strategies the config names)
from tests.testing.bad_configs import BAD, MEGATRON, Bad
from tests.testing.launcher import launch_refused

GOOD_ROWS = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(6)]


@dataclass(frozen=True)
class BadFile:
    """A `--config` file given beside the overrides."""

    content: bytes
    key: str
    fragments: tuple[str, ...]


# Placeholders: {tmp} a fresh directory, {data} a good 6-row prompt file, {model} a model directory whose config has
# 14 attention heads, 2 key/value heads and 6 layers, {file} a regular file, {notckpt} a directory that is no
# checkpoint, {tokmodel} a model directory with the embedded tokenizer and 64 positions (no weights: the checks read
# the config and the tokenizer), {vlmodel} a vision-language model's config, {sharded} {model}'s config with an
# index of two shards and one of them, {reshaped} {model}'s config with an embedding of another shape. Each prompt
# of {data}, "What is 0 + 1?", is 10 of its tokens.
ON_DATA = ["trainer.policy.model.path={tokmodel}", "data.train_data=['{data}']", "trainer.train_batch_size=4",
           "trainer.policy_mini_batch_size=4"]
MEGATRON_ON_4 = ["trainer.strategy=megatron", "trainer.policy.model.path={model}",
                 "trainer.placement.policy_num_gpus_per_node=4"]
MACHINE = {
    "model_dir_missing": Bad(["trainer.policy.model.path={tmp}/no-model"], "trainer.policy.model.path",
                             ("is not a directory",)),
    "model_without_config": Bad(["trainer.policy.model.path={tmp}"], "trainer.policy.model.path",
                                ("no config.json",)),
    "model_without_weights": Bad(["trainer.policy.model.path={tokmodel}"], "trainer.policy.model.path",
                                 ("holds config.json but no weights", "interrupted download")),
    "model_shard_missing": Bad(["trainer.policy.model.path={sharded}"], "trainer.policy.model.path",
                               ("lacks 1 of the 2 weight files", "model-00002-of-00002.safetensors")),
    "model_weights_of_another_shape": Bad(["trainer.policy.model.path={reshaped}"], "trainer.policy.model.path",
                                          ("model.embed_tokens.weight is [10, 8], config.json builds [64, 56]",
                                           "restore the config.json")),
    "vision_language_model_on_megatron": Bad(
        ["trainer.policy.model.path={vlmodel}", "trainer.strategy=megatron"], "trainer.strategy",
        ("is megatron", "is a vision-language model (Qwen2VLForConditionalGeneration)", "deepspeed, fsdp, fsdp2 take")),
    "vision_language_reference": Bad(["trainer.ref.model.path={vlmodel}"], "trainer.ref.model.path",
                                     ("is a vision-language model", "only the policy may be one")),
    "vision_language_partial_rollouts": Bad(
        ["trainer.policy.model.path={vlmodel}", "trainer.fully_async.enabled=true",
         "trainer.fully_async.partial_rollout_tokens=8", "trainer.placement.colocate_all=false"],
        "trainer.fully_async.partial_rollout_tokens", ("is 8", "does not carry images yet")),
    "frozen_vision_tower_of_a_text_model": Bad(["trainer.policy.model.freeze_vision_tower=true"],
                                               "trainer.policy.model.freeze_vision_tower",
                                               ("is true", "is a text model", "no vision_config")),
    "cuda_kernels_without_cuda": Bad(["trainer.kernels=cuda"], "trainer.kernels", ("needs a CUDA device",)),
    "engine_argument_unknown_to_vllm": Bad(
        ["generator.backend=vllm", "generator.engine_init_kwargs.enforce_eagr=false"],
        "generator.engine_init_kwargs.enforce_eagr", ("not an argument of vllm.LLM", "did you mean 'enforce_eager'?")),
    "val_split_leaves_too_few": Bad([*ON_DATA, "data.val_split_size=3"], "trainer.train_batch_size",
                                    ("data.train_data holds 3 after data.val_split_size holds out 3",)),
    "triton_kernels_without_cuda": Bad(["trainer.kernels=triton"], "trainer.kernels", ("needs a CUDA device",)),
    "nccl_weight_sync_without_cuda": Bad(["generator.weight_sync_backend=nccl", "trainer.placement.colocate_all=false"],
                                         "generator.weight_sync_backend", ("nccl needs a CUDA device", "use gloo")),
    "ckpt_under_a_file": Bad(["trainer.ckpt_path={file}/ckpt"], "trainer.ckpt_path", ("is a file",)),
    "export_under_a_file": Bad(["trainer.export_path={file}/exports"], "trainer.export_path", ("is a file",)),
    "unknown_reward": Bad(["data.reward_fn=gsm9k"], "data.reward_fn", ("Did you mean 'gsm8k'?",)),
    "resume_from_a_directory_that_is_no_checkpoint": Bad(["trainer.resume_mode={notckpt}"], "trainer.resume_mode",
                                                         ("not a complete checkpoint",)),
    "megatron_tp_not_dividing_heads": Bad(
        [*MEGATRON_ON_4, MEGATRON + "tensor_model_parallel_size=4"], MEGATRON + "tensor_model_parallel_size",
        ("must divide the model's 14 attention heads",)),
    "megatron_pp_not_dividing_layers": Bad(
        [*MEGATRON_ON_4, MEGATRON + "pipeline_model_parallel_size=4"], MEGATRON + "pipeline_model_parallel_size",
        ("must divide the model's 6 layers",)),
    "nccl_weight_sync_without_gpus": Bad(["trainer.placement.colocate_all=false", "generator.weight_sync_backend=nccl"],
                                         "generator.weight_sync_backend", ("needs GPUs",)),
    "several_nodes_without_a_cluster": Bad(["trainer.placement.policy_num_nodes=2"],
                                           "trainer.placement.policy_num_nodes", ("pass --ray_address",)),
    "more_engines_than_cores": Bad(["trainer.placement.colocate_all=false", "generator.num_inference_engines=64"],
                                   "generator.num_inference_engines", ("leave none of this machine's",)),
    "prompt_longer_than_max_prompt_length_with_truncation_error": Bad(
        [*ON_DATA, "data.truncation=error", "generator.max_prompt_length=8"], "data.truncation",
        ("train.jsonl line 1 has 10 tokens, more than generator.max_prompt_length=8", "6 of the 6 prompts")),
    "prompt_and_response_beyond_the_model_positions": Bad(
        [*ON_DATA, "generator.max_generate_length=60"], "generator.max_prompt_length",
        ("train.jsonl line 1 has 10 tokens; with generator.max_generate_length=60 it needs 70 positions",
         "max_position_embeddings=64", "generator.max_generate_length to 54")),
    "unknown_strategy_flag_with_a_model": Bad(["trainer.policy.model.path={model}"], "trainer.strategy",
                                              ("did you mean 'fsdp'?",), strategy="fsdp3"),
}
FILES = {
    "config_not_utf8": BadFile(b"trainer:\n  seed: \xff\xfe\n", "--config", ("not UTF-8",)),
    "config_duplicate_key": BadFile(b"trainer:\n  seed: 1\n  seed: 2\n", "--config", ("seed", "twice")),
    "config_invalid_yaml": BadFile(b"trainer: [seed: 1\n", "--config", ("not valid YAML",)),
    "config_top_level_list": BadFile(b"- trainer.seed=1\n", "--config", ("mapping",)),
    "config_unknown_key": BadFile(b"trainer:\n  sed: 1\n", "trainer.sed", ("did you mean 'trainer.seed'?",)),
    "config_wrong_type": BadFile(b"generator:\n  top_p: high\n", "generator.top_p", ("expected a number",)),
}


@dataclass(frozen=True)
class BadData:
    """A prompt file with one defect: its name, its rows (jsonl lines as written, or parquet columns), the keys
    that read it, and what the refusal must say beside the key and the file's name."""

    name: str
    content: bytes | list[str] | dict | None
    fragments: tuple[str, ...]
    overrides: tuple[str, ...] = ()
    key: str = "data.train_data"


def _lines(*rows) -> list[str]:
    return [row if isinstance(row, str) else json.dumps(row) for row in rows]


OK = GOOD_ROWS[0]


def _png(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("L", (width, height), 255).save(out, format="PNG")
    return out.getvalue()


PNG, HUGE_PNG = _png(28, 28), _png(4097, 4096)
DATA = {
    "jsonl_bad_json": BadData("a.jsonl", _lines(OK, '{"prompt": '), ("line 2", "not valid JSON")),
    "jsonl_array_line": BadData("a.jsonl", _lines(OK, "[1, 2]"), ("line 2", "expected a JSON object")),
    "jsonl_string_line": BadData("a.jsonl", _lines('"just text"'), ("line 1", "expected a JSON object")),
    "jsonl_no_prompt": BadData("a.jsonl", _lines(OK, OK, {"answer": "3"}), ("line 3", "'prompt'")),
    "jsonl_no_answer": BadData("a.jsonl", _lines({"prompt": "q"}), ("line 1", "'answer'")),
    "jsonl_null_answer": BadData("a.jsonl", _lines({"prompt": "q", "answer": None}), ("line 1", "is null")),
    "jsonl_empty_answer": BadData("a.jsonl", _lines({"prompt": "q", "answer": ""}), ("line 1", "empty string")),
    "jsonl_blank_answer": BadData("a.jsonl", _lines({"prompt": "q", "answer": "  "}), ("line 1", "empty string")),
    "jsonl_nan_answer": BadData("a.jsonl", _lines('{"prompt": "q", "answer": NaN}'), ("line 1", "finite")),
    "jsonl_infinite_answer": BadData("a.jsonl", _lines('{"prompt": "q", "answer": Infinity}'), ("line 1", "finite")),
    "jsonl_list_answer": BadData("a.jsonl", _lines({"prompt": "q", "answer": ["1"]}), ("line 1", "string or number")),
    "jsonl_dict_answer": BadData("a.jsonl", _lines({"prompt": "q", "answer": {"v": 1}}),
                                 ("line 1", "string or number")),
    "jsonl_empty_prompt": BadData("a.jsonl", _lines({"prompt": "", "answer": "1"}), ("line 1", "empty string")),
    "jsonl_numeric_prompt": BadData("a.jsonl", _lines({"prompt": 7, "answer": "1"}),
                                    ("line 1", "text or a non-empty list")),
    "jsonl_empty_chat": BadData("a.jsonl", _lines({"prompt": [], "answer": "1"}),
                                ("line 1", "text or a non-empty list")),
    "jsonl_chat_without_content": BadData("a.jsonl", _lines({"prompt": [{"role": "user"}], "answer": "1"}),
                                          ("line 1", "chat message 0")),
    "jsonl_chat_empty_content": BadData("a.jsonl", _lines({"prompt": [{"role": "user", "content": ""}],
                                                           "answer": "1"}), ("line 1", "has empty content")),
    "jsonl_chat_unknown_role": BadData("a.jsonl", _lines(OK, {"prompt": [{"role": "narrator", "content": "Once"}],
                                                              "answer": "1"}),
                                       ("line 2", "unknown role 'narrator'", "system, user, assistant, tool")),
    "jsonl_chat_role_not_text": BadData("a.jsonl", _lines({"prompt": [{"role": 1, "content": "hi"}], "answer": "1"}),
                                        ("line 1", "chat message 0")),
    "jsonl_index_not_integer": BadData("a.jsonl", _lines({"prompt": "q", "answer": "1", "index": "7"}),
                                       ("line 1", "'index' must be an integer")),
    "jsonl_source_not_text": BadData("a.jsonl", _lines({"prompt": "q", "answer": "1", "data_source": 3}),
                                     ("line 1", "'data_source' must be a string")),
    "jsonl_empty_file": BadData("a.jsonl", [], ("holds no rows",)),
    "jsonl_blank_lines_only": BadData("a.jsonl", ["", "   ", ""], ("holds no rows",)),
    "jsonl_not_utf8": BadData("a.jsonl", b'{"prompt": "\xff", "answer": "1"}\n', ("UTF-8",)),
    "jsonl_custom_prompt_key_absent": BadData("a.jsonl", _lines(*GOOD_ROWS), ("line 1", "'question'"),
                                              ("data.prompt_key=question",)),
    "jsonl_custom_answer_key_absent": BadData("a.jsonl", _lines(*GOOD_ROWS), ("line 1", "'solution'"),
                                              ("data.answer_key=solution",)),
    "jsonl_fewer_prompts_than_a_step": BadData("a.jsonl", _lines(*GOOD_ROWS), ("holds 6",),
                                               ("trainer.train_batch_size=8", "trainer.policy_mini_batch_size=8"),
                                               key="trainer.train_batch_size"),
    "jsonl_bad_validation_row": BadData("v.jsonl", _lines(OK, {"prompt": "q", "answer": None}), ("line 2", "null"),
                                        key="data.val_data"),
    "csv_extension": BadData("a.csv", _lines(OK), ("unsupported file extension '.csv'",)),
    "json_extension": BadData("a.json", _lines(OK), ("unsupported file extension '.json'",)),
    "no_extension": BadData("prompts", _lines(OK), ("unsupported file extension '(none)'",)),
    "missing_file": BadData("absent.jsonl", None, ("no such file",)),
    "directory_named_like_a_file": BadData("dir.jsonl", "directory", ("not a regular file",)),
    "parquet_corrupt": BadData("a.parquet", b"PAR1 this is not parquet", ("cannot read as parquet",)),
    "parquet_no_rows": BadData("a.parquet", {"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.string())},
                               ("holds no rows",)),
    "parquet_no_answer_column": BadData("a.parquet", {"prompt": ["q"]}, ("'answer'",)),
    "parquet_null_answer": BadData("a.parquet", {"prompt": ["q", "r"], "answer": ["1", None]}, ("row 1", "is null")),
    "parquet_nan_answer": BadData("a.parquet", {"prompt": ["q"], "answer": [math.nan]}, ("row 0", "finite")),
    "parquet_numeric_prompt": BadData("a.parquet", {"prompt": [1, 2], "answer": ["1", "2"]},
                                      ("row 0", "text or a non-empty list")),
    "parquet_images_for_a_text_run": BadData(
        "a.parquet", {"prompt": ["q", "<image> r"], "answer": ["1", "2"], "images": [[], [{"bytes": PNG}]]},
        ("row 1", "has 1 image(s)", "is a text model")),
    "parquet_image_unreadable": BadData(
        "a.parquet", {"prompt": ["q", "<image> r"], "answer": ["1", "2"], "images": [[], [{"bytes": b"\x89PNG"}]]},
        ("row 1: images[0]", "not a readable image")),
    "parquet_image_too_large": BadData(
        "a.parquet", {"prompt": ["<image> q"], "answer": ["1"], "images": [[{"bytes": HUGE_PNG}]]},
        ("row 0: images[0]", "4097 x 4096 pixels", "scale it down")),
    "parquet_image_aspect_ratio_over_200": BadData(  # the processor's own limit, found before Ray
        "a.parquet", {"prompt": [[{"role": "user", "content": "<image> q"}]] * 2, "answer": ["1", "2"],
                      "images": [[{"bytes": PNG}], [{"bytes": _png(4000, 14)}]]},
        ("row 1 image 0", "4000 x 14 pixels", "absolute aspect ratio must be smaller than 200", "crop or pad it"),
        overrides=("trainer.policy.model.path=embedded-vl",)),
    "jsonl_image_path_missing": BadData("a.jsonl", _lines({"prompt": "<image> q", "answer": "1",
                                                           "images": ["no-such.png"]}),
                                        ("line 1: images[0]", "cannot read the image file")),
    "parquet_image_marks_do_not_match": BadData(
        "a.parquet", {"prompt": [[{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                                               {"type": "text", "text": "q"}]}]],
                      "answer": ["1"], "images": [[{"bytes": PNG}]]},
        ("row 0", "marks 2 image(s)", "the row has 1")),
    "parquet_chat_empty_content": BadData(
        "a.parquet", {"prompt": [[{"role": "user", "content": "hi"}], [{"role": "user", "content": ""}]],
                      "answer": ["1", "2"]}, ("row 1", "has empty content")),
    "parquet_empty_prompt": BadData("a.parquet", {"prompt": ["q", ""], "answer": ["1", "2"]},
                                    ("row 1", "empty string")),
}


def test_the_catalogue_holds_at_least_100_configs_and_30_data_files():
    assert len(BAD) + len(MACHINE) + len(FILES) >= 100
    assert len(DATA) >= 30


@pytest.fixture(scope="module")
def tokenizer_model(tmp_path_factory) -> str:
    from transformers import LlamaConfig

    from rl.tasks.embedded import build_tokenizer

    path = tmp_path_factory.mktemp("tokmodel")
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(path)
    LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64).save_pretrained(path)
    return str(path)


@pytest.fixture
def places(tmp_path, tokenizer_model) -> dict[str, str]:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in GOOD_ROWS))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 64, "hidden_size": 56,
        "intermediate_size": 64, "num_hidden_layers": 6, "num_attention_heads": 14, "num_key_value_heads": 2,
        "max_position_embeddings": 64}))
    (tmp_path / "notckpt").mkdir()
    vlmodel = tmp_path / "vlmodel"
    vlmodel.mkdir()
    (vlmodel / "config.json").write_text(json.dumps({
        "model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"],
        "text_config": {"hidden_size": 64}, "vision_config": {"depth": 2}}))
    sharded, reshaped = tmp_path / "sharded", tmp_path / "reshaped"
    for folder in (sharded, reshaped):
        folder.mkdir()
        shutil.copy(model / "config.json", folder / "config.json")
    shards = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.embed_tokens.weight": shards[0], "lm_head.weight": shards[1]}}))
    save_file({"model.embed_tokens.weight": torch.zeros(64, 56)}, str(sharded / shards[0]))
    save_file({"model.embed_tokens.weight": torch.zeros(10, 8)}, str(reshaped / "model.safetensors"))
    return {"tmp": str(tmp_path / "scratch"), "data": str(data), "model": str(model), "file": str(data),
            "notckpt": str(tmp_path / "notckpt"), "tokmodel": tokenizer_model, "vlmodel": str(vlmodel),
            "sharded": str(sharded), "reshaped": str(reshaped)}


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the kernel rows on a GPU machine too


def _assert_named(message: str, key: str, fragments) -> None:
    lines = [line.strip().removeprefix("- ") for line in message.splitlines()]
    lines = [line for line in lines if line.startswith(key + ":")]
    assert lines, f"no line names {key}:\n{message}"
    for fragment in fragments:
        assert any(fragment in line for line in lines), f"{fragment!r} not in {lines}"


def _placed(override: str, places: dict[str, str]) -> str:
    for name, value in places.items():
        override = override.replace("{" + name + "}", value)
    return override


@pytest.mark.parametrize("case", [*BAD, *MACHINE])
def test_bad_config_is_refused_before_anything_starts(case, places, tmp_path, capsys):
    row = BAD.get(case) or MACHINE[case]
    os.makedirs(places["tmp"], exist_ok=True)
    overrides = [_placed(override, places) for override in row.overrides]
    flags = (f"--strategy={row.strategy}",) if row.strategy else ()
    message = launch_refused(str(tmp_path / "run"), overrides, capsys, flags)
    _assert_named(message, row.key, row.fragments)


def test_a_kernel_launch_record_that_does_not_load_is_refused_before_anything_starts(tmp_path, capsys,
                                                                                    monkeypatch):
    """$RL_KERNEL_LAUNCHES naming a record with a launch the tests do not cover (rl/kernels/launches.py)."""
    record = tmp_path / "launches.json"
    record.write_text(json.dumps({"NVIDIA H100 80GB HBM3": {"kernels": {"pack": {"64": {"BLOCK_T": 3}}}}}))
    monkeypatch.setenv("RL_KERNEL_LAUNCHES", str(record))
    message = launch_refused(str(tmp_path / "run"), [], capsys)
    _assert_named(message, "RL_KERNEL_LAUNCHES", (f"{record}: 'NVIDIA H100 80GB HBM3' pack at 64",
                                                  "is not one of the launches the tests check"))


@pytest.mark.parametrize("case", FILES)
def test_bad_config_file_is_refused_before_anything_starts(case, tmp_path, capsys):
    row = FILES[case]
    path = tmp_path / "job.yaml"
    path.write_bytes(row.content)
    message = launch_refused(str(tmp_path / "run"), [], capsys, (f"--config={path}",))
    if row.key == "--config":
        assert str(path) in message, message
    else:
        _assert_named(message, row.key, ())
    for fragment in row.fragments:
        assert fragment in message, message


def _write(path, content) -> None:
    if content is None:
        return
    if content == "directory":
        os.makedirs(path)
    elif isinstance(content, bytes):
        with open(path, "wb") as f:
            f.write(content)
    elif isinstance(content, dict):
        pq.write_table(pa.table(content), path)
    else:
        with open(path, "w") as f:
            f.write("".join(line + "\n" for line in content))


@pytest.mark.parametrize("case", DATA)
def test_bad_data_file_is_refused_naming_file_and_row(case, places, tmp_path, capsys):
    row = DATA[case]
    path = str(tmp_path / row.name)
    _write(path, row.content)
    given = "data.val_data" if row.key == "data.val_data" else "data.train_data"
    overrides = [f"{given}=['{path}']", *row.overrides]
    if given == "data.val_data":
        overrides.append(f"data.train_data=['{places['data']}']")
    message = launch_refused(str(tmp_path / "run"), overrides, capsys)
    _assert_named(message, row.key, row.fragments)
    if row.key != "trainer.train_batch_size":
        assert any(row.name in line for line in message.splitlines() if row.key + ":" in line), message
