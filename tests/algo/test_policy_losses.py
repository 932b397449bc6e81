"""The policy losses of algo.policy_loss (mathrl/algo/policy_losses.py), each against a plain-Python
reference written from its paper's formula with loops and `math`: the per-token loss, every stat, the
aggregated loss and its gradient with respect to the logprobs (the derivative worked out by hand and
written out in each reference, never autograd), in float64 to 1e-9 (the float32 stats to 1e-6).

Then what must not change a loss (splitting the rows into micro-batches, padding columns), what tells
gspo from gspo_token, clip_cov's random picks and kl_cov's top-covariance ones, the 80/20 entropy mask,
the errors and config rules that guard the losses, and (slow) 2-step trainings with every built-in loss
and with one registered from outside the package.

Run: python -m pytest tests/algo/test_policy_losses.py -q -m "not slow"
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass, field

import pytest
import torch
from rich.console import Console
from torch.testing import assert_close

from mathrl.algo.losses import aggregate, batch_counts, masked_mean
from mathrl.algo.policy_losses import PolicyLoss, top_entropy_mask, weigh
from mathrl.config import ConfigError, load_config
from mathrl.registry import POLICY_LOSSES

TOL = {"atol": 1e-9, "rtol": 1e-9}  # float64 losses and gradients
TOL32 = {"atol": 1e-6, "rtol": 1e-6}  # the stats are float32

# ----------------------------------------------------------------------------- the batch
# Three rows of 4, 5 and 3 counted tokens in a [3, 5] batch; the padding holds junk (PAD, large log
# ratios) that a masked token must never contribute, whatever it holds.
PAD = 9.0
MASK = [[1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1],
        [1, 1, 1, 0, 0]]
OLD = [[-0.70, -1.20, -0.10, -1.00, -7.0],  # log pi_old of the sampled tokens
       [-0.40, -0.90, -1.60, -1.60, -0.60],
       [-1.50, -0.30, -0.80, -7.0, -7.0]]
# log ratios log(pi / pi_old); PPO's range [1 - 0.2, 1 + 0.28] is [-0.223, 0.247] in log space:
# row 0: inside, above, below, far above; row 1: below, inside, inside, far above (ratio e^1.2 = 3.32 > the
# dual clip's 3), on-policy; row 2: above, below, far above.
LOG_RATIO = [[0.10, 0.30, -0.45, 0.80, 3.0],
             [-0.30, 0.20, -0.05, 1.20, 0.00],
             [0.35, -0.25, 0.60, 2.0, -2.0]]
LP = [[o + x for o, x in zip(ro, rx)] for ro, rx in zip(OLD, LOG_RATIO)]  # every counted logprob < 0
A_ROW = [[1.0, 1.0, 1.0, 1.0, PAD],  # one advantage per row (outcome estimators): +, -, 0
         [-0.5, -0.5, -0.5, -0.5, -0.5],
         [0.0, 0.0, 0.0, PAD, PAD]]
A_TOK = [[1.0, -0.5, 0.0, 2.0, PAD],  # one per token, both signs and 0 within a row
         [-1.0, 0.5, 1.5, -0.2, 0.0],
         [0.3, 0.0, -0.7, PAD, PAD]]
W = [[1.2, 0.7, 1.0, 0.9, PAD],  # importance weights of the policy-gradient term (rollout correction)
     [0.6, 1.4, 1.1, 0.8, 1.3],
     [1.0, 0.5, 1.5, PAD, PAD]]
ONES = [[1.0] * 5 for _ in range(3)]
ADVANTAGES = {"row": A_ROW, "token": A_TOK}


def t64(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# ----------------------------------------------------------------------------- plain-Python references
def clip(v: float, lo: float, hi: float) -> float:
    return min(max(v, lo), hi)


def sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def sign(v: float) -> float:
    return float(v > 0) - float(v < 0)


def tokens_of(mask, i: int) -> list[int]:
    return [t for t, m in enumerate(mask[i]) if m]


def counted(mask) -> list[tuple[int, int]]:
    """(row, token) of every counted token, row-major."""
    return [(i, t) for i in range(len(mask)) for t in tokens_of(mask, i)]


def num_seqs(mask) -> int:
    return sum(1 for row in mask if any(row))


@dataclass
class Ref:
    """A reference's per-token loss, per-token stats and the gradient of the aggregated loss, [B][T] lists."""

    loss: list[list[float]]
    grad: list[list[float]]
    stats: dict[str, list[list[float]]] = field(default_factory=dict)

    @classmethod
    def empty(cls, mask, *stats: str) -> Ref:
        zeros = lambda: [[0.0] * len(mask[0]) for _ in mask]  # noqa: E731
        return cls(zeros(), zeros(), {k: zeros() for k in stats})


STANDARD = ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "pg_clipfrac_low", "pg_clipfrac_high")
SEQ = ("seq_ratio_mean", "seq_ratio_min", "seq_ratio_max", "seq_clipfrac")  # a sequence ratio's, on each of its tokens


def sides(out: Ref, i: int, t: int, clipped: bool, a: float) -> None:
    """pg_clipfrac_low / _high: a clipped token where A < 0 (the lower bound took effect) / A > 0 (the upper)."""
    out.stats["pg_clipfrac_low"][i][t] = float(clipped and a < 0)
    out.stats["pg_clipfrac_high"][i][t] = float(clipped and a > 0)


def seq_stats(out: Ref, i: int, row: list[int], s: float, clipped: bool) -> None:
    for t in row:
        out.stats["seq_ratio_mean"][i][t] = out.stats["seq_ratio_min"][i][t] = out.stats["seq_ratio_max"][i][t] = s
        out.stats["seq_clipfrac"][i][t] = float(clipped)


def ref_aggregate(loss, mask, mode: str) -> float:
    """losses.aggregate's definitions, written out: token_mean sum/N; seq_mean_token_mean sum_i mean_t / S."""
    if mode == "token_mean":
        return sum(loss[i][t] for i, t in counted(mask)) / len(counted(mask))
    assert mode == "seq_mean_token_mean"
    rows = [tokens_of(mask, i) for i in range(len(mask))]
    return sum(sum(loss[i][t] for t in row) / len(row) for i, row in enumerate(rows) if row) / num_seqs(mask)


def ref_ppo_clip(lp, old, adv, mask, w, *, eps_low, eps_high, dual_clip_c=None) -> Ref:
    """PPO (Schulman et al. 2017, eq. 7) with clip-higher, and dual clip (Ye et al. 2020) where A < 0:
        l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), then min(l, -c A);  token_mean.
    dL/dlp = -A r w / N where the unclipped term is the max and the dual bound is not hit, else 0."""
    out, n = Ref.empty(mask, *STANDARD), len(counted(mask))
    for i, t in counted(mask):
        a, x = adv[i][t], lp[i][t] - old[i][t]
        r = math.exp(clip(x, -20.0, 20.0))
        unclipped, clipped = -a * r, -a * clip(r, 1 - eps_low, 1 + eps_high)
        loss, dloss = (clipped, 0.0) if clipped > unclipped else (unclipped, -a * r)
        out.stats["pg_clipfrac"][i][t] = float(clipped > unclipped)
        sides(out, i, t, clipped > unclipped, a)
        if dual_clip_c is not None and a < 0 and loss > -dual_clip_c * a:
            loss, dloss = -dual_clip_c * a, 0.0
            out.stats["pg_clipfrac_lower"][i][t] = 1.0
        out.loss[i][t], out.grad[i][t] = loss * w[i][t], dloss * w[i][t] / n
        out.stats["ppo_kl"][i][t] = -x
    return out


