"""Every launcher's command line follows one set of conventions (`rl.launch.cli`): `--help` exits 0 and lists every
flag the launcher takes (the shared ones included); a config key written as a flag (`--trainer.seed=3`, a Hydra
habit) and an unknown flag are usage errors, exit 2, the first with what to write instead; the output folder is
`--run_dir` everywhere, an earlier name still read with a note; a refused config is one header and its problems."""

from __future__ import annotations

import subprocess
import sys

import pytest

FLAGS = {
    "train": ("--strategy", "--config", "--run_dir", "--ray_address"),
    "sft": ("--strategy", "--config", "--run_dir", "--ray_address"),
    "dpo": ("--strategy", "--config", "--run_dir", "--ray_address"),
    "convert": ("--direction", "--input", "--run_dir", "--output"),
    "prepare_gsm8k": ("--run_dir", "--input", "--output_dir"),
    "plan": ("--strategy", "--config"),
}


def _launch(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"rl.launch.{name}", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("name", FLAGS)
def test_help_exits_0_listing_every_flag(name):
    done = _launch(name, "--help")
    assert done.returncode == 0, done.stdout + done.stderr
    listed = {line.split(":")[0].strip() for line in done.stdout.splitlines() if line.strip().startswith("--")}
    assert set(FLAGS[name]) <= listed, (name, sorted(listed))
    assert "bare key=value" in done.stdout


@pytest.mark.parametrize("name", ["train", "plan"])
def test_a_config_key_written_as_a_flag_says_what_to_write(name):
    done = _launch(name, "--trainer.seed=3")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == ("error: --trainer.seed=3: config overrides are bare key=value "
                                                    "arguments after the flags: write trainer.seed=3")


def test_an_unknown_flag_is_a_usage_error():
    done = _launch("sft", "--run_dri=/tmp/x")
    assert done.returncode == 2
    assert "run_dri" in done.stderr and "--help` lists the flags" in done.stderr


@pytest.mark.parametrize("name,old", [("convert", "--output"), ("prepare_gsm8k", "--output_dir")])
def test_an_old_name_of_run_dir_still_works_and_says_so(name, old, tmp_path):
    args = ("--direction=checkpoint_to_hf", f"--input={tmp_path / 'absent'}") if name == "convert" else (
        f"--input={tmp_path / 'absent'}",)
    done = _launch(name, *args, f"{old}={tmp_path / 'out'}")
    assert f"note: {old} is the old name of --run_dir" in done.stderr, done.stderr
    assert str(tmp_path / "absent") in done.stderr, "the run went on with the folder the old name gave"


def test_a_refused_config_has_one_header():
    done = _launch("train", "trainer.seed=abc", "trainer.max_stepz=3")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "invalid config (2 problems):", done.stderr
    assert sum("invalid config" in line for line in lines) == 1 and len(lines) == 3, done.stderr
