"""Bytes per GPU of one model's weights, gradients, optimizer state and transient gathered copies, per strategy.
Each function follows what that strategy's backend here builds (rl/backends/*): the models are loaded in fp32 and
compute in the dtype of `trainer.bf16`; the optimizer is torch's AdamW (fp32 moments)."""

from __future__ import annotations

from dataclasses import dataclass

from rl.backends.planner.inputs import PlanInputs
from rl.backends.planner.layout import Knobs
from rl.backends.planner.shape import ModelShape
from rl.backends.planner.terms import ADAM_BYTES, GRAD_FP32, MASTER_BYTES, adam_bytes, weight_bytes


@dataclass(frozen=True)
class ModelState:
    """One model on one GPU."""

    params: float
    grads: float
    """Gradients during a training step (freed after the optimizer step unless `persistent_grads`)."""
    optimizer: float
    gathered: float
    """Transient buffers while the model trains: FSDP / ZeRO-3 units gathered in the compute dtype, DeepSpeed's
    gradient bucket."""
    gathered_forward: float = 0.0
    """The gathered units of a forward-only pass."""
    grad_buffer: float = 0.0
    """An unsharded fp32 gradient awaiting its reduce-scatter through the whole backward: FSDP's root unit (the LM
    head's weight gradient is made first and the root is reduced last), or the largest layer if that is larger."""
    reduce_copy: float = 0.0
    """What only the end of backward adds: FSDP's reduce-scatter input, a copy of the unit's unsharded gradients
    (torch's `foreach_reduce` concatenates them into one buffer before the collective)."""
    step_copy: float = 0.0
    """What the optimizer step adds over the gradients: DeepSpeed ZeRO hands its optimizer a flattened fp32 copy of
    the rank's gradient partition."""
    persistent_grads: bool = False


@dataclass(frozen=True)
class Counts:
    total: float
    trainable: float


def counts(shape: ModelShape, lora_rank: int, targets: tuple[str, ...], trainable: bool = True) -> Counts:
    """Parameters of a model and how many train: all of them, LoRA's adapters (the base is frozen and stays), or
    none (the reference model)."""
    base = shape.total_params()
    if lora_rank > 0:
        adapters = shape.lora_params(lora_rank, targets)
        return Counts(base + adapters, adapters if trainable else 0)
    return Counts(base, base if trainable else 0)


def fsdp_state(inputs: PlanInputs, knobs: Knobs, shape: ModelShape, n: Counts, offload: bool) -> ModelState:
    """FSDP2 (`fully_shard` per decoder layer and the root) and FSDP1 over a shard group of N ranks (fsdp_size, or
    the world). Sharded fp32 weights 4P/N, fp32 gradients 4P/N (reduce_dtype fp32), AdamW 8P/N: 16 bytes per
    parameter over N (ZeRO-3's arithmetic in fp32). While training, the root unit (embedding, final norm, untied
    head) stays gathered from forward to backward, a layer unit and the prefetched next one are gathered in the
    compute dtype (2 c * largest layer), and one unsharded fp32 gradient awaits its reduce-scatter (`grad_buffer`,
    copied once more into the collective's input at the end of backward: `reduce_copy`); with
    reshard_after_forward=false every unit stays gathered through backward (c P). FSDP1 on one rank is NO_SHARD:
    no gathered copies (in bf16 a low-precision copy of the whole model, c P), but its root's gradient still meets
    another of its size at the end of backward (the tied head's and the embedding's, before they are summed into
    the flat gradient; measured by bench/plan_memory.py), so the same two buffers are counted. `cpu_offload` keeps
    weights, gradients and optimizer state in host memory; only the gathered units come to the GPU."""
    c = inputs.compute_bytes
    shards = knobs.shard_size if knobs.shard_size > 0 else inputs.world
    unit, root = shape.largest_layer_params(), shape.root_params()
    unsharded_grad = GRAD_FP32 * max(unit, root) * (n.trainable / n.total if n.total else 0)
    if knobs.strategy == "fsdp" and shards == 1:
        forward = c * n.total if c < 4 else 0.0
    elif knobs.reshard:
        forward = c * root + 2 * c * unit
    else:
        forward = c * n.total
    resident = 0.0 if offload else 1.0
    return ModelState(params=resident * weight_bytes(n.total, 4, shards),
                      grads=resident * weight_bytes(n.trainable, GRAD_FP32, shards),
                      optimizer=resident * adam_bytes(n.trainable, shards),
                      gathered=forward, gathered_forward=forward, grad_buffer=unsharded_grad,
                      reduce_copy=unsharded_grad)