def ref_gspo(lp, old, adv, mask, w, *, eps_low, eps_high) -> Ref:
    """GSPO (Zheng et al. 2025, eq. 5-7): s_i = exp(mean_t log r_it), A_i = mean_t A_it,
        l_i = max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high)) on each of row i's tokens (times w_it);
    seq_mean_token_mean sums l_i wbar_i / S, so dL/dlp_it = -A_i s_i wbar_i / len_i / S unless clipped
    (d s_i / d lp_it = s_i / len_i: every token of a row gets the same gradient)."""
    out, s_count = Ref.empty(mask, *STANDARD, *SEQ), num_seqs(mask)
    for i in range(len(mask)):
        row = tokens_of(mask, i)
        if not row:
            continue
        n_i = len(row)
        s = math.exp(min(sum(lp[i][t] - old[i][t] for t in row) / n_i, 10.0))
        a = sum(adv[i][t] for t in row) / n_i
        seq_stats(out, i, row, s, -a * clip(s, 1 - eps_low, 1 + eps_high) > -a * s)
        w_bar = sum(w[i][t] for t in row) / n_i
        unclipped, clipped = -a * s, -a * clip(s, 1 - eps_low, 1 + eps_high)
        loss, dloss = (clipped, 0.0) if clipped > unclipped else (unclipped, -a * s / n_i)
        for t in row:
            out.loss[i][t], out.grad[i][t] = loss * w[i][t], dloss * w_bar / s_count
            out.stats["pg_clipfrac"][i][t] = float(clipped > unclipped)
            sides(out, i, t, clipped > unclipped, a)
            out.stats["ppo_kl"][i][t] = old[i][t] - lp[i][t]
    return out


def ref_gspo_token(lp, old, adv, mask, w, *, eps_low, eps_high) -> Ref:
    """GSPO-token (Zheng et al. 2025, eq. 13-14): s_it has s_i's value and d s_it / d lp_it = s_i (its own
    token only), l_it = max(-A_it s_i, -A_it clip(s_i)) w_it;  seq_mean_token_mean:
    dL/dlp_it = -A_it s_i w_it / len_i / S unless clipped."""
    out, s_count = Ref.empty(mask, *STANDARD, *SEQ), num_seqs(mask)
    for i in range(len(mask)):
        row = tokens_of(mask, i)
        if not row:
            continue
        n_i = len(row)
        s = math.exp(min(sum(lp[i][t] - old[i][t] for t in row) / n_i, 10.0))
        a_row = sum(adv[i][t] for t in row) / n_i  # the row is clipped as gspo's would be
        seq_stats(out, i, row, s, -a_row * clip(s, 1 - eps_low, 1 + eps_high) > -a_row * s)
        for t in row:
            a = adv[i][t]
            unclipped, clipped = -a * s, -a * clip(s, 1 - eps_low, 1 + eps_high)
            loss, dloss = (clipped, 0.0) if clipped > unclipped else (unclipped, -a * s)
            out.loss[i][t], out.grad[i][t] = loss * w[i][t], dloss * w[i][t] / n_i / s_count
            out.stats["pg_clipfrac"][i][t] = float(clipped > unclipped)
            sides(out, i, t, clipped > unclipped, a)
            out.stats["ppo_kl"][i][t] = old[i][t] - lp[i][t]
    return out


def ref_cispo(lp, old, adv, mask, w, *, eps_low, eps_high) -> Ref:
    """CISPO (MiniMax-M1, eq. 4-5): l = -sg[clip(r)] A lp w;  token_mean: dL/dlp = -clip(r) A w / N."""
    out, n = Ref.empty(mask, *STANDARD), len(counted(mask))
    for i, t in counted(mask):
        a, x = adv[i][t], lp[i][t] - old[i][t]
        r = math.exp(x)
        c = clip(r, 1 - eps_low, 1 + eps_high)
        out.loss[i][t], out.grad[i][t] = -c * a * lp[i][t] * w[i][t], -c * a * w[i][t] / n
        out.stats["pg_clipfrac"][i][t] = float(c != r)
        out.stats["pg_clipfrac_low"][i][t], out.stats["pg_clipfrac_high"][i][t] = float(r < 1 - eps_low), float(r > 1 + eps_high)
        out.stats["ppo_kl"][i][t] = -x
    return out


def ref_sapo(lp, old, adv, mask, w, *, tau_pos, tau_neg) -> Ref:
    """SAPO (Gao et al. 2025, eq. 6): l = -sigmoid(tau (r - 1)) 4 / tau A w, tau = tau_pos if A > 0 else
    tau_neg;  d/dr [sigmoid(tau (r-1)) 4 / tau] = 4 s (1 - s), dr/dlp = r, seq_mean_token_mean:
    dL/dlp_it = -4 s (1 - s) r A w / len_i / S."""
    out, s_count = Ref.empty(mask, *STANDARD), num_seqs(mask)
    for i, t in counted(mask):
        a, x = adv[i][t], lp[i][t] - old[i][t]
        r, tau = math.exp(x), (tau_pos if a > 0 else tau_neg)
        s = sigmoid(tau * (r - 1.0))
        out.loss[i][t] = -s * 4.0 / tau * a * w[i][t]
        out.grad[i][t] = -4.0 * s * (1.0 - s) * r * a * w[i][t] / len(tokens_of(mask, i)) / s_count
        out.stats["ppo_kl"][i][t] = -x
    return out


def ref_geo_mean(lp, old, adv, mask, w, *, eps_low, eps_high) -> Ref:
    """GMPO (Zhao et al. 2025, eq. 4): q_it = sgn(A) min(sgn(A) x, sgn(A) clip(x, -eps_low, eps_high)),
        l_i = -A_i exp(mean_t q_it) G_i,  A_i = mean_t A_it,  G_i = exp(mean_t log(w_it + 1e-10)),
    on each of row i's tokens; seq_mean_token_mean sums l_i / S, and dq/dx is 1 on the unclipped side
    (0 where the clip is the pessimistic side, or A = 0), so dL/dlp_it = l_i dq_it/dx / len_i / S."""
    out, s_count = Ref.empty(mask, *STANDARD, *SEQ), num_seqs(mask)
    for i in range(len(mask)):
        row = tokens_of(mask, i)
        if not row:
            continue
        n_i, q, dq = len(row), {}, {}
        for t in row:
            x, sg = lp[i][t] - old[i][t], sign(adv[i][t])
            c = clip(x, -eps_low, eps_high)
            q[t] = sg * min(sg * x, sg * c)
            dq[t] = 1.0 if sg != 0 and (c == x or sg * x < sg * c) else 0.0
            clipped = float(c != x)
            out.stats["pg_clipfrac"][i][t] = clipped * (adv[i][t] > 0)
            out.stats["pg_clipfrac_lower"][i][t] = clipped * (adv[i][t] < 0)
            sides(out, i, t, q[t] != x, adv[i][t])  # the bound on the advantage's side took effect
            out.stats["ppo_kl"][i][t] = -x
        x_mean = sum(lp[i][t] - old[i][t] for t in row) / n_i
        seq_stats(out, i, row, math.exp(x_mean), any(q[t] != lp[i][t] - old[i][t] for t in row))
        a = sum(adv[i][t] for t in row) / n_i
        g = math.exp(sum(math.log(w[i][t] + 1e-10) for t in row) / n_i)
        loss = -a * math.exp(sum(q.values()) / n_i) * g
        for t in row:
            out.loss[i][t], out.grad[i][t] = loss, loss * dq[t] / n_i / s_count
    return out


