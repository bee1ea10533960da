"""The embedded default job: a project-built tokenizer, a small Llama model made from a config, a synthetic
arithmetic task in GSM8K's answer format, and a short supervised warm-up, so training runs with no downloads."""

from rl.tasks.embedded.model import build_model, save_pretrained_model, tiny_model_config
from rl.tasks.embedded.prepare import EmbeddedDefault, Recipe, prepare_embedded_default, write_untrained_job
from rl.tasks.embedded.task import DATA_SOURCE, TaskSpec, make_task_rows, write_task_dataset
from rl.tasks.embedded.tokenizer import build_tokenizer
from rl.tasks.embedded.warmup import careless_demonstrations, greedy_accuracy

__all__ = [
    "DATA_SOURCE",
    "EmbeddedDefault",
    "Recipe",
    "TaskSpec",
    "build_model",
    "build_tokenizer",
    "careless_demonstrations",
    "greedy_accuracy",
    "make_task_rows",
    "prepare_embedded_default",
    "save_pretrained_model",
    "tiny_model_config",
    "write_task_dataset",
    "write_untrained_job",
]
