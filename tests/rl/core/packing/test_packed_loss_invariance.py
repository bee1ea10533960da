"""End to end: the loss assembled on packed / padded micro-batches planned across simulated data-parallel ranks
gives the same per-sequence gradients as one padded [B, T] batch."""

import itertools

import pytest
import torch

from rl.core.algorithms import LOSS_REDUCTIONS, POLICY_LOSSES, LossSettings, compute_policy_loss
from rl.core.algorithms.policy_loss import COVARIANCE_LOSSES
from rl.core.packing import pack_sequences, pad_sequences, plan_micro_batches, plan_padded_micro_batches
from tests.testing.tolerances import assert_within, network_rtol

F64 = torch.float64
LENGTHS = [9, 1, 4, 12, 2, 7, 5, 3, 11, 6]
PROMPT = 2  # the first tokens of each sequence are prompt: not in the loss


def make_sequences():
    gen = torch.Generator().manual_seed(7)
    seqs = []
    for n in LENGTHS:
        old = -torch.rand(n, generator=gen, dtype=F64) * 2
        advantage = torch.randn(1, generator=gen, dtype=F64)
        seqs.append(
            {
                "input_ids": torch.randint(0, 100, (n,), generator=gen),
                "loss_mask": torch.arange(n) >= min(PROMPT, n - 1) if n > 1 else torch.zeros(1, dtype=torch.bool),
                "advantages": advantage.expand(n).clone(),
                "old_logprobs": old,
                "ref_logprobs": old + 0.2 * torch.randn(n, generator=gen, dtype=F64),
                "new": old + 0.3 * torch.randn(n, generator=gen, dtype=F64),
            }
        )
    return seqs


def settings_for(policy_loss, reduction):
    eps = (3e-2, 4e-2) if policy_loss == "gspo" else (0.2, 0.28)
    return LossSettings(
        policy_loss_type=policy_loss,
        loss_reduction=reduction,
        eps_clip_low=eps[0],
        eps_clip_high=eps[1],
        use_kl_loss=True,
        kl_loss_coef=0.05,
        kl_estimator_type="k3",
        use_entropy_loss=True,
        entropy_loss_coef=0.01,
        max_generate_length=max(LENGTHS),
    )


def fields(seqs):
    return [{k: v for k, v in seq.items() if k != "new"} for seq in seqs]


def micro_batch_loss(settings, batch, leaves, normalizer):
    """Place the per-sequence leaf logprobs into the batch layout (a backend's forward would produce this)."""
    width = batch.slot_lengths.tolist()
    pieces = [
        torch.nn.functional.pad(leaves[i], (0, w - len(leaves[i])))
        for i, w in zip(batch.seq_index.tolist(), width, strict=True)
    ]
    logp = torch.cat(pieces) if pieces else torch.zeros(0, dtype=F64)
    loss, _ = compute_policy_loss(
        settings,
        logp,
        batch.old_logprobs,
        batch.advantages,
        batch.loss_mask,
        normalizer,
        ref_logprobs=batch.ref_logprobs,
        entropy=-(logp.exp() * logp),
        seq_ids=batch.token_seq_ids(),
        num_sequences=batch.num_sequences,
    )
    return loss


def gradients(settings, seqs, plan, build, dp_world_size):
    leaves = [seq["new"].clone().requires_grad_(True) for seq in seqs]
    whole = pack_sequences(fields(seqs))
    normalizer = settings.normalizer(
        whole.loss_mask, seq_ids=whole.token_seq_ids(), num_sequences=len(seqs), dp_world_size=dp_world_size
    )
    for rank in plan:
        for mb in rank:
            batch = build([fields(seqs)[i] for i in mb], mb)
            loss = micro_batch_loss(settings, batch, leaves, normalizer)
            if mb:  # an empty micro-batch contributes a zero loss (a real backend still runs its collectives)
                loss.backward()
            else:
                assert loss.item() == 0.0
    grads = [leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for leaf in leaves]
    return [g / dp_world_size for g in grads]  # the DP average of the per-rank sums