def _ref_dppo(lp, old, adv, mask, w, valid, trunc_c) -> Ref:
    """DPPO (arXiv 2602.04879): l = -A min(r, C) lp valid w with the weight and the mask stopped;
    token_mean: dL/dlp = -A min(r, C) valid w / N."""
    out, n = Ref.empty(mask, *STANDARD), len(counted(mask))
    for i, t in counted(mask):
        a, x = adv[i][t], lp[i][t] - old[i][t]
        r, v = math.exp(x), float(valid(i, t))
        out.loss[i][t] = -a * min(r, trunc_c) * lp[i][t] * v * w[i][t]
        out.grad[i][t] = -a * min(r, trunc_c) * v * w[i][t] / n
        out.stats["pg_clipfrac"][i][t] = 1.0 - v
        out.stats["pg_clipfrac_low"][i][t], out.stats["pg_clipfrac_high"][i][t] = (1.0 - v) * (a <= 0), (1.0 - v) * (a > 0)
        out.stats["pg_clipfrac_lower"][i][t] = float(r > trunc_c) * v
        out.stats["ppo_kl"][i][t] = -x
    return out


def ref_dppo_tv(lp, old, adv, mask, w, *, delta_low, delta_high, trunc_c) -> Ref:
    """DPPO-Binary-TV: valid = p - p_old <= delta_high where A > 0, p - p_old >= -delta_low elsewhere."""
    def valid(i, t):
        diff = math.exp(lp[i][t]) - math.exp(old[i][t])
        return diff <= delta_high if adv[i][t] > 0 else diff >= -delta_low
    return _ref_dppo(lp, old, adv, mask, w, valid, trunc_c)


def ref_dppo_kl(lp, old, adv, mask, w, *, delta_low, delta_high, trunc_c) -> Ref:
    """DPPO-Binary-KL: D = KL(Bernoulli(p_old) || Bernoulli(p)); valid = D <= delta_high or p <= p_old where
    A > 0, D <= delta_low or p >= p_old elsewhere (only the harmful direction is bounded)."""
    def valid(i, t):
        p, po = math.exp(lp[i][t]), math.exp(old[i][t])
        d = po * (old[i][t] - lp[i][t]) + (1 - po) * math.log((1 - po + 1e-8) / (1 - p + 1e-8))
        return (d <= delta_high or p <= po) if adv[i][t] > 0 else (d <= delta_low or p >= po)
    return _ref_dppo(lp, old, adv, mask, w, valid, trunc_c)


def covariances(lp, adv, mask) -> dict[tuple[int, int], float]:
    """(A - mean A)(lp - mean lp) over the counted tokens (Cui et al. 2025, eq. 9)."""
    pos = counted(mask)
    mean_a = sum(adv[i][t] for i, t in pos) / len(pos)
    mean_lp = sum(lp[i][t] for i, t in pos) / len(pos)
    return {(i, t): (adv[i][t] - mean_a) * (lp[i][t] - mean_lp) for i, t in pos}


def clip_cov_candidates(lp, old, adv, mask, *, eps_low, eps_high, cov_lb, cov_ub) -> list[tuple[int, int]]:
    """Counted tokens the ratio clip leaves alone, with covariance in (lb, ub), row-major."""
    cov = covariances(lp, adv, mask)
    out = []
    for i, t in counted(mask):
        a, r = adv[i][t], math.exp(lp[i][t] - old[i][t])
        if not -a * clip(r, 1 - eps_low, 1 + eps_high) > -a * r and cov_lb < cov[i, t] < cov_ub:
            out.append((i, t))
    return out


def ref_clip_cov(lp, old, adv, mask, w, *, eps_low, eps_high, cov_ratio, cov_lb, cov_ub) -> Ref:
    """Clip-Cov (Cui et al. 2025, §4.2): PPO's clipped loss, 0 on the picked tokens. With no more
    candidates than picks (max(1, int(ratio N))) every candidate is picked, whatever the permutation."""
    cands = clip_cov_candidates(lp, old, adv, mask, eps_low=eps_low, eps_high=eps_high, cov_lb=cov_lb, cov_ub=cov_ub)
    assert len(cands) <= max(1, int(cov_ratio * len(counted(mask)))), "the reference needs every candidate picked"
    out = ref_ppo_clip(lp, old, adv, mask, w, eps_low=eps_low, eps_high=eps_high)
    out.stats["pg_clipfrac"] = [[0.0] * len(mask[0]) for _ in mask]  # verl's clip_cov reports the picks here
    out.stats["cov_selected_frac"] = [[0.0] * len(mask[0]) for _ in mask]
    for i, t in cands:
        out.loss[i][t] = out.grad[i][t] = 0.0
        out.stats["pg_clipfrac"][i][t] = out.stats["cov_selected_frac"][i][t] = 1.0
    return out


def kl_cov_picks(lp, adv, mask, cov_ratio) -> list[tuple[int, int]]:
    """The max(1, int(ratio N)) counted tokens of largest covariance."""
    cov = covariances(lp, adv, mask)
    k = max(1, int(len(cov) * cov_ratio))
    return sorted(sorted(cov, key=lambda pos: -cov[pos])[:k])


def ref_kl_cov(lp, old, adv, mask, w, *, cov_ratio, kl_coef) -> Ref:
    """KL-Cov (Cui et al. 2025, §4.2): l = (-A r + [picked] kl_coef |x|) w;  token_mean:
    dL/dlp = (-A r + [picked] kl_coef sgn(x)) w / N. Its ppo_kl stat is |x| (as verl's)."""
    picked = set(kl_cov_picks(lp, adv, mask, cov_ratio))
    out, n = Ref.empty(mask, *STANDARD, "cov_selected_frac"), len(counted(mask))
    for i, t in counted(mask):
        a, x = adv[i][t], lp[i][t] - old[i][t]
        r, p = math.exp(x), float((i, t) in picked)
        out.loss[i][t] = (-a * r + p * kl_coef * abs(x)) * w[i][t]
        out.grad[i][t] = (-a * r + p * kl_coef * sign(x)) * w[i][t] / n
        out.stats["ppo_kl"][i][t], out.stats["cov_selected_frac"][i][t] = abs(x), p
    return out


