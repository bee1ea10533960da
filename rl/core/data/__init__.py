"""Prompt datasets: loading parquet/jsonl prompt files and resumable seeded batching."""

from rl.core.data.batching import BatchPosition, PromptBatch, batches_per_epoch, epoch_order, iter_batches
from rl.core.data.errors import DataError
from rl.core.data.loading import load_prompt_dataset
from rl.core.data.readers import FILE_READERS
from rl.core.data.records import ChatMessage, PromptDataset, PromptRecord
from rl.core.data.splitting import split_validation
from rl.core.data.templates import PromptTemplate, load_prompt_template

__all__ = [
    "FILE_READERS",
    "BatchPosition",
    "ChatMessage",
    "DataError",
    "PromptBatch",
    "PromptDataset",
    "PromptRecord",
    "PromptTemplate",
    "batches_per_epoch",
    "epoch_order",
    "iter_batches",
    "load_prompt_dataset",
    "load_prompt_template",
    "split_validation",
]
