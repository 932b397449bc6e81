"""actor/pg_clipfrac_low and _high for every loss, and a sequence-level loss's sequence-ratio statistics
(actor/seq_ratio_mean, _min, _max, actor/seq_clipfrac): reduced over sequences, not tokens, and the same
however the mini-batch is split into micro-batches.

Run: python -m pytest tests/train/test_clip_metrics.py -q
"""

import pytest
import torch

from mathrl.config import load_config
from mathrl.registry import POLICY_LOSSES
from mathrl.train.update import UpdateLog, add_sequence_stat, policy_metrics, update_policy
from update_helpers import random_batch, tiny_model


def test_a_sequence_stat_is_a_mean_over_sequences_and_an_extreme_over_them():
    # rows: ratio 2.0 on 3 tokens, 0.5 on 1 token, an empty row. Per sequence the mean is (2 + 0.5) / 2 =
    # 1.25; a token-weighted mean would say (3 * 2 + 0.5) / 4 = 1.625
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    value = torch.tensor([[2.0, 2.0, 2.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    clipped = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    sums, extrema = {"entropy": 0.0, "tokens": 4.0, "ent_masked": 0.0, "seqs": 2.0, "pg_clipfrac": 0.0,
                     "pg_clipfrac_lower": 0.0, "ppo_kl": 0.0, "pg_clipfrac_low": 0.0, "pg_clipfrac_high": 0.0}, {}
    for key in ("seq_ratio_mean", "seq_ratio_min", "seq_ratio_max"):
        add_sequence_stat(sums, extrema, key, value, mask)
    add_sequence_stat(sums, extrema, "seq_clipfrac", clipped, mask)
    metrics = policy_metrics(UpdateLog(grad_norms=[1.0]), sums, load_config(None, []), terms_on=[], ptx=False,
                             extrema=extrema)
    assert metrics["actor/seq_ratio_mean"] == pytest.approx(1.25)
    assert (metrics["actor/seq_ratio_min"], metrics["actor/seq_ratio_max"]) == (0.5, 2.0)
    assert metrics["actor/seq_clipfrac"] == pytest.approx(0.5)  # one of the two sequences, not 3 of 4 tokens


def one_update(loss: str, micro_batch_tokens: int, clip: tuple[str, ...] = ()) -> dict:
    cfg = load_config(None, [
        f"algo.policy_loss={loss}", "rollout.max_new_tokens=6", "rollout.prompts_per_step=2", "rollout.n=4",
        "train.mini_batch_size=4", f"train.micro_batch_tokens={micro_batch_tokens}", "train.max_grad_norm=1e9",
        *clip], note=lambda line: None)
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=3.0)  # large steps: the second mini-batch's ratios move
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return update_policy(model, optimizer, scheduler, random_batch(), cfg, step=1, coefs={"entropy": 0.0, "kl": 0.0},
                         ptx=None).metrics


SEQUENCE_LOSSES = ["gspo", "gspo_token", "geo_mean"]


@pytest.mark.parametrize("loss", POLICY_LOSSES.names())
def test_every_loss_logs_its_clip_split_by_side(loss):
    clip = ("algo.dro.beta=0.1",) if loss == "dro" else ()
    metrics = one_update(loss, 10_000, clip)
    low, high = metrics["actor/pg_clipfrac_low"], metrics["actor/pg_clipfrac_high"]
    assert 0.0 <= low <= 1.0 and 0.0 <= high <= 1.0
    if loss in ("ppo_clip", "gspo", "gspo_token", "dppo_tv", "dppo_kl"):
        # the clip's two sides are its whole: pg_clipfrac = low + high (verl's pg_clipfrac, split)
        assert low + high == pytest.approx(metrics["actor/pg_clipfrac"], abs=1e-6)
    has_seq = {"actor/seq_ratio_mean", "actor/seq_ratio_min", "actor/seq_ratio_max", "actor/seq_clipfrac"} <= set(metrics)
    assert has_seq == (loss in SEQUENCE_LOSSES)


@pytest.mark.parametrize("loss", SEQUENCE_LOSSES)
def test_sequence_ratio_stats_do_not_depend_on_the_micro_batch_split(loss):
    whole, split = one_update(loss, 10_000), one_update(loss, 1)  # one micro-batch / one row per micro-batch
    for key in ("actor/seq_ratio_mean", "actor/seq_ratio_min", "actor/seq_ratio_max", "actor/seq_clipfrac",
                "actor/pg_clipfrac_low", "actor/pg_clipfrac_high"):
        assert whole[key] == pytest.approx(split[key], rel=1e-5, abs=1e-7), key
    assert whole["actor/seq_ratio_min"] <= whole["actor/seq_ratio_mean"] <= whole["actor/seq_ratio_max"]
    # the second mini-batch sees the policy after the first one's step: its sequence ratios are not 1
    assert whole["actor/seq_ratio_min"] < whole["actor/seq_ratio_max"]