def ref_gpg(lp, old, adv, mask, w) -> Ref:
    """GPG (Chu et al. 2025, eq. 6): l = -A lp w;  token_mean: dL/dlp = -A w / N."""
    out, n = Ref.empty(mask, "ppo_kl"), len(counted(mask))
    for i, t in counted(mask):
        out.loss[i][t], out.grad[i][t] = -adv[i][t] * lp[i][t] * w[i][t], -adv[i][t] * w[i][t] / n
        out.stats["ppo_kl"][i][t] = old[i][t] - lp[i][t]
    return out


def ref_dro(lp, old, adv, mask, w, *, beta) -> Ref:
    """DRO (Richemond et al. 2024): l = -(A lp - beta / 2 x^2) w;  token_mean: dL/dlp = -(A - beta x) w / N."""
    out, n = Ref.empty(mask, "ppo_kl"), len(counted(mask))
    for i, t in counted(mask):
        a, x = adv[i][t], lp[i][t] - old[i][t]
        out.loss[i][t] = -(a * lp[i][t] - 0.5 * beta * x * x) * w[i][t]
        out.grad[i][t] = -(a - beta * x) * w[i][t] / n
        out.stats["ppo_kl"][i][t] = -x
    return out


# ----------------------------------------------------------------------------- the table
CLIP = {"eps_low": 0.2, "eps_high": 0.28}
# (id, registered name, hyperparameters, reference, why)
CASES = [
    ("ppo_clip", "ppo_clip", {**CLIP, "dual_clip_c": None}, ref_ppo_clip, "clip-higher only"),
    ("ppo_clip_dual", "ppo_clip", {**CLIP, "dual_clip_c": 3.0}, ref_ppo_clip,
     "row 1 token 3 (ratio 3.32 > 3, A < 0) takes the dual bound"),
    ("gspo", "gspo", {"eps_low": 3e-4, "eps_high": 4e-4}, ref_gspo, "the paper's tiny range: row 0 clipped, row 1 not"),
    ("gspo_token", "gspo_token", {"eps_low": 3e-4, "eps_high": 4e-4}, ref_gspo_token, "GSPO-token, the same range"),
    ("cispo", "cispo", CLIP, ref_cispo, "clipped weights above and below, every token keeps its gradient"),
    ("sapo", "sapo", {"tau_pos": 1.0, "tau_neg": 1.05}, ref_sapo, "the paper's temperatures"),
    ("geo_mean", "geo_mean", CLIP, ref_geo_mean, "log-space clip [-0.2, 0.28]: both sides hit"),
    ("dppo_tv", "dppo_tv", {"delta_low": 0.15, "delta_high": 0.2, "trunc_c": 3.0}, ref_dppo_tv,
     "masks on both sides (row 0 token 3: p - p_old = 0.45; row 1 token 0: -0.17), one truncated weight"),
    ("dppo_kl", "dppo_kl", {"delta_low": 0.05, "delta_high": 0.2, "trunc_c": 3.0}, ref_dppo_kl,
     "binary KL 0.495 above 0.2 where A > 0 and 0.0615 above 0.05 where A < 0"),
    ("clip_cov", "clip_cov", {**CLIP, "cov_ratio": 0.25, "cov_lb": 0.05, "cov_ub": 0.5}, ref_clip_cov,
     "2-3 candidates, 3 picks: every candidate is cut"),
    ("kl_cov", "kl_cov", {"cov_ratio": 0.25, "kl_coef": 0.5}, ref_kl_cov, "the top 3 of 12 tokens penalised"),
    ("gpg", "gpg", {}, ref_gpg, "no ratio at all"),
    ("dro", "dro", {"beta": 0.1}, ref_dro, "quadratic log-ratio penalty"),
]
CASE_IDS = [c[0] for c in CASES]


def test_the_table_covers_every_registered_loss():
    assert {c[1] for c in CASES} == set(POLICY_LOSSES.names())


@dataclass
class Run:
    token_loss: torch.Tensor  # [B, T]
    stats: dict[str, torch.Tensor]
    loss: torch.Tensor  # [] aggregated
    grad: torch.Tensor  # [B, T] d loss / d logprobs


def run(name: str, kwargs: dict, lp, old, adv, mask, weights=None, *, seed: int = 0,
        counts: tuple[float, float] | None = None) -> Run:
    """The registered loss on these tensors, aggregated as pg_term does (its own mode or token_mean)."""
    entry = POLICY_LOSSES.get(name)
    kwargs = dict(kwargs)
    if entry.needs_generator:
        kwargs["generator"] = torch.Generator().manual_seed(seed)
    lp = lp.clone().requires_grad_(True)
    token_loss, stats = entry.fn(lp, old, adv, mask, weights=weights, **kwargs)
    num_tokens, num_seqs_ = counts or batch_counts(mask)
    loss = aggregate(token_loss, mask, mode=entry.agg or "token_mean", num_tokens=num_tokens, num_seqs=num_seqs_)
    (grad,) = torch.autograd.grad(loss, lp)
    return Run(token_loss.detach(), stats, loss.detach(), grad)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("adv_kind", ["row", "token"])
@pytest.mark.parametrize("case_id,name,kwargs,reference,why", CASES, ids=CASE_IDS)
def test_loss_stats_and_gradient_match_the_papers_formula(case_id, name, kwargs, reference, why, adv_kind, weighted):
    adv, w = ADVANTAGES[adv_kind], (W if weighted else ONES)
    ref = reference(LP, OLD, adv, MASK, w, **kwargs)
    got = run(name, kwargs, t64(LP), t64(OLD), t64(adv), t64(MASK), t64(W) if weighted else None)
    assert_close(got.token_loss, t64(ref.loss), **TOL, msg=why)
    mode = POLICY_LOSSES.get(name).agg or "token_mean"
    assert_close(got.loss, torch.tensor(ref_aggregate(ref.loss, MASK, mode), dtype=torch.float64), **TOL, msg=why)
    assert_close(got.grad, t64(ref.grad), **TOL, msg=why)
    assert set(got.stats) == set(ref.stats), why
    for key, expected in ref.stats.items():
        stat = got.stats[key]
        assert stat.shape == (3, 5) and not stat.requires_grad, key
        assert_close(stat.double(), t64(expected), **TOL32, msg=f"{key}: {why}")
        mean = sum(expected[i][t] for i, t in counted(MASK)) / len(counted(MASK))
        assert masked_mean(stat.double(), t64(MASK)).item() == pytest.approx(mean, abs=1e-6), key


