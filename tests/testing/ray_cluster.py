"""One Ray cluster per test process, which the launcher runs of a target join with `--ray_address`: each run then
skips starting and stopping a Ray instance of its own (about 8 s of a tiny run's 30-40 s on a 2-core machine).

The cluster is a head node started from this process (`ray.cluster_utils.Cluster`), with more logical CPUs than the
largest layout a test runs needs (on a machine without GPUs a placement bundle's device is one logical CPU); it is
shut down when the test process exits. A run that needs a Ray of its own (its files in the run directory, processes
that die with the launcher) does not join it: see `tiny_job.run_train`.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sys
import tempfile

LOGICAL_CPUS = 12  # 4 workers and 2-4 engines at most in one run, with room for reward and reference actors

# Every actor of a run has a runtime_env of its own and cannot use idle workers started ahead, which would only take
# the cores the run's actors start on.
NO_PRESTART = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}

_cluster = None


def _visible_gpus() -> int:
    """The GPUs this process sees: a run that joins the cluster places its workers on them (gpu-tagged tests)."""
    import torch

    return torch.cuda.device_count()


def shared_ray_address() -> str:
    """The address of this process's cluster, started on first use."""
    global _cluster
    if _cluster is None:
        from ray.cluster_utils import Cluster

        # The raylet starts every worker with the environment it had at start: absolute import paths (a relative
        # PYTHONPATH would resolve against each worker's own directory) and Ray's quiet settings.
        saved = dict(os.environ)
        os.environ.update(PYTHONPATH=os.pathsep.join(os.path.abspath(p) for p in sys.path if p),
                          RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", TOKENIZERS_PARALLELISM="false")
        # A short directory: Ray's socket paths under a test's long temporary directory exceed the 107 bytes of a
        # Unix socket name.
        files = tempfile.mkdtemp(prefix="rl-ray-", dir="/tmp" if os.access("/tmp", os.W_OK) else None)
        # cluster_utils records the head's address in Ray's default temp dir, which it does not create (a fresh
        # machine has no /tmp/ray).
        from ray._common.utils import get_default_ray_temp_dir

        os.makedirs(get_default_ray_temp_dir(), exist_ok=True)
        try:
            _cluster = Cluster(initialize_head=True, shutdown_at_exit=False,
                               head_node_args={"num_cpus": LOGICAL_CPUS, "num_gpus": _visible_gpus(),
                                               "include_dashboard": False, "temp_dir": files,
                                               "no_monitor": True,  # the autoscaler's: a fixed one-node cluster
                                               "_system_config": NO_PRESTART})
        finally:
            os.environ.clear()
            os.environ.update(saved)
        atexit.register(functools.partial(shutil.rmtree, files, ignore_errors=True))
        atexit.register(_cluster.shutdown)  # atexit runs last-registered first: the nodes stop, then files go
    return _cluster.address