def deepspeed_state(inputs: PlanInputs, knobs: Knobs, shape: ModelShape, n: Counts, stage: int) -> ModelState:
    """DeepSpeed ZeRO over the N = world data-parallel ranks (rl/backends/deepspeed.py, DeepSpeed 0.19's
    stage_1_and_2.py / stage3.py). The engine holds the module in the compute dtype (it casts it to bf16 when bf16
    is on): c P, or c P / N at stage 3. The optimizer state is ZeRO's K = 12 bytes per parameter (an fp32 master
    copy, which ZeRO 1/2 make even of an fp32 model, and AdamW's 8), over N from stage 1 (stage 0 in bf16: DeepSpeed's
    BF16 optimizer keeps a whole fp32 master; in fp32 no copy). Gradients: stages 0/1 the whole low-precision
    gradient (c P) (stage 0 in bf16 also fp32 accumulators, 4P; stage 1 an fp32 partition, 4P/N), stages 2/3 the
    fp32 partition (4P/N), which the optimizer step receives as a flattened fp32 copy (4P/N more while it runs).
    Buckets: a `reduce_bucket_size` buffer (fp32 at stage 1, the compute dtype at 2 and 3); stage 3 gathers units
    like FSDP. `offload_optimizer` moves master and moments to the host, `offload_param`
    (stage 3) the weights."""
    c, world = inputs.compute_bytes, inputs.world
    shards = world if stage >= 1 else 1
    params = c * n.total / (world if stage == 3 else 1)
    if stage == 3 and knobs.offload_param:
        params = 0.0
    master = MASTER_BYTES * n.trainable / shards if (stage >= 1 or c < 4) else 0.0
    optimizer = 0.0 if knobs.offload and stage >= 1 else master + ADAM_BYTES * n.trainable / shards
    if stage == 0:
        grads = c * n.trainable + (GRAD_FP32 * n.trainable if c < 4 else 0)
    elif stage == 1:
        grads = c * n.trainable + GRAD_FP32 * n.trainable / world
    else:
        grads = GRAD_FP32 * n.trainable / world
    bucket = 0.0 if not n.trainable or stage == 0 else knobs.reduce_bucket * (4 if stage == 1 else c)
    unit, root = shape.largest_layer_params(), shape.root_params()
    forward = c * (root + 2 * unit) if stage == 3 else 0.0
    return ModelState(params=params, grads=grads, optimizer=optimizer if n.trainable else 0.0,
                      gathered=forward + bucket, gathered_forward=forward,
                      step_copy=GRAD_FP32 * n.trainable / world if stage >= 1 else 0.0)


def megatron_local_params(shape: ModelShape, tp: int, pp: int, ep: int) -> tuple[float, float]:
    """(dense, expert) parameters of the busiest rank: L/p layers split over t, plus the embedding (first stage) or
    the output layer (last stage; a tied model keeps a copy there when p > 1), V h / t; routed experts over e * t
    (expert tensor parallelism ETP = TP)."""
    dense_layers = (shape.layers - shape.moe_layers) * shape.layer_params(False)
    moe_layers = shape.moe_layers * shape.layer_params(True)
    vocab = shape.embedding_params() + (shape.head_params() if pp == 1 else 0)
    dense = ((dense_layers + moe_layers) / pp + vocab + shape.hidden) / tp
    return dense, shape.routed_expert_params() / (pp * ep * tp)


def megatron_state(inputs: PlanInputs, knobs: Knobs, shape: ModelShape, n: Counts) -> ModelState:
    """megatron-core (rl/backends/megatron): fp32 weights (bf16 by autocast), fp32 gradient buffers (`main_grad`,
    grad_reduce_in_fp32) that persist between steps, and the distributed optimizer: megatron's table gives
    4 + 4 + 8/d bytes per parameter for fp32 weights and gradients, d the data-parallel size of the dense weights
    (world / (t p)) or of the experts (world / (t e p)). `optimizer_cpu_offload`: the moments live in host memory
    (4 + 4 on the GPU). LoRA: the base is frozen (4 bytes), the adapters train."""
    tp, pp, ep = knobs.tp, knobs.pp, knobs.ep
    dense, expert = megatron_local_params(shape, tp, pp, ep)
    share = n.trainable / n.total if n.total else 0.0
    adapters = (n.total - shape.total_params()) / (tp * pp)
    local = dense + expert + adapters
    trainable = (dense + expert) * share if not adapters else adapters * (1 if n.trainable else 0)
    dense_dp = max(inputs.world // (tp * pp), 1)
    expert_dp = max(inputs.world // (tp * ep * pp), 1)
    if adapters:
        optimizer = adam_bytes(trainable, dense_dp)
    else:
        optimizer = adam_bytes(dense * share, dense_dp) + adam_bytes(expert * share, expert_dp)
    return ModelState(params=4 * local, grads=GRAD_FP32 * trainable,
                      optimizer=0.0 if knobs.offload else optimizer, gathered=0.0, persistent_grads=True)


def model_state(inputs: PlanInputs, knobs: Knobs, shape: ModelShape, n: Counts, role: str = "policy"
                ) -> ModelState:
    """The model's state under `knobs.strategy`; `role` "ref" and "critic" take their own FSDP offload, "ref"
    DeepSpeed's eval stage."""
    if knobs.strategy in ("fsdp", "fsdp2"):
        offload = {"ref": knobs.ref_offload, "critic": knobs.critic_offload}.get(role, knobs.offload)
        return fsdp_state(inputs, knobs, shape, n, offload)
    if knobs.strategy == "deepspeed":
        return deepspeed_state(inputs, knobs, shape, n, knobs.ref_zero_stage if role == "ref" else knobs.zero_stage)
    if knobs.strategy == "megatron":
        return megatron_state(inputs, knobs, shape, n)
    raise ValueError(f"the planner has no memory model of strategy {knobs.strategy!r}")
