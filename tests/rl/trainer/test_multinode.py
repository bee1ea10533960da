"""Two Ray nodes (`ray.cluster_utils.Cluster`: two raylets on this machine, one CPU each) with one training worker
each, joined with --ray_address: the placement spreads the workers over distinct nodes, and the run gives the same
losses as one node with two workers (the oracle). A node that leaves mid-run ends the run naming its worker."""

import os
import re

import pytest

from rl.trainer.state.metrics import read_metrics
from tests.testing.tiny_job import make_tiny_job, run_train, wait_for

COMPARED = ("reward_mean", "loss", "pg_loss", "grad_norm", "kl", "entropy")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


def _overrides(job) -> list[str]:
    return [*job.overrides(steps=2), "data.reward_fn=gsm8k_flexible", "trainer.algorithm.use_entropy_loss=true"]


def test_two_nodes_train_like_one_node_with_two_workers(job, tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        spread = run_train(str(tmp_path / "two-nodes"), [*_overrides(job), "trainer.placement.policy_num_nodes=2",
                                                         f"--ray_address={cluster.address}"], timeout=600)
    finally:
        cluster.shutdown()
    assert spread.returncode == 0, spread.stderr[-5000:]
    nodes = re.findall(r"rank \d: \S+ node (\S+) pid", spread.stdout)
    assert len(nodes) == 2 and nodes[0] != nodes[1], spread.stdout
    one = run_train(str(tmp_path / "one-node"), [*_overrides(job), "trainer.placement.policy_num_gpus_per_node=2"])
    assert one.returncode == 0, one.stderr[-5000:]
    rows = [read_metrics(os.path.join(str(tmp_path / name), "metrics.jsonl")) for name in ("two-nodes", "one-node")]
    assert len(rows[0]) == len(rows[1]) == 2
    # Bit for bit: both runs are two training workers of one torch thread each on this machine's kernels, each
    # rank given the same micro-batches in the same order; the all-reduce adds two operands (a + b == b + a), and
    # the rollouts come from the same seeds. Only where the workers run differs.
    for got, want in zip(*rows, strict=True):
        assert got["loss"] != 0
        for key in COMPARED:
            assert got[key] == want[key], (got["step"], key, got[key], want[key])


def test_a_node_that_leaves_ends_the_run_naming_its_worker(job, tmp_path):
    """The second node is removed mid-run (its raylet and the worker on it are gone): the launcher ends within 60 s
    with exit code 1, naming the worker rank on that node, the step and the last complete checkpoint."""
    import time

    from ray.cluster_utils import Cluster

    from rl.core.subprocess_run import kill_group, start_train
    from rl.trainer.state import checkpoint

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    log = open(tmp_path / "launcher.log", "w+")  # noqa: SIM115  (read during the run, closed below)
    proc = None
    try:
        leaving = cluster.add_node(num_cpus=1)
        run_dir = str(tmp_path / "run")
        proc = start_train(run_dir, [*job.overrides(steps=300), "trainer.placement.policy_num_nodes=2",
                                     "trainer.ckpt_interval=1", f"--ray_address={cluster.address}"], output=log)
        wait_for(proc, lambda: os.path.isdir(checkpoint.step_dir(os.path.join(run_dir, "checkpoints"), 2)),
                 "the run did not reach step 2")
        log.seek(0)
        ranks = dict(re.findall(r"rank (\d): \S+ node (\S+) pid", log.read()))
        rank = next(r for r, node in ranks.items() if leaving.node_id.startswith(node))
        cluster.remove_node(leaving)
        left = time.monotonic()
        assert proc.wait(timeout=60) == 1
        assert time.monotonic() - left < 60
        log.seek(0)
        errors = [line for line in log.read().splitlines() if line.startswith("error: ")]  # Ray's warnings beside
        assert len(errors) == 1, errors
        last = errors[0]
        assert re.fullmatch(rf"error: training worker rank {rank} \(\S+ node {ranks[rank]} pid \d+\) died \(.*\) "
                            r"at step \d+; last complete checkpoint: .*global_step_\d+ \(resume with "
                            r"trainer\.resume_mode=latest\)", last), last
    finally:
        if proc is not None:
            kill_group(proc.pid)
        log.close()
        cluster.shutdown()