def test_the_fixture_exercises_every_branch():
    # The comparison above means little if a clip never fires: count what each reference did.
    ppo = ref_ppo_clip(LP, OLD, A_ROW, MASK, ONES, **CLIP, dual_clip_c=3.0)
    assert sum(map(sum, ppo.stats["pg_clipfrac"])) == 3 and sum(map(sum, ppo.stats["pg_clipfrac_lower"])) == 1
    assert {v for row in ref_gspo(LP, OLD, A_TOK, MASK, ONES, eps_low=3e-4, eps_high=4e-4).stats["pg_clipfrac"]
            for v in row} == {0.0, 1.0}
    geo = ref_geo_mean(LP, OLD, A_TOK, MASK, ONES, **CLIP)
    assert sum(map(sum, geo.stats["pg_clipfrac"])) > 0 and sum(map(sum, geo.stats["pg_clipfrac_lower"])) > 0
    for ref, lower in ((ref_dppo_tv(LP, OLD, A_ROW, MASK, ONES, delta_low=0.15, delta_high=0.2, trunc_c=3.0), 1),
                       (ref_dppo_kl(LP, OLD, A_ROW, MASK, ONES, delta_low=0.05, delta_high=0.2, trunc_c=3.0), 1)):
        # masked: row 0 token 3 (A > 0, p rose too far), row 1 token 0 and row 2 token 1 (A <= 0, p fell too far)
        assert sum(map(sum, ref.stats["pg_clipfrac"])) == 3 and sum(map(sum, ref.stats["pg_clipfrac_lower"])) == lower
    for adv in (A_ROW, A_TOK):
        assert 2 <= len(clip_cov_candidates(LP, OLD, adv, MASK, **CLIP, cov_lb=0.05, cov_ub=0.5)) <= 3


# ----------------------------------------------------------------------------- literal values, by hand
# (id, hyperparameters, advantages, (row, token), token loss, gradient of the aggregated loss, why).
# N = 12 counted tokens, S = 3 rows; row lengths 4, 5, 3.
HAND = [
    ("ppo_clip", {**CLIP, "dual_clip_c": None}, A_ROW, (0, 1), -1.28, 0.0,
     "ratio e^0.3 = 1.34986 > 1.28 with A = +1: clipped to -1.28, no gradient"),
    ("ppo_clip", {**CLIP, "dual_clip_c": 3.0}, A_ROW, (1, 3), 1.5, 0.0,
     "ratio e^1.2 = 3.32012, A = -0.5: -A r = 1.66006 > dual bound -cA = 1.5, which wins; no gradient"),
    ("ppo_clip", {**CLIP, "dual_clip_c": 3.0}, A_ROW, (0, 2), -0.637628, -0.637628 / 12,
     "ratio e^-0.45 = 0.637628 < 0.8 but A > 0: the unclipped term is the min, -A r / N"),
    ("gspo", {"eps_low": 3e-4, "eps_high": 4e-4}, A_ROW, (1, 2), 0.616839, 0.5 * 1.233678 / 5 / 3,
     "row 1: mean log ratio 1.05 / 5 = 0.21, s = e^0.21 = 1.233678, A = -0.5: 0.616839 on every token; "
     "1.2337 > 1.0004 but A < 0 so not clipped; gradient -A s / len / S"),
    ("gspo", {"eps_low": 3e-4, "eps_high": 4e-4}, A_ROW, (0, 0), -1.0004, 0.0,
     "row 0: mean log ratio 0.75 / 4 = 0.1875, s = 1.20623 > 1.0004 with A = +1: clipped, -1.0004"),
    ("gspo_token", {"eps_low": 3e-4, "eps_high": 4e-4}, A_TOK, (0, 3), -2.0008, 0.0,
     "row 0's s = 1.20623 clipped to 1.0004 for A = +2: -2.0008"),
    ("gspo_token", {"eps_low": 3e-4, "eps_high": 4e-4}, A_TOK, (0, 1), 0.603115, 0.5 * 1.206230 / 4 / 3,
     "A = -0.5 on the same row: unclipped, 0.5 s = 0.603115, gradient -A s / len / S"),
    ("cispo", CLIP, A_ROW, (0, 1), 1.152, -1.28 / 12,
     "ratio 1.34986 clipped to 1.28: -1.28 x 1 x lp(-0.9) = 1.152; the gradient stays, -1.28 A / N"),
    ("sapo", {"tau_pos": 1.0, "tau_neg": 1.05}, A_ROW, (1, 4), 0.952381, 0.5 / 15,
     "on-policy, A = -0.5: sigmoid(0) 4 / 1.05 = 1.904762, loss 0.952381; gradient -4 (1/4) r A / (5 x 3)"),
    ("geo_mean", CLIP, A_ROW, (0, 0), -1.053903, -1.053903 / 4 / 3,
     "row 0, A = +1: log ratios 0.1, 0.3 -> 0.28, -0.45 (kept: the min), 0.8 -> 0.28; mean 0.0525, "
     "-e^0.0525 = -1.053903; tokens 0 and 2 carry l / len / S"),
    ("geo_mean", CLIP, A_ROW, (0, 1), -1.053903, 0.0, "the clipped token 1 of the same row: no gradient"),
    ("dppo_tv", {"delta_low": 0.15, "delta_high": 0.2, "trunc_c": 3.0}, A_ROW, (1, 3), -0.6, 1.5 / 12,
     "A = -0.5, ratio 3.32 truncated to 3, p rose (valid): 0.5 x 3 x lp(-0.4) = -0.6; gradient -A 3 / N"),
    ("dppo_tv", {"delta_low": 0.15, "delta_high": 0.2, "trunc_c": 3.0}, A_ROW, (0, 3), 0.0, 0.0,
     "A > 0, p - p_old = e^-0.2 - e^-1 = 0.450852 > 0.2: masked out"),
    ("dppo_kl", {"delta_low": 0.05, "delta_high": 0.2, "trunc_c": 3.0}, A_ROW, (0, 3), 0.0, 0.0,
     "A > 0, p > p_old, binary KL = e^-1 (-0.8) + (1 - e^-1) ln((1 - e^-1) / (1 - e^-0.2)) = 0.495254 > 0.2"),
    ("dppo_kl", {"delta_low": 0.05, "delta_high": 0.2, "trunc_c": 3.0}, A_ROW, (1, 1), -0.5 * 1.221403 * 0.7,
     0.5 * 1.221403 / 12, "A = -0.5, p rose: valid; -A r lp = 0.5 x 1.221403 x -0.7"),
    ("clip_cov", {**CLIP, "cov_ratio": 0.25, "cov_lb": 0.05, "cov_ub": 0.5}, A_ROW, (0, 2), 0.0, 0.0,
     "cov (1 - 0.125)(-0.55 + 0.6833) = 0.117 in (0.05, 0.5), unclipped: picked, its -0.637628 is cut"),
    ("kl_cov", {"cov_ratio": 0.25, "kl_coef": 0.5}, A_ROW, (1, 2), 0.500615, (0.475615 - 0.5) / 12,
     "largest covariance: -A r + 0.5 |x| = 0.5 e^-0.05 + 0.025 = 0.500615; gradient (-A r + 0.5 sgn x) / N"),
    ("gpg", {}, A_ROW, (0, 0), 0.6, -1.0 / 12, "-A lp = 0.6, gradient -A / N"),
    ("dro", {"beta": 0.1}, A_ROW, (1, 3), -0.128, 0.62 / 12,
     "-(A lp - beta/2 x^2) = -(0.2 - 0.05 x 1.44) = -0.128; gradient -(A - beta x) / N = 0.62 / 12"),
]


@pytest.mark.parametrize("name,kwargs,adv,pos,loss,grad,why", HAND, ids=[f"{h[0]}-row{h[3][0]}-tok{h[3][1]}" for h in HAND])
def test_hand_computed_values(name, kwargs, adv, pos, loss, grad, why):
    got = run(name, kwargs, t64(LP), t64(OLD), t64(adv), t64(MASK))
    assert got.token_loss[pos].item() == pytest.approx(loss, abs=1e-6), why
    assert got.grad[pos].item() == pytest.approx(grad, abs=1e-7), why


