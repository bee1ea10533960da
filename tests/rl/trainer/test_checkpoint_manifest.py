"""Checkpoints carry a manifest (size and sha256 of every file) written before the COMPLETE marker: a flipped byte,
a truncated, deleted or foreign file is named by `verify`, and `latest` falls back to the newest checkpoint that
verifies, saying which it passed over."""

import os

import pytest

import rl.backends.registry  # noqa: F401  (registers the training strategies the config names)
from rl.trainer import checkpoint


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
    from rl.trainer.preflight import preflight

    path = _save(str(tmp_path), 2)
    _flip(os.path.join(path, "policy", "shard_0.pt"))
    with pytest.raises(ConfigError, match=r"trainer.resume_mode: .*global_step_2 is damaged: policy/shard_0.pt does "
                                          r"not match its checksum"):
        preflight(load_config([f"trainer.resume_mode={path}"]))
