"""Every Triton kernel with the concrete signatures the ahead-of-time build compiles (rl/kernels:triton_aot).

One entry per specialization the dispatch launches on GPU: fp32 and bf16 logits, the packing dtypes, and the fused
loss for each policy loss (with KL and entropy on, and a plain variant).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rl.kernels.sizing import MAX_BLOCK_V, pack_block, row_block
from rl.kernels.triton.logprobs_kernels import logprobs_bwd_kernel, logprobs_fwd_kernel
from rl.kernels.triton.loss_kernels import fused_loss_kernel
from rl.kernels.triton.packing_kernels import cu_seqlens_kernel, pack_kernel, position_ids_kernel, unpack_kernel


@dataclass(frozen=True)
class KernelSpec:
    name: str  # output file stem
    fn: object  # the @triton.jit function
    signature: dict[str, str]
    constexprs: dict[str, object] = field(default_factory=dict)
    num_warps: int = 4

    @property
    def entry(self) -> str:
        """The kernel's entry name in the cubin."""
        return self.fn.__name__


def _sig(fn, types: dict[str, str], constexprs: dict[str, object]) -> dict[str, str]:
    return {arg: ("constexpr" if arg in constexprs else types[arg]) for arg in fn.arg_names}


def _spec(name, fn, types, num_warps=4, **constexprs) -> KernelSpec:
    return KernelSpec(name, fn, _sig(fn, types, constexprs), constexprs, num_warps)


ROW_BLOCK, ROW_WARPS = row_block(MAX_BLOCK_V)  # what a vocabulary of 4096 or more launches


def _packing(dtype: str, pad: str, features: int) -> list[KernelSpec]:
    """Pack and unpack for rows of `features` (1: a scalar per position; 64: hidden states)."""
    common = {"cu_ptr": "*i32", "width": "i32", "feat": "i32"}
    rows, block_d = pack_block(features)
    return [
        _spec(
            f"pack_{dtype}",
            pack_kernel,
            {"padded_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", **common},
            BLOCK_T=rows,
            BLOCK_D=block_d,
        ),
        _spec(
            f"unpack_{dtype}",
            unpack_kernel,
            {"packed_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "pad_value": pad, **common},
            BLOCK_T=rows,
            BLOCK_D=block_d,
        ),
    ]


def _logprobs(dtype: str) -> list[KernelSpec]:
    row = {"logits_ptr": f"*{dtype}", "targets_ptr": "*i64", "vocab": "i32", "stride": "i64", "inv_temp": "fp32"}
    return [
        _spec(
            f"logprobs_fwd_{dtype}",
            logprobs_fwd_kernel,
            {**row, "lp_ptr": "*fp32", "ent_ptr": "*fp32", "lse_ptr": "*fp32"},
            num_warps=ROW_WARPS,
            BLOCK_V=ROW_BLOCK,
        ),
        _spec(
            f"logprobs_bwd_{dtype}",
            logprobs_bwd_kernel,
            {
                **row,
                "lse_ptr": "*fp32",
                "ent_ptr": "*fp32",
                "glp_ptr": "*fp32",
                "gent_ptr": "*fp32",
                "grad_ptr": f"*{dtype}",
            },
            num_warps=ROW_WARPS,
            BLOCK_V=ROW_BLOCK,
        ),
    ]


def _fused(dtype: str, policy: str, code: int, kl: int, with_terms: bool) -> KernelSpec:
    types = {
        name: "*fp32"
        for name in (
            "old_ptr",
            "adv_ptr",
            "ref_ptr",
            "weight_ptr",
            "mweight_ptr",
            "tweight_ptr",
            "token_loss_ptr",
            "metrics_ptr",
        )
    }
    types.update(
        {"logits_ptr": f"*{dtype}", "grad_ptr": f"*{dtype}", "targets_ptr": "*i64", "vocab": "i32", "stride": "i64"}
    )
    types.update({name: "fp32" for name in ("inv_temp", "eps_low", "eps_high", "clip_c", "kl_coef", "ent_coef")})
    suffix = "kl_entropy" if with_terms else "plain"
    return _spec(
        f"fused_loss_{policy}_{suffix}_{dtype}",
        fused_loss_kernel,
        types,
        num_warps=ROW_WARPS,
        POLICY=code,
        KL=kl,
        HAS_REF=with_terms,
        USE_KL=with_terms,
        USE_ENT=with_terms,
        BLOCK_V=ROW_BLOCK,
        ON_POLICY=False,
    )


SPECS: list[KernelSpec] = [
    _spec("cu_seqlens", cu_seqlens_kernel, {"lengths_ptr": "*i32", "cu_ptr": "*i32", "num_seqs": "i32"}, BLOCK=256),
    _spec("position_ids", position_ids_kernel, {"cu_ptr": "*i32", "out_ptr": "*i64"}, BLOCK=256),
    *_packing("fp32", "fp32", 1),
    *_packing("bf16", "fp32", 64),
    *_packing("i64", "i64", 1),
    *_logprobs("fp32"),
    *_logprobs("bf16"),
    *[
        _fused(dtype, policy, code, 3, terms)
        for dtype in ("fp32", "bf16")
        for policy, code in (("regular", 0), ("dual_clip", 1), ("cispo", 2))
        for terms in (False, True)
    ],
]
