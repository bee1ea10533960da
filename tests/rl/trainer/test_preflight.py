"""What the machine must provide is checked before anything is created: a hub name that is neither cached nor
reachable, and a run directory that is a file. The launcher exits with code 2 naming the key, with no run directory
and no Ray instance. (The other preflight refusals are rows of `test_bad_input_catalogue.py`.) And the planner's
refusal of a GPU-only layout, asked directly as for a GPU machine."""

import pytest

from rl.launch import train
from tests.testing.launcher import launch_refused


@pytest.mark.parametrize("offline", [True, False], ids=["offline", "unreachable"])
def test_hub_name_not_cached_without_a_hub_is_refused(offline, tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    message = launch_refused(str(tmp_path / "run"), ["trainer.policy.model.path=no-such-org/no-such-model"], capsys)
    name = "no-such-org/no-such-model"
    assert f"trainer.policy.model.path: {name} is a hub name that is not in the local cache" in message
    assert ("HF_HUB_OFFLINE is set" if offline else "http://127.0.0.1:9 cannot be reached") in message
    assert "point trainer.policy.model.path at the directory" in message


def test_run_dir_that_is_a_file_is_refused(tmp_path, capsys):
    from absl import flags

    path = tmp_path / "run"
    path.write_text("")
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["train", f"--run_dir={path}"])
    assert train.main(["train"]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err


@pytest.mark.parametrize(("overrides", "expected"), [
    (["trainer.placement.colocate_all=false", "generator.weight_sync_backend=ipc"], "GPUs of their own"),
    (["trainer.placement.colocate_all=false", "generator.weight_sync_backend=nccl"], None),
    (["generator.backend=vllm", "generator.weight_sync_backend=ipc"], None),
])
def test_ipc_weight_sync_is_refused_for_engines_on_gpus_of_their_own(overrides, expected):
    """On a GPU machine (the placement planner told it has 4): a shared CUDA buffer opens only on its own GPU."""
    from rl.core.config.loader import load_config
    from rl.trainer.workers.placement import fit_problems

    problems = fit_problems(load_config(overrides), gpus=4, cores=16, remote=False)
    found = [p.startswith("generator.weight_sync_backend: ipc") and expected in p for p in problems]
    assert found == ([] if expected is None else [True]), problems
