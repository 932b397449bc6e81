"""The gradient must not depend on how a mini-batch is split (DESIGN.md, "One RL step").

1. Micro-batches: summing ``aggregate`` over 1, 2, 3 or 8 micro-batches, each normalised by the
   counts of the whole mini-batch, gives the same loss and gradient.
2. Data parallelism: 2 gloo processes, each with half of the batch (very different token counts),
   each scaling its loss by ``dp_scale()`` and averaging gradients like DDP, reproduce the
   single-process full-batch gradient.

Run: python -m pytest tests/algo/test_aggregation_invariance.py -q
"""

from __future__ import annotations

from datetime import timedelta
from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.testing import assert_close

from mathrl.algo.losses import AGG_MODES, aggregate, batch_counts, dp_scale, global_counts, policy_loss
from mathrl.registry import POLICY_LOSSES
from mathrl.train.dist import close_distributed, exit_rank


class Batch(NamedTuple):
    logprobs: torch.Tensor  # [B, T] current policy (made a leaf in each test)
    old_logprobs: torch.Tensor  # [B, T]
    advantages: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T]


def _random_batch(seed: int, batch: int = 8, length: int = 6) -> Batch:
    """Variable-length responses, including one fully masked and one full-length sequence, with
    log-ratios wide enough that some tokens hit each clip."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    lengths[0], lengths[1] = 0, length
    mask = (torch.arange(length) < lengths.unsqueeze(-1)).double()  # [B, T]
    old = -torch.rand(batch, length, generator=gen, dtype=torch.float64) * 3  # [B, T]
    logprobs = old + 0.6 * torch.randn(batch, length, generator=gen, dtype=torch.float64)
    adv = torch.randn(batch, 1, generator=gen, dtype=torch.float64).expand(batch, length) * mask
    return Batch(logprobs, old, adv, mask)


def _split_gradient(data: Batch, mode: str, n_micro: int, *, dual_clip_c=None, local_counts=False):
    """Loss and d loss / d logprobs accumulated over ``n_micro`` micro-batches (like the loop)."""
    lp = data.logprobs.clone().requires_grad_(True)
    num_tokens, num_seqs = batch_counts(data.mask)
    total = torch.zeros((), dtype=torch.float64)
    for rows in torch.arange(lp.shape[0]).tensor_split(n_micro):
        mask = data.mask[rows]
        if local_counts:  # the bug this file guards against
            num_tokens, num_seqs = batch_counts(mask)
        per_token, _ = policy_loss(
            lp[rows], data.old_logprobs[rows], data.advantages[rows], mask, dual_clip_c=dual_clip_c
        )
        loss = aggregate(
            per_token, mask, mode=mode, num_tokens=num_tokens, num_seqs=num_seqs, max_len=lp.shape[1]
        )
        loss.backward()
        total = total + loss.detach()
    return total, lp.grad


@pytest.mark.parametrize("dual_clip_c", [None, 3.0])
@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batch_split_does_not_change_gradient(mode, dual_clip_c):
    # 1, 2, 3 (uneven: 3+3+2 rows) and 8 (one row each, one of them empty) micro-batches.
    data = _random_batch(seed=0)
    ref_loss, ref_grad = _split_gradient(data, mode, 1, dual_clip_c=dual_clip_c)
    assert ref_grad.abs().sum() > 0  # the check is not vacuous
    for n_micro in (2, 3, 8):
        loss, grad = _split_gradient(data, mode, n_micro, dual_clip_c=dual_clip_c)
        assert_close(loss, ref_loss)
        assert_close(grad, ref_grad)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_local_normalisers_would_break_invariance(mode):
    # Regression guard: normalising each micro-batch by its own token/sequence count (and then
    # dividing by the number of micro-batches) is the mistake that shipped in well-known frameworks:
    # sequences in short micro-batches get more weight. Show the test above would catch it.
    data = _random_batch(seed=0)
    _, ref_grad = _split_gradient(data, mode, 1)
    _, wrong_grad = _split_gradient(data, mode, 2, local_counts=True)
    assert not torch.allclose(wrong_grad / 2, ref_grad)


# ---------------------------------------------------------------- data parallelism (2 processes)

_FEATURES, _VOCAB = 3, 6


class _DPProblem(NamedTuple):
    x: torch.Tensor  # [B, T, F] inputs of the tiny "policy"
    targets: torch.Tensor  # [B, T] sampled token ids
    old_logprobs: torch.Tensor  # [B, T]
    advantages: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T]


def _dp_model() -> torch.nn.Linear:
    torch.manual_seed(0)  # every process builds the same weights, as DDP's broadcast would
    return torch.nn.Linear(_FEATURES, _VOCAB, dtype=torch.float64)


def _dp_logprobs(model: torch.nn.Linear, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(model(x), dim=-1)  # [B, T, V]
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [B, T]


def _dp_problem() -> _DPProblem:
    """4 sequences of width 5. Rank 0 gets rows 0-1 (5 + 4 tokens), rank 1 rows 2-3 (1 + 0 tokens),
    so local and global counts differ a lot and any local normalisation would show."""
    gen = torch.Generator().manual_seed(1)
    batch, length = 4, 5
    x = torch.randn(batch, length, _FEATURES, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, _VOCAB, (batch, length), generator=gen)
    lengths = torch.tensor([5, 4, 1, 0])
    mask = (torch.arange(length) < lengths.unsqueeze(-1)).double()
    with torch.no_grad():
        current = _dp_logprobs(_dp_model(), x, targets)
    old = current + 0.5 * torch.randn(batch, length, generator=gen, dtype=torch.float64)
    adv = torch.tensor([[1.0], [-1.0], [2.0], [0.5]], dtype=torch.float64).expand(batch, length) * mask
    return _DPProblem(x, targets, old, adv, mask)


# the registered losses whose result does not depend on the split (clip_cov and kl_cov pick tokens
# within each call: docs/tricks.md); dro with a beta of its own
SPLIT_FREE_LOSSES = {"ppo_clip": {}, "gspo": {"eps_low": 0.2, "eps_high": 0.28}, "gspo_token": {}, "cispo": {},
                     "sapo": {}, "geo_mean": {}, "dppo_tv": {}, "dppo_kl": {}, "gpg": {}, "dro": {"beta": 0.1}}


def _dp_gradients(problem: _DPProblem, rows: slice, mode: str, loss_name: str = "ppo_clip") -> tuple[list[torch.Tensor], float]:
    """One rank's step: global counts, loss * dp_scale(), backward, DDP-style gradient average; returns
    the gradients and the loss summed over ranks (the whole batch's loss)."""
    model = _dp_model()
    mask = problem.mask[rows]
    num_tokens, num_seqs = global_counts(mask)
    lp = _dp_logprobs(model, problem.x[rows], problem.targets[rows])
    if loss_name == "ppo_clip":
        per_token, _ = policy_loss(lp, problem.old_logprobs[rows], problem.advantages[rows], mask)
    else:  # a registered loss, with its own aggregation where it has one
        entry = POLICY_LOSSES.get(loss_name)
        per_token, _ = entry.fn(lp, problem.old_logprobs[rows], problem.advantages[rows], mask,
                                **SPLIT_FREE_LOSSES[loss_name])
        mode = entry.agg or mode
    loss = aggregate(per_token, mask, mode=mode, num_tokens=num_tokens, num_seqs=num_seqs, max_len=5)
    (loss * dp_scale()).backward()
    grads = [p.grad for p in model.parameters()]
    total = loss.detach().clone()
    if dist.is_initialized():
        for g in grads:  # what DDP/FSDP do: all-reduce, then divide by the world size
            dist.all_reduce(g, op=dist.ReduceOp.SUM)
            g.div_(dist.get_world_size())
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return grads, total.item()


def _dp_worker(rank: int, world_size: int, init_file: str, out_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
    )
    try:
        problem = _dp_problem()
        half = problem.mask.shape[0] // world_size
        rows = slice(rank * half, (rank + 1) * half)
        results = {mode: _dp_gradients(problem, rows, mode)[0] for mode in AGG_MODES}
        results["losses"] = {name: _dp_gradients(problem, rows, "token_mean", name) for name in SPLIT_FREE_LOSSES}
        results["counts"] = global_counts(problem.mask[rows])
        results["dp_scale"] = dp_scale()
        if rank == 0:
            torch.save(results, out_file)
    except BaseException:
        dist.destroy_process_group()
        raise
    close_distributed()  # barrier, destroy, then no interpreter shutdown (train/dist.py says why)
    exit_rank(0)


@pytest.mark.slow
def test_data_parallel_matches_single_process(tmp_path):
    out_file = tmp_path / "grads.pt"
    mp.spawn(_dp_worker, args=(2, str(tmp_path / "store"), str(out_file)), nprocs=2, join=True)
    results = torch.load(out_file)

    problem = _dp_problem()
    assert results["counts"] == batch_counts(problem.mask) == (10.0, 3.0)
    assert results["dp_scale"] == 2.0
    for mode in AGG_MODES:
        expected, _ = _dp_gradients(problem, slice(None), mode)
        assert expected[0].abs().sum() > 0
        for got, want in zip(results[mode], expected):
            assert_close(got, want, msg=lambda m, mode=mode: f"{mode}: {m}")
    # every registered loss but the covariance ones: 2 ranks give the 1-process loss (within 1e-6, the
    # acceptance bound; float64 makes it ~1e-16) and gradient
    for name in SPLIT_FREE_LOSSES:
        expected, expected_loss = _dp_gradients(problem, slice(None), "token_mean", name)
        got, got_loss = results["losses"][name]
        assert expected[0].abs().sum() > 0, name
        assert abs(got_loss - expected_loss) <= 1e-6, (name, got_loss, expected_loss)
        for g, w in zip(got, expected):
            assert_close(g, w, msg=lambda m, name=name: f"{name}: {m}")
