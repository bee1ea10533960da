"""Checkpoints carry a manifest (size and sha256 of every file) written before the COMPLETE marker: a flipped byte,
a truncated, deleted or foreign file is named by `verify`, and `latest` falls back to the newest checkpoint that
verifies, saying which it passed over."""

import os

import pytest

import rl.backends.registry  # noqa: F401  (registers the training strategies the config names)
from rl.trainer.state import checkpoint


def _save(root: str, step: int) -> str:
    staging = checkpoint.staging_dir(root, step)
    os.makedirs(os.path.join(staging, "policy"))
    with open(os.path.join(staging, "policy", "shard_0.pt"), "wb") as f:
        f.write(bytes(range(256)) * 64)
    with open(os.path.join(staging, "policy", "meta.json"), "w") as f:
        f.write('{"ok": true}')
    return checkpoint.commit(root, step, {"step": step, "epoch": 0, "index": step})


def _flip(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))


def _truncate(path: str) -> None:
    with open(path, "r+b") as f:
        f.truncate(1000)


def _add(path: str) -> None:
    with open(os.path.join(os.path.dirname(path), "stray.bin"), "wb") as f:
        f.write(b"x")


DAMAGE = {
    "flipped": (_flip, "policy/shard_0.pt does not match its checksum"),
    "truncated": (_truncate, "policy/shard_0.pt has 1000 bytes, 16384 were written"),
    "deleted": (os.remove, "policy/shard_0.pt is missing"),
    "foreign file": (_add, "policy/stray.bin was not part of the checkpoint"),
}


def test_an_intact_checkpoint_verifies(tmp_path):
    path = _save(str(tmp_path), 2)
    assert checkpoint.verify(path) == []
    assert os.path.isfile(os.path.join(path, checkpoint.MANIFEST))


@pytest.mark.parametrize("damage", DAMAGE)
def test_damage_is_named_and_latest_falls_back(tmp_path, damage):
    root = str(tmp_path)
    older, newer = _save(root, 2), _save(root, 4)
    hurt, words = DAMAGE[damage]
    hurt(os.path.join(newer, "policy", "shard_0.pt"))
    assert any(words in problem for problem in checkpoint.verify(newer)), checkpoint.verify(newer)
    said = []
    assert checkpoint.latest(root, log=said.append) == older
    assert len(said) == 1 and newer in said[0] and words in said[0]


def test_no_intact_checkpoint_means_none(tmp_path):
    only = _save(str(tmp_path), 2)
    with open(os.path.join(only, checkpoint.TRAINER_STATE), "a") as f:
        f.write(" ")
    assert checkpoint.latest(str(tmp_path), log=lambda _: None) is None


def test_an_explicit_damaged_checkpoint_is_refused_before_anything_starts(tmp_path):
    from rl.core.config import ConfigError, load_config
    from rl.trainer.preflight.checks import preflight

    path = _save(str(tmp_path), 2)
    _flip(os.path.join(path, "policy", "shard_0.pt"))
    with pytest.raises(ConfigError, match=r"trainer.resume_mode: .*global_step_2 is damaged: policy/shard_0.pt does "
                                          r"not match its checksum"):
        preflight(load_config([f"trainer.resume_mode={path}"]))


def _steps(root: str) -> list[int]:
    return sorted(int(name.rsplit("_", 1)[1]) for name in os.listdir(root) if checkpoint.is_complete(
        os.path.join(root, name)))


def test_retention_keeps_the_newest_and_the_best(tmp_path):
    """max_ckpts_to_keep=2: by recency the two newest; by a metric the two best (a step that did not log it ranks
    last, ties go to the newer) and the newest whatever its score; -1 keeps all; a partial one is never touched."""
    root = str(tmp_path / "ckpt")
    for step in (1, 2, 3, 4, 5):
        _save(root, step)
    os.makedirs(checkpoint.step_dir(root, 6) + ".partial")
    assert checkpoint.prune(root, -1) == []
    removed = checkpoint.prune(root, 4, log=lambda _: None)
    assert removed == [checkpoint.step_dir(root, 1)] and _steps(root) == [2, 3, 4, 5]
    said = []
    # val_accuracy logged at steps 2, 3, 4 (not 5): 3 and 2 tie at 0.9, 2 loses the tie to the newer
    checkpoint.prune(root, 1, {2: 0.9, 3: 0.9, 4: 0.5}, log=said.append)
    assert _steps(root) == [3, 5] and os.path.isdir(checkpoint.step_dir(root, 6) + ".partial")
    assert said == ["checkpoints: removed global_step_2, global_step_4 (trainer.max_ckpts_to_keep=1)"]
    checkpoint.prune(root, 1, {3: 0.2, 5: 0.1}, higher_is_better=False, log=lambda _: None)
    assert _steps(root) == [5]


def test_retention_reads_the_metric_from_metrics_jsonl(tmp_path):
    from types import SimpleNamespace

    root, metrics = str(tmp_path / "ckpt"), str(tmp_path / "metrics.jsonl")
    for step in (1, 2, 3):
        _save(root, step)
    with open(metrics, "w") as f:
        f.writelines(f'{{"step": {step}, "val_accuracy": {value}}}\n' for step, value in ((1, 0.7), (2, 0.3), (3, 0.1)))
    trainer = SimpleNamespace(max_ckpts_to_keep=1, ckpt_keep_metric="val_accuracy", ckpt_keep_higher_is_better=True)
    said = []
    checkpoint.apply_retention(trainer, root, metrics, log=said.append)
    assert _steps(root) == [1, 3]  # the best, and the newest (what resume_mode=latest takes)
    assert said == ["checkpoints: removed global_step_2 (trainer.max_ckpts_to_keep=1)"]
    _save(root, 4)
    misspelt = SimpleNamespace(**{**vars(trainer), "ckpt_keep_metric": "val_acuracy"})
    checkpoint.apply_retention(misspelt, root, metrics, log=said.append)
    assert _steps(root) == [4] and "no metrics row holds trainer.ckpt_keep_metric='val_acuracy' yet" in said[1]
