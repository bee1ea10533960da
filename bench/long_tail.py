"""A long-tail variant of the embedded task, for `bench.async_training --long-tail`: most prompts are the embedded
two-number additions (responses of about 17 tokens), and one in `LONG_SHARE` adds `LONG_OPERANDS` single digits,
answered by running sums (`3+5=8 8+2=10 10+7=17 ... #### 63`, about 8x the median length), so a few responses
of every batch run far past the others, as reasoning traces do.

The model is the embedded default (its cached warm-up), with room for the longer sequences (RoPE has no learned
positions, so only the configured limits grow), taught the running-sum format by `rl.launch.sft` on a mix of both
kinds of rows (the short ones keep the embedded warm-up's careless answers, so GRPO still has carries to learn).
Everything is built once under the bench's work directory and reused.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from rl.core.data.parquet_io import write_parquet_atomic
from rl.tasks.embedded.task import DATA_SOURCE, make_task_rows
from rl.tasks.embedded.tokenizer import ANSWER_MARKER

LONG_SHARE = 16  # one prompt in LONG_SHARE is a long sum
LONG_OPERANDS = 20
MAX_POSITIONS = 320  # prompt (about 85 tokens for a long sum) + the longest response (about 160)
SFT_STEPS = 200


def long_problem(rng: random.Random) -> tuple[str, str, int]:
    """(question, reference response, answer) of a sum of LONG_OPERANDS digits (1-9)."""
    digits = [rng.randint(1, 9) for _ in range(LONG_OPERANDS)]
    steps, total = [], digits[0]
    for digit in digits[1:]:
        steps.append(f"{total}+{digit}={total + digit}")
        total += digit
    return f"What is {' + '.join(map(str, digits))}?", f"{' '.join(steps)} {ANSWER_MARKER} {total}", total


def rows(n: int, seed: int, split: str) -> list[dict]:
    """`n` rows of `split`: the embedded task's problems with one in LONG_SHARE replaced by a long sum (the long
    sums of the two splits are drawn from different generators, so they do not share prompts in practice)."""
    short = make_task_rows(n, seed, split)
    rng = random.Random(f"long-tail/{seed}/{split}")
    out = []
    for index, row in enumerate(short):
        if index % LONG_SHARE == LONG_SHARE // 2:
            question, reference, answer = long_problem(rng)
            row = {**row, "prompt": [{"role": "user", "content": question}], "answer": str(answer),
                   "reference_response": reference, "careless_response": reference, "carries": False}
        out.append({**row, "data_source": DATA_SOURCE, "long": index % LONG_SHARE == LONG_SHARE // 2})
    return out


def sft_rows(train: list[dict], seed: int) -> list[dict]:
    """Prompt/response rows for the format warm-up: every long sum, and as many short problems answered as the
    embedded warm-up answers them (carelessly on three in four carrying problems)."""
    rng = random.Random(f"long-tail-sft/{seed}")
    longs = [row for row in train if row["long"]]
    shorts = [row for row in train if not row["long"]][: 3 * len(longs)]
    return [{"prompt": row["prompt"],
             "response": row["careless_response"] if row["carries"] and rng.random() < 0.75
             else row["reference_response"]} for row in longs + shorts]


def widen(model_dir: Path) -> None:
    """Raise the positions the model and its tokenizer accept to MAX_POSITIONS (weights unchanged)."""
    for name, key in (("config.json", "max_position_embeddings"), ("tokenizer_config.json", "model_max_length")):
        path = model_dir / name
        config = json.loads(path.read_text())
        config[key] = MAX_POSITIONS
        path.write_text(json.dumps(config, indent=2))


def prepare(workdir: Path, seed: int = 42, log=print) -> dict[str, str]:
    """The long-tail job's files under `workdir`: {"model", "train", "val"}; built on the first call."""
    from rl.core.subprocess_run import run_train
    from rl.tasks.embedded.cache import default_cache_dir
    from rl.tasks.embedded.prepare import prepare_embedded_default

    workdir.mkdir(parents=True, exist_ok=True)
    paths = {"model": workdir / "sft" / "exports" / f"global_step_{SFT_STEPS}",
             "train": workdir / "train.parquet", "val": workdir / "validation.parquet"}
    if all(path.exists() for path in paths.values()):
        return {key: str(path) for key, path in paths.items()}
    train = rows(4000, seed, "train")
    write_parquet_atomic(train, paths["train"])
    write_parquet_atomic(rows(200, seed, "validation"), paths["val"])
    write_parquet_atomic(sft_rows(train, seed), workdir / "sft_train.parquet")
    base = prepare_embedded_default(workdir / "embedded", seed=seed, cache_dir=default_cache_dir(), log=log)
    start = workdir / "start"
    shutil.rmtree(start, ignore_errors=True)
    shutil.copytree(base.model_path, start)
    widen(start)
    log(f"long-tail: teaching the running-sum format ({SFT_STEPS} SFT steps)")
    done = run_train(str(workdir / "sft"), [
        f"trainer.policy.model.path={start}", f"data.train_data=[{workdir / 'sft_train.parquet'}]", "data.val_data=[]",
        f"trainer.max_steps={SFT_STEPS}", "trainer.train_batch_size=32", "trainer.policy.optimizer_config.lr=1e-3",
        f"trainer.hf_save_interval={SFT_STEPS}", f"trainer.seed={seed}", f"sft.max_length={MAX_POSITIONS}"],
        module="rl.launch.sft", timeout=3600)
    if done.returncode:
        raise RuntimeError(f"long-tail SFT failed:\n{done.stderr[-3000:]}")
    return {key: str(path) for key, path in paths.items()}
