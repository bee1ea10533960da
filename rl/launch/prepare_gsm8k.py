"""Write GSM8K as the trainer's parquet files: train.parquet and validation.parquet under --run_dir.

    python -m rl.launch.prepare_gsm8k --run_dir=~/data/gsm8k --input=~/downloads/gsm8k

--input names a local folder holding GSM8K's train.jsonl and test.jsonl; without it the dataset is downloaded from
the Hugging Face hub (`openai/gsm8k`, config `main`).
"""

from __future__ import annotations

import sys

from absl import flags

from rl.core.data.errors import DataError
from rl.launch import cli
from rl.tasks.gsm8k.data import PrepareReport, read_gsm8k_dir, write_gsm8k

FLAGS = flags.FLAGS
flags.DEFINE_string("run_dir", None, "Folder to write train.parquet and validation.parquet into (~ expanded).")
cli.define_old_name("output_dir", "run_dir", __name__)
flags.DEFINE_string("input", None, "Local folder with train.jsonl and test.jsonl; omit to download from the hub.")
flags.mark_flag_as_required("run_dir")


def prepare(output_dir: str, input_dir: str | None = None) -> PrepareReport:
    """Read GSM8K (from `input_dir`, or the hub when None) and write both splits under `output_dir`."""
    if input_dir is None:
        from rl.tasks.gsm8k.hub import load_gsm8k_from_hub

        splits = load_gsm8k_from_hub()
    else:
        splits = read_gsm8k_dir(input_dir)
    return write_gsm8k(splits, output_dir)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print(f"error: unexpected arguments: {' '.join(argv[1:])}; use --run_dir=DIR [--input=DIR]", file=sys.stderr)
        return 2
    try:
        report = prepare(FLAGS.run_dir, FLAGS.input)
    except DataError as err:  # refused before anything is written: exit 2, as every launcher's refusals
        print(f"prepare_gsm8k: {err}", file=sys.stderr)
        return 2
    print(report.describe())
    return 0


if __name__ == "__main__":
    cli.run(main)