def test_every_loss_has_a_hand_computed_value():
    assert {h[0] for h in HAND} == set(POLICY_LOSSES.names())


# ----------------------------------------------------------------------------- invariances
def split_run(name, kwargs, lp, old, adv, mask, weights, cuts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The aggregated loss summed over micro-batches of rows, each normalised by the WHOLE batch's counts,
    and the gradient stitched back together."""
    counts, edges = batch_counts(mask), [0, *cuts, mask.shape[0]]
    total, grads = torch.zeros((), dtype=torch.float64), []
    for lo, hi in zip(edges, edges[1:]):
        part = run(name, kwargs, lp[lo:hi], old[lo:hi], adv[lo:hi], mask[lo:hi],
                   None if weights is None else weights[lo:hi], counts=counts)
        total, grads = total + part.loss, [*grads, part.grad]
    return total, torch.cat(grads)


SPLITTABLE = [c for c in CASES if c[1] not in ("clip_cov", "kl_cov")]


@pytest.mark.parametrize("cuts", [[1], [2], [1, 2]], ids=["1+2", "2+1", "1+1+1"])
@pytest.mark.parametrize("case_id,name,kwargs,reference,why", SPLITTABLE, ids=[c[0] for c in SPLITTABLE])
def test_micro_batches_of_rows_sum_to_the_whole(case_id, name, kwargs, reference, why, cuts):
    # Every normaliser is the whole batch's and every term is per row (no row is split), so the split
    # cannot change the loss or the gradient (STYLE.md rule 12).
    args = (t64(LP), t64(OLD), t64(A_TOK), t64(MASK), t64(W))
    whole = run(name, kwargs, *args)
    total, grad = split_run(name, kwargs, *args, cuts)
    assert_close(total, whole.loss, **TOL)
    assert_close(grad, whole.grad, **TOL)


def test_clip_cov_split_does_not_matter_when_every_candidate_is_picked():
    # clip_cov's covariance is centred, and its picks counted, per call (per micro-batch, as verl's). With
    # bounds that admit every unclipped token and a ratio of 1, every call picks all its candidates, so the
    # split changes nothing; with fewer picks than candidates it would (the picks are per call).
    kwargs = {**CLIP, "cov_ratio": 1.0, "cov_lb": -1e9, "cov_ub": 1e9}
    args = (t64(LP), t64(OLD), t64(A_TOK), t64(MASK), t64(W))
    whole = run("clip_cov", kwargs, *args)
    for cuts in ([1], [2], [1, 2]):
        total, grad = split_run("clip_cov", kwargs, *args, cuts)
        assert_close(total, whole.loss, **TOL)
        assert_close(grad, whole.grad, **TOL)


def test_kl_cov_picks_per_call():
    # kl_cov picks the top max(1, int(ratio x n)) of each call's n tokens by covariance centred on that
    # call's tokens (as verl, per micro-batch): the split can change which tokens are penalised.
    # (Per-token advantages: a lone row with one advantage has every covariance 0, a tie.)
    kwargs = {"cov_ratio": 0.25, "kl_coef": 0.5}
    whole = run("kl_cov", kwargs, t64(LP), t64(OLD), t64(A_TOK), t64(MASK))
    assert picked(whole) == kl_cov_picks(LP, A_TOK, MASK, 0.25)
    halves = []
    for lo, hi in ((0, 1), (1, 3)):
        part = run("kl_cov", kwargs, t64(LP[lo:hi]), t64(OLD[lo:hi]), t64(A_TOK[lo:hi]), t64(MASK[lo:hi]))
        assert picked(part) == kl_cov_picks(LP[lo:hi], A_TOK[lo:hi], MASK[lo:hi], 0.25)
        halves += [(i + lo, t) for i, t in picked(part)]
    assert picked(whole) == [(0, 0), (0, 1), (0, 3)] and halves == [(0, 3), (1, 1), (1, 4)]


def picked(r: Run | dict[str, torch.Tensor]) -> list[tuple[int, int]]:
    """The tokens clip_cov or kl_cov picked (its cov_selected_frac stat), row-major."""
    stats = r.stats if isinstance(r, Run) else r
    return [tuple(p) for p in torch.nonzero(stats["cov_selected_frac"]).tolist()]


@pytest.mark.parametrize("case_id,name,kwargs,reference,why", CASES, ids=CASE_IDS)
def test_padding_columns_change_nothing(case_id, name, kwargs, reference, why):
    # Two more masked columns of junk (logprob above 0, huge weights and advantages): same loss, same
    # gradient on the real tokens, none on the padding. clip_cov's picks too: its candidates keep their
    # row-major order, so the same seed draws the same ones.
    kwargs = {**kwargs, "cov_ratio": 0.1} if name == "clip_cov" else kwargs  # fewer picks than candidates

    def pad(rows, value):
        return t64([row + [value, value] for row in rows])

    base = run(name, kwargs, t64(LP), t64(OLD), t64(A_TOK), t64(MASK), t64(W), seed=3)
    padded = run(name, kwargs, pad(LP, 2.0), pad(OLD, -3.0), pad(A_TOK, PAD), pad(MASK, 0), pad(W, PAD), seed=3)
    assert_close(padded.token_loss[:, :5], base.token_loss, **TOL)
    assert_close(padded.loss, base.loss, **TOL)
    assert_close(padded.grad[:, :5], base.grad, **TOL)
    assert not padded.grad[:, 5:].any() and not padded.token_loss[:, 5:].any()
    for key, stat in base.stats.items():
        assert_close(padded.stats[key][:, :5], stat, **TOL32)


@pytest.mark.parametrize(("case_id", "name", "kwargs", "reference", "why"), CASES, ids=CASE_IDS)
def test_non_finite_padding_changes_nothing(case_id, name, kwargs, reference, why):
    # Padding may hold -inf logprobs (a pad token the model never predicts), NaN advantages and NaN
    # weights: a product taken before the final mask would carry them into the loss or the gradient.
    kwargs = {**kwargs, "cov_ratio": 0.1} if name == "clip_cov" else kwargs

    def pad(rows, value):
        return t64([row + [value, value] for row in rows])

    inf, nan = float("-inf"), float("nan")
    base = run(name, kwargs, t64(LP), t64(OLD), t64(A_TOK), t64(MASK), t64(W), seed=3)
    padded = run(name, kwargs, pad(LP, inf), pad(OLD, inf), pad(A_TOK, nan), pad(MASK, 0), pad(W, nan), seed=3)
    assert torch.isfinite(padded.loss) and torch.isfinite(padded.grad).all()
    assert_close(padded.loss, base.loss, **TOL)
    assert_close(padded.grad[:, :5], base.grad, **TOL)
    assert not padded.grad[:, 5:].any() and not padded.token_loss[:, 5:].any()


def test_gspo_is_gspo_token_when_the_advantage_is_constant_per_row():
    # GSPO-token's gradient with A_it = A_i is GSPO's (Zheng et al. 2025, §4.3).
    args = (t64(LP), t64(OLD), t64(A_ROW), t64(MASK))
    for eps in ({"eps_low": 3e-4, "eps_high": 4e-4}, {"eps_low": 0.2, "eps_high": 0.28}):
        seq, tok = run("gspo", eps, *args), run("gspo_token", eps, *args)
        assert_close(seq.token_loss, tok.token_loss, **TOL)
        assert_close(seq.loss, tok.loss, **TOL)
        assert_close(seq.grad, tok.grad, **TOL)


def test_gspo_and_gspo_token_differ_otherwise():
    # Per-token advantages: gspo uses each row's mean advantage (one gradient for all its tokens),
    # gspo_token each token's own, so the gradients differ.
    eps = {"eps_low": 0.2, "eps_high": 0.28}  # nothing clipped: the gradients are -A s / len / S
    seq = run("gspo", eps, t64(LP), t64(OLD), t64(A_TOK), t64(MASK))
    tok = run("gspo_token", eps, t64(LP), t64(OLD), t64(A_TOK), t64(MASK))
    assert not torch.allclose(seq.grad, tok.grad)
    # Per-token weights that vary within a row: gspo weighs the row by its mean weight (every token the
    # same gradient, a sequence-level loss), gspo_token (verl's gspo) each token by its own: the same value,
    # different gradients.
    seq = run("gspo", eps, t64(LP), t64(OLD), t64(A_ROW), t64(MASK), t64(W))
    tok = run("gspo_token", eps, t64(LP), t64(OLD), t64(A_ROW), t64(MASK), t64(W))
    assert_close(seq.loss, tok.loss, **TOL)
    assert not torch.allclose(seq.grad, tok.grad)
    assert_close(seq.grad.sum(-1), tok.grad.sum(-1), **TOL)  # the same per-row total


# ----------------------------------------------------------------------------- clip_cov's and kl_cov's picks
WIDE = {**CLIP, "cov_lb": -1e9, "cov_ub": 1e9}  # every counted token the ratio clip leaves alone is a candidate


def test_clip_cov_picks_follow_the_generator():
    # 9 candidates (12 tokens less the 3 clipped), max(1, int(0.25 x 12)) = 3 picks: the picks are the
    # candidates (row-major) at the first 3 entries of torch.randperm(9) -- the permutation torch's global
    # generator gives after torch.manual_seed(s), so a seeded run is reproducible and verl's draw is matched.
    kwargs = {**WIDE, "cov_ratio": 0.25}
    cands = clip_cov_candidates(LP, OLD, A_ROW, MASK, **WIDE)
    assert len(cands) == 9
    args = (t64(LP), t64(OLD), t64(A_ROW), t64(MASK))
    draws = set()
    for seed in range(5):
        got = picked(run("clip_cov", kwargs, *args, seed=seed))
        assert got == picked(run("clip_cov", kwargs, *args, seed=seed))  # reproducible
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            perm = torch.randperm(len(cands)).tolist()
            torch.manual_seed(seed)
            _, stats = POLICY_LOSSES.get("clip_cov").fn(*args, **kwargs)  # no generator: the global one
            global_draw = picked(stats)
        assert got == sorted(cands[j] for j in perm[:3]) == global_draw
        draws.add(tuple(got))
    assert len(draws) > 1  # the seed matters


def test_kl_cov_penalises_the_top_covariance_tokens():
    # Covariances (A - 0.125)(lp - mean lp) with A per row (1, -0.5, 0), mean lp = -8.2 / 12 = -0.6833:
    # row 1 token 2 (-0.625 x (-1.65 + 0.6833) = 0.604), row 0 token 3 (0.875 x 0.4833 = 0.423), row 0
    # token 2 (0.117), row 0 token 0 (0.073), ...; ratio 0.4 takes int(4.8) = 4, 1e-4 at least 1. (Row 1's
    # tokens 0 and 1 tie for 6th place: no ratio here cuts there.)
    for ratio, k in ((0.25, 3), (0.4, 4), (1e-4, 1)):
        got = picked(run("kl_cov", {"cov_ratio": ratio, "kl_coef": 0.5}, t64(LP), t64(OLD), t64(A_ROW), t64(MASK)))
        assert got == kl_cov_picks(LP, A_ROW, MASK, ratio) and len(got) == k
    cov = covariances(LP, A_ROW, MASK)
    assert max(cov, key=cov.get) == (1, 2)


# ----------------------------------------------------------------------------- errors and config
def test_dro_needs_a_positive_beta():
    ones = torch.ones(1, 2, dtype=torch.float64)
    for beta in (None, 0.0, -0.1):
        with pytest.raises(ValueError, match="beta"):
            POLICY_LOSSES.get("dro").fn(ones, ones, ones, ones, beta=beta)


def test_ppo_clip_dual_clip_must_exceed_one():
    ones = torch.ones(1, 2, dtype=torch.float64)
    for c in (1.0, 0.5):
        with pytest.raises(ValueError, match="dual_clip_c"):
            POLICY_LOSSES.get("ppo_clip").fn(ones, ones, ones, ones, dual_clip_c=c)


# (id, overrides, a regex the one-line error must match, why)
CONFIG_ERRORS = [
    ("gspo_dual_clip", ["algo.policy_loss=gspo", "algo.clip.dual_clip_c=3"], r"^algo\.clip\.dual_clip_c=3\.0 with algo\.policy_loss=gspo",
     "dual clip bounds ppo_clip's surrogate only"),
    ("dro_without_beta", ["algo.policy_loss=dro"], r"^algo\.policy_loss=dro needs algo\.dro\.beta", "dro has no default beta"),
    ("geo_mean_top_entropy", ["algo.policy_loss=geo_mean", "algo.top_entropy_quantile=0.2"], r"^algo\.top_entropy_quantile with "
     r"algo\.policy_loss=geo_mean", "one ratio per sequence: no token's gradient can be kept apart"),
    ("gspo_loss_agg", ["algo.policy_loss=gspo", "algo.loss_agg=seq_mean_token_sum"], r"^algo\.loss_agg=seq_mean_token_sum with "
     r"algo\.policy_loss=gspo", "gspo aggregates per sequence: the setting would be silently ignored"),
    ("unknown_name", ["algo.policy_loss=ppo"], r"^algo\.policy_loss='ppo': must be a registered policy loss: ppo_clip, gspo, "
     r"gspo_token, cispo, sapo, geo_mean, dppo_tv, dppo_kl, clip_cov, kl_cov, gpg, dro\b", "an unknown name lists the choices"),
]


@pytest.mark.parametrize("case_id,overrides,pattern,why", CONFIG_ERRORS, ids=[c[0] for c in CONFIG_ERRORS])
def test_config_rules(case_id, overrides, pattern, why):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    message = str(err.value)
    assert "\n" not in message, message  # one problem, one line
    assert re.search(pattern, message), (why, message)


def test_config_accepts_what_the_rules_allow():
    for overrides in (["algo.policy_loss=dro", "algo.dro.beta=0.05"], ["algo.policy_loss=ppo_clip", "algo.clip.dual_clip_c=3"],
                      ["algo.policy_loss=gspo_token", "algo.top_entropy_quantile=0.2"],
                      ["algo.policy_loss=gspo", "algo.loss_agg=seq_mean_token_mean"]):
        assert load_config(None, overrides).algo.policy_loss == overrides[0].split("=")[1]


# ----------------------------------------------------------------------------- 80/20 forking tokens
ENTROPY = [[0.0, 1.0, 2.0, 3.0, 4.0, 100.0],  # the padding column's 100 must not move the threshold
           [5.0, 6.0, 7.0, 8.0, 9.0, 100.0]]
ENTROPY_MASK = [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0]]
# (quantile, the kept entropies, why): TRL's get_high_entropy_mask keeps entropy >= torch.quantile(counted
# entropies, 1 - quantile), linear interpolation between order statistics.
ENTROPY_CASES = [
    (0.2, {8.0, 9.0}, "quantile(0.8) of 0..9 = 0.8 x 9 = 7.2: keeps 8 and 9, the top 20%"),
    (0.25, {7.0, 8.0, 9.0}, "quantile(0.75) = 6.75: 3 of 10 kept, ties to the discrete grid"),
    (0.05, {9.0}, "quantile(0.95) = 8.55: only 9"),
    (1.0, {float(v) for v in range(10)}, "quantile(0) = the minimum: every counted token"),
    (0.0, {9.0}, "TRL allows 0: quantile(1) = the maximum, only the highest-entropy token keeps its gradient"),
]


@pytest.mark.parametrize("quantile,kept,why", ENTROPY_CASES, ids=[str(c[0]) for c in ENTROPY_CASES])
def test_top_entropy_mask(quantile, kept, why):
    keep = top_entropy_mask(torch.tensor(ENTROPY), torch.tensor(ENTROPY_MASK), quantile=quantile)
    got = {ENTROPY[i][t] for i, t in torch.nonzero(keep).tolist()}
    assert got == kept, why
    assert keep.dtype == torch.float32 and set(keep.unique().tolist()) <= {0.0, 1.0}


def test_top_entropy_mask_rejects_a_share_outside_the_unit_interval():
    for quantile in (-0.1, 1.5):
        with pytest.raises(ValueError, match="quantile"):
            top_entropy_mask(torch.tensor(ENTROPY), torch.tensor(ENTROPY_MASK), quantile=quantile)


def test_top_entropy_mask_at_zero_keeps_every_tie_of_the_maximum():
    # two counted tokens share the top entropy 3: TRL's entropy >= max keeps both
    keep = top_entropy_mask(torch.tensor([[3.0, 1.0, 3.0]]), torch.ones(1, 3), quantile=0.0)
    assert keep.tolist() == [[1.0, 0.0, 1.0]]
    from mathrl.config import load_config

    assert load_config(None, ["algo.top_entropy_quantile=0"]).algo.top_entropy_quantile == 0.0


# ----------------------------------------------------------------------------- training (slow)
TINY = [
    "base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32",
    "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1",
    "train.steps=2", "rollout.prompts_per_step=4", "rollout.n=4", "train.mini_batch_size=8", "data.eval_size=4",
    "eval.n=2", "eval.every=2", "reward.num_workers=0", "data.dynamic_sampling.mode=none", "train.save_every=0",
]


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One cache for the module: the tiny base model is pretrained once, not once per loss."""
    return tmp_path_factory.mktemp("cache")


def train_tiny(overrides: list[str], tmp_path, monkeypatch, cache):
    from mathrl.track.sinks import read_metrics
    from mathrl.train.loop import train

    monkeypatch.setenv("MATHRL_CACHE", str(cache))
    cfg = load_config(None, [*TINY, *overrides, f"run_dir={tmp_path / 'run'}"])
    result = train(cfg, console=Console(file=io.StringIO()))
    return cfg, result, read_metrics(result.run_dir / "metrics.jsonl")


OUTSIDE_CALLS: list[dict] = []


def reinforce_with_nll(logprobs, old_logprobs, advantages, mask, *, weights=None, beta=0.0):
    """A policy loss from outside the package: REINFORCE plus beta x the sampled tokens' NLL,
    -(A + beta) logp. The NLL term gives every step a gradient, even where every advantage is 0."""
    OUTSIDE_CALLS.append({"beta": beta, "shape": tuple(logprobs.shape), "grad": logprobs.requires_grad})
    loss = -(advantages + beta) * logprobs  # [B, T]
    positive = torch.where(mask.bool(), (advantages > 0).float(), 0.0).detach()  # a stat of its own
    return weigh(loss, mask, weights), {"outside_positive_frac": positive}


@pytest.fixture
def outside_loss():
    OUTSIDE_CALLS.clear()
    POLICY_LOSSES.register("test_outside", PolicyLoss(reinforce_with_nll, params=lambda algo: {"beta": 0.01}))
    yield OUTSIDE_CALLS
    POLICY_LOSSES.remove("test_outside")


@pytest.mark.slow
def test_training_with_a_policy_loss_registered_outside(outside_loss, tmp_path, monkeypatch, shared_cache):
    from mathrl.model.io import load_model_and_tokenizer
    from mathrl.model.tiny import base_model_dir

    cfg, result, rows = train_tiny(["algo.policy_loss=test_outside"], tmp_path, monkeypatch, shared_cache)
    assert outside_loss and all(c == {"beta": 0.01, "shape": c["shape"], "grad": True} for c in outside_loss)
    actor = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in actor] == [1, 2]
    assert all("actor/outside_positive_frac" in r for r in actor)  # its own stat is logged
    base, _ = load_model_and_tokenizer(base_model_dir(cfg.base))
    final, _ = load_model_and_tokenizer(result.run_dir / "final")
    assert any(not torch.equal(a, b) for a, b in zip(base.state_dict().values(), final.state_dict().values()))


