"""Fetch GSM8K from the Hugging Face hub (`openai/gsm8k`, config `main`) when no local copy is given."""

from __future__ import annotations

from rl.core.data.errors import DataError
from rl.tasks.gsm8k.data import Gsm8kSplit, parse_records

HUB_DATASET = ("openai/gsm8k", "main")
# Output split name -> hub split name.
HUB_SPLITS = {"train": "train", "validation": "test"}
OFFLINE_HINT = (
    "pass --input=DIR naming a local folder that holds GSM8K's train.jsonl and test.jsonl "
    '(one {"question", "answer"} object per line)'
)


def load_gsm8k_from_hub() -> dict[str, Gsm8kSplit]:
    """Download both splits; any failure (no `datasets` package, hub unreachable) says to pass --input instead."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"the 'datasets' package is not installed; {OFFLINE_HINT}") from None
    try:
        loaded = datasets.load_dataset(*HUB_DATASET)
    except Exception as err:  # the hub client raises many unrelated types when offline
        raise DataError(
            f"could not fetch {HUB_DATASET[0]} from the Hugging Face hub ({type(err).__name__}: {err}); {OFFLINE_HINT}"
        ) from None
    splits = {}
    for name, hub_split in HUB_SPLITS.items():
        rows = enumerate(loaded[hub_split], start=1)
        splits[name] = parse_records(rows, f"{HUB_DATASET[0]} (hub) {hub_split} split")
    return splits