def reference_gradients(settings, seqs):
    """One padded [B, T] batch, the 2-D layout (rows are sequences), no packing code involved."""
    width = max(LENGTHS)
    leaves = [seq["new"].clone().requires_grad_(True) for seq in seqs]

    def stack(values, fill=0.0):
        return torch.stack([torch.nn.functional.pad(v, (0, width - len(v)), value=fill) for v in values])

    logp = stack(leaves)
    mask = stack([s["loss_mask"] for s in seqs], False)
    normalizer = settings.normalizer(mask)
    loss, _ = compute_policy_loss(
        settings,
        logp,
        stack([s["old_logprobs"] for s in seqs]),
        stack([s["advantages"] for s in seqs]),
        mask,
        normalizer,
        ref_logprobs=stack([s["ref_logprobs"] for s in seqs]),
        entropy=-(logp.exp() * logp),
    )
    loss.backward()
    return [leaf.grad for leaf in leaves]


# A token's gradient is a closed form of its own logprobs and advantage (an exp or a sigmoid, a log, the clip's
# products, the division by the normalizer and by the ranks: fewer than this many roundings, Higham's gamma_k).
TOKEN_ROUNDINGS = 64


def gradient_bound(seqs, reference):
    """Gap of two float64 computations of the per-token gradients in different layouts: each is within gamma_k of
    the magnitudes met, k the sums on a token's path (its sequence's tokens: gspo's mean log-ratio, which enters an
    exp, so the condition 1 + max|log r| carries its error into the ratio; the token's closed form), twice for two
    orders (`network_rtol`), relative to the largest |gradient| as `tolerances.gradient_gap`."""
    log_ratio = max(float((s["new"] - s["old_logprobs"]).abs().max()) for s in seqs)
    scale = max(float(g.abs().max()) for g in reference)
    return network_rtol([max(LENGTHS), TOKEN_ROUNDINGS], F64, condition=1 + log_ratio) * scale


# clip_cov and kl_cov pick tokens by a statistic of the micro-batch they see: not split-invariant by definition
@pytest.mark.parametrize(("policy_loss", "reduction"), list(itertools.product(
    [name for name in POLICY_LOSSES if name not in COVARIANCE_LOSSES], LOSS_REDUCTIONS)))
def test_packed_and_padded_micro_batches_match_one_padded_batch(policy_loss, reduction):
    settings = settings_for(policy_loss, reduction)
    seqs = make_sequences()
    reference = reference_gradients(settings, seqs)
    cases = [
        (plan_micro_batches(LENGTHS, 12, 1), pack_sequences, 1),
        (plan_micro_batches(LENGTHS, 16, 2), pack_sequences, 2),
        (plan_micro_batches(LENGTHS, 30, 3), lambda s, i: pack_sequences(s, i, pad_to_multiple_of=4), 3),
        (plan_padded_micro_batches(len(LENGTHS), 3, 2), pad_sequences, 2),
        (plan_padded_micro_batches(len(LENGTHS), 1, 4), pad_sequences, 4),  # shares 3, 3, 2, 2
    ]
    assert [] in cases[-1][0][-1], "the last plan must exercise an empty micro-batch"
    bound = gradient_bound(seqs, reference)
    for plan, build, dp in cases:
        grads = gradients(settings, seqs, plan, build, dp)
        for i, (got, want) in enumerate(zip(grads, reference, strict=True)):
            assert_within(got, want, bound, f"sequence {i}, {dp} ranks")


def test_empty_micro_batch_gives_zero_loss():
    settings = settings_for("gspo", "sequence_mean")
    normalizer = settings.normalizer(torch.ones(2, 3, dtype=torch.bool))
    loss = micro_batch_loss(
        settings, pack_sequences([]).replace(old_logprobs=torch.zeros(0, dtype=F64)), [], normalizer
    )
    assert loss.item() == 0.0