BUILTIN = ["ppo_clip", "gspo", "gspo_token", "cispo", "sapo", "geo_mean", "dppo_tv", "dppo_kl", "clip_cov", "kl_cov",
           "gpg", "dro"]


def test_the_builtin_list_is_the_registry():
    assert BUILTIN == POLICY_LOSSES.names()


# The tiny model answers every problem wrong after 2 steps, so with the checker's reward alone every
# advantage is 0 and no loss would give a gradient; DAPO's soft overlong punishment over the last 40 of 48
# tokens makes the rewards of a group differ by length.
SIGNAL = ["reward.overlong.soft_punishment=true", "reward.overlong.cache_len=40"]


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILTIN)
def test_two_training_steps_with_each_builtin_loss(name, tmp_path, monkeypatch, shared_cache):
    extra = ["algo.dro.beta=0.05"] if name == "dro" else []
    _, _, rows = train_tiny([f"algo.policy_loss={name}", *SIGNAL, *extra], tmp_path, monkeypatch, shared_cache)
    actor = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in actor] == [1, 2]
    assert max(r["actor/grad_norm"] for r in actor) > 0  # the loss gave a gradient
    if name in ("clip_cov", "kl_cov"):
        assert all("actor/cov_selected_frac" in r for r in actor)
    for row in rows:
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert math.isfinite(value), (name, key, value)
