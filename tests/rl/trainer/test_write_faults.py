"""A checkpoint that cannot be written ends the run with one line (the path, the error, the free space, the last
complete checkpoint) and leaves no partial directory. The failures are real ones: writes to /dev/full (ENOSPC
from the kernel) through each writer the run uses, and a launcher run whose checkpoints go to a tmpfs too small
for two of them, mounted in a user namespace."""

import os
import re
import shutil
import subprocess

import pytest
import torch

from rl.core.subprocess_run import launcher_command, launcher_env
from rl.trainer.state.write_faults import describe, write_failed, write_failure
from tests.testing.tiny_job import make_tiny_job


def _raised(write) -> BaseException:
    try:
        write()
    except BaseException as error:  # whatever the writer raises is the subject
        return error
    raise AssertionError("writing to /dev/full did not fail")


def _plain_write():
    with open("/dev/full", "wb") as f:
        f.write(b"x" * 8192)


WRITERS = {
    "open": _plain_write,
    "torch.save": lambda: torch.save({"w": torch.zeros(4096)}, "/dev/full"),
}  # not safetensors: it replaces the file at its path rather than writing through it (as root, /dev/full itself)


@pytest.mark.parametrize("writer", WRITERS)
def test_each_writer_s_full_disk_is_recognised(writer):
    error = _raised(WRITERS[writer])
    wrapped = RuntimeError("the actor's task failed")  # as an error reaches the driver through another's cause
    wrapped.__cause__ = error
    for raised in (error, wrapped):
        assert write_failure(raised) is error
    assert describe(error)


def test_other_failures_are_not_write_failures():
    assert write_failure(ValueError("shapes do not match")) is None
    assert write_failure(RuntimeError("probability tensor contains inf, nan")) is None


def test_the_line_names_path_error_and_space_and_removes_the_partial(tmp_path):
    partial = tmp_path / "global_step_3.partial"
    partial.mkdir()
    (partial / "shard").write_bytes(b"half")
    error = _raised(_plain_write)
    line = str(write_failed("the checkpoint of step 3", str(tmp_path / "global_step_3"), error, str(partial),
                            "trainer.ckpt_path"))
    assert not partial.exists()
    assert line.startswith(f"the checkpoint of step 3 could not be written to {tmp_path / 'global_step_3'}: "
                           "[Errno 28] No space left on device"), line
    assert re.search(r"; its filesystem had \d+\.\d (KiB|MiB|GiB) free of \d+\.\d (KiB|MiB|GiB) when the write "
                     r"failed; ", line), line
    assert line.endswith(f"the partial {partial} was removed (free space there or set trainer.ckpt_path to another "
                         "disk)"), line


def _tmpfs_problem() -> str | None:
    if shutil.which("unshare") is None:
        return "util-linux's unshare is not installed"
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"no tmpfs in a user namespace here: {probe.stderr.strip()}"


@pytest.mark.skipif(_tmpfs_problem() is not None, reason=f"{_tmpfs_problem()}")
def test_a_full_disk_during_a_checkpoint_ends_the_run_in_one_line(tmp_path):
    job = make_tiny_job(str(tmp_path / "job"))
    weights = sum(os.path.getsize(os.path.join(job.model_path, name)) for name in os.listdir(job.model_path)
                  if name.endswith(".safetensors"))
    # A checkpoint holds the fp32 weights and Adam's two moments (3x the weights, plus small files): one fits in
    # 5x the weights, a second beside it does not.
    size = 5 * weights
    ckpt = str(tmp_path / "ckpt")
    os.makedirs(ckpt)
    run_dir = str(tmp_path / "run")
    train = launcher_command(run_dir, [*job.overrides(steps=3), "trainer.ckpt_interval=1",
                                       f"trainer.ckpt_path={ckpt}"])
    script = ('mount -t tmpfs -o size="$1" tmpfs "$2" || exit 99; shift 2; "$@"; code=$?; '
              'echo "left in the checkpoint dir:"; ls -a "$0"; exit $code')
    result = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, ckpt,
                             str(size), ckpt, *train], capture_output=True, text=True, env=launcher_env(),
                            timeout=600, start_new_session=True)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-4000:]
    last = result.stderr.strip().splitlines()[-1]
    step2, step1 = os.path.join(ckpt, "global_step_2"), os.path.join(ckpt, "global_step_1")
    assert last.startswith(f"error: the checkpoint of step 2 could not be written to {step2}: "), last
    # the free space as the failed write left it (the checkpoint of step 1 and what step 2 wrote), not after the
    # partial step 2 was removed: under a checkpoint's size
    assert "No space left on device" in last, last
    found = re.search(r"; its filesystem had ([\d.]+) (B|KiB|MiB) free of [\d.]+ (KiB|MiB) when the write failed; ",
                      last)
    assert found, last
    assert float(found.group(1)) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20}[found.group(2)] < size / 5, last
    assert last.endswith(f"at step 2; last complete checkpoint: {step1} (resume with trainer.resume_mode=latest)")
    assert "Traceback" not in result.stderr, result.stderr[-4000:]
    listing = result.stdout.split("left in the checkpoint dir:")[-1].split()
    assert sorted(listing) == [".", "..", "global_step_1"], listing
