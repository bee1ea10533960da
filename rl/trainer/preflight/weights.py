"""A local model directory's weights, checked before anything starts: the files are there (every shard an index
names), and each tensor's shape in a safetensors header is the one config.json builds. An interrupted download or a
config-only copy otherwise passes preflight and dies in the workers with transformers' raw OSError; a config edited
apart from its weights dies in the middle of loading with a size mismatch."""

from __future__ import annotations

import json
import os
import struct

INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SINGLE_FILES = ("model.safetensors", "pytorch_model.bin")
SHOWN = 3


def weight_file_problems(key: str, directory: str) -> list[str]:
    """The directory holds a single weights file, or an index whose shards are all present."""
    names = set(os.listdir(directory))
    for index in INDEXES:
        if index not in names:
            continue
        try:
            with open(os.path.join(directory, index), encoding="utf-8") as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as error:
            return [f"{key}: {directory}/{index} is not a readable weight index ({type(error).__name__}: {error}); "
                    "download the model again"]
        missing = [shard for shard in shards if shard not in names]
        if missing:
            return [f"{key}: {directory} lacks {len(missing)} of the {len(shards)} weight files its {index} names "
                    f"({', '.join(missing[:SHOWN])}{', ...' if len(missing) > SHOWN else ''}); the download is "
                    "incomplete: fetch the missing files"]
        return []
    if not names.intersection(SINGLE_FILES):
        return [f"{key}: {directory} holds config.json but no weights (no {', '.join(SINGLE_FILES + INDEXES)}); an "
                "interrupted download or a copy of the config alone: point it at a complete model directory"]
    return []


def safetensors_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape from a safetensors file's header (its first 8 bytes give the JSON header's length)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return {name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}


def expected_shapes(directory: str) -> dict[str, tuple[int, ...]]:
    """The shape of each parameter and buffer of the model config.json builds, on the meta device (no memory)."""
    import torch
    from transformers import AutoConfig

    from rl.core.model_class import generative_class

    config = AutoConfig.from_pretrained(directory)
    with torch.device("meta"):
        model = generative_class(config).from_config(config)
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def shape_problems(key: str, directory: str) -> list[str]:
    """Tensors whose shape in the safetensors files differs from the one config.json builds (names present in
    both: a checkpoint may spell some names the way an older transformers did)."""
    files = [name for name in sorted(os.listdir(directory)) if name.endswith(".safetensors")]
    if not files:
        return []
    stored: dict[str, tuple[int, ...]] = {}
    try:
        for name in files:
            stored.update(safetensors_shapes(os.path.join(directory, name)))
    except (OSError, ValueError, struct.error, KeyError) as error:
        return [f"{key}: {directory}: a safetensors file's header does not read ({type(error).__name__}: {error}); "
                "the file is damaged or incomplete: download it again"]
    try:
        wanted = expected_shapes(directory)
    except Exception:  # a config transformers cannot build is refused where it loads, with its own message
        return []
    wrong = [f"{name} is {list(stored[name])}, config.json builds {list(shape)}"
             for name, shape in wanted.items() if name in stored and stored[name] != shape]
    if not wrong:
        return []
    return [f"{key}: {directory}: {len(wrong)} weight(s) do not have the shapes its config.json gives "
            f"({'; '.join(wrong[:SHOWN])}{'; ...' if len(wrong) > SHOWN else ''}); the config and the weights come "
            "from different models: restore the config.json that came with the weights"]


def weight_problems(key: str, directory: str) -> list[str]:
    return weight_file_problems(key, directory) or shape_problems(key, directory)
