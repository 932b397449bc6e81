"""Tests for mathrl.train.batching: micro-batch grouping, trimming, and that neither changes the numbers.

Run: python -m pytest tests/train/test_batching.py -q
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from mathrl.config import load_config
from mathrl.model.scoring import response_logprobs
from mathrl.rollout.engine import TorchEngine
from mathrl.train.batching import TrainBatch, micro_batch_slices, micro_batches, row_lengths

PAD, EOS = 0, 1
PER_ROW = {"correct"}  # TrainBatch's 1-D [N] fields; every other non-prompt field is [N, T]


def train_batch(**tensors) -> TrainBatch:
    """A TrainBatch from the given tensors, every field not given set to zeros of its shape."""
    n, t = tensors["response_ids"].shape
    for f in dataclasses.fields(TrainBatch):
        if f.name not in tensors:
            tensors[f.name] = torch.zeros(n) if f.name in PER_ROW else torch.zeros(n, t)
    return TrainBatch(**tensors)


# --------------------------------------------------------------------------------------------------
# micro_batch_slices
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "lengths, budget, expected",
    [
        # (prompt, response) per row; a micro-batch costs rows x (longest prompt + longest response)
        ([(1, 2), (1, 2), (1, 2), (5, 5), (0, 1)], 9, [[0, 1, 2], [3], [4]]),  # 3x3 fits; 10 > 9 alone; 2x10 > 9
        ([(1, 1)] * 4, 100, [[0, 1, 2, 3]]),  # everything fits in one
        ([(3, 2), (0, 1), (0, 1), (0, 1)], 8, [[0], [1, 2, 3]]),  # a long row first: rows x LONGEST row counts
        ([(0, 1), (0, 1), (2, 3)], 8, [[0, 1], [2]]),  # ... also when the long row comes last (3 x 5 > 8)
        ([(10, 1), (1, 10)], 22, [[0], [1]]),  # both rows are 11 long, but together 2 x (10 + 10) = 40 > 22
        ([(25, 25)], 10, [[0]]),  # a single over-budget row still gets its own group (never dropped)
        ([], 10, []),
    ],
)
def test_micro_batch_slices_hand_computed(lengths, budget, expected):
    assert micro_batch_slices(lengths, budget) == expected


def _width(lengths, rows):
    return max(lengths[i][0] for i in rows) + max(lengths[i][1] for i in rows)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 30)), max_size=40), st.integers(1, 200))
def test_micro_batch_slices_properties(lengths, budget):
    groups = micro_batch_slices(lengths, budget)
    # every row exactly once, in order (gradient accumulation must see each sample once)
    assert [i for g in groups for i in g] == list(range(len(lengths)))
    assert all(g for g in groups)
    for k, g in enumerate(groups):
        # the budget holds for the trimmed [rows, P + T] micro-batch, except for a lone over-budget row
        assert len(g) * _width(lengths, g) <= budget or len(g) == 1
        # greedy: a group is closed only because the next row would break the budget
        if k + 1 < len(groups):
            nxt = groups[k + 1][0]
            assert (len(g) + 1) * _width(lengths, g + [nxt]) > budget


# --------------------------------------------------------------------------------------------------
# TrainBatch.trimmed
# --------------------------------------------------------------------------------------------------
def padded_batch() -> TrainBatch:
    """3 rows; prompt columns 0-1 and response columns 4-5 are padding in every row."""
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 1, 1], [0, 0, 0, 0, 1]])
    prompt_ids = torch.where(prompt_mask.bool(), torch.arange(10, 25).view(3, 5), PAD)
    response_mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]], dtype=torch.float)
    response_ids = torch.where(response_mask.bool(), torch.arange(30, 48).view(3, 6), PAD)
    values = torch.arange(18, dtype=torch.float).view(3, 6) * response_mask
    return train_batch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                       response_mask=response_mask, loss_mask=response_mask.clone(),
                       old_logprobs=-values / 10, advantages=values, correct=torch.tensor([1.0, 0.0, 1.0]))


def test_trimmed_drops_only_all_padding_columns():
    b = padded_batch()
    t = b.trimmed()
    assert t.prompt_ids.shape == (3, 3) and t.response_ids.shape == (3, 4)
    # the dropped columns were padding everywhere ...
    assert b.prompt_mask[:, :2].sum() == 0 and b.response_mask[:, 4:].sum() == 0
    # ... and the kept ones are exactly the rest, values untouched
    assert torch.equal(t.prompt_ids, b.prompt_ids[:, 2:]) and torch.equal(t.prompt_mask, b.prompt_mask[:, 2:])
    for f in dataclasses.fields(TrainBatch):
        x, y = getattr(t, f.name), getattr(b, f.name)
        if f.name.startswith("prompt_"):
            continue
        if f.name in PER_ROW:
            assert torch.equal(x, y), f.name  # per-row values are not columns: untouched
        else:
            assert torch.equal(x, y[:, :4]), f.name
    # no real token is lost
    assert t.prompt_mask.sum() == b.prompt_mask.sum() and t.response_mask.sum() == b.response_mask.sum()
    assert t.trimmed().response_ids.shape == t.response_ids.shape  # idempotent


def test_trimmed_of_selected_rows_trims_to_those_rows():
    # micro_batches() trims after selecting: row 2 alone has a 1-token prompt and a 1-token response.
    t = padded_batch().select([2]).trimmed()
    assert t.prompt_ids.tolist() == [[24]] and t.response_ids.tolist() == [[42]]
    assert t.advantages.tolist() == [[12.0]]
    assert t.correct.tolist() == [1.0]


def test_trimmed_with_no_response_tokens_keeps_one_column():
    # An all-zero response mask (e.g. every row filtered) must still give a valid [N, 1] tensor.
    b = padded_batch()
    b.response_mask = torch.zeros_like(b.response_mask)
    assert b.trimmed().response_ids.shape == (3, 1)


def test_micro_batches_cover_every_row_once():
    b = padded_batch()
    # (prompt, response) = (3, 3), (2, 4), (1, 1) -> [0, 1] (2 x (3 + 4) = 14), [2] (3 x 7 > 14)
    micros = micro_batches(b, token_budget=14)
    assert [len(m) for m in micros] == [2, 1]
    assert torch.equal(torch.cat([m.advantages.sum(-1) for m in micros]), b.advantages.sum(-1))


def test_micro_batches_respect_the_budget_in_padded_tokens():
    # The budget bounds the memory of one forward/backward, i.e. the padded [rows, P + T] tensor.
    # Bug story: micro_batch_slices used to get prompt_len + response_len per row, but after trimming
    # a micro-batch is (longest prompt) + (longest response) wide. Row 0 (prompt 10, response 1) and
    # row 1 (prompt 1, response 10) are both "11 long", so budget 22 groups them, yet the trimmed
    # micro-batch is 2 x (10 + 10) = 40 tokens: nearly twice the budget (an OOM on a real GPU run).
    prompt_mask = torch.tensor([[1] * 10, [0] * 9 + [1]])
    response_mask = torch.tensor([[1.0] + [0.0] * 9, [1.0] * 10])
    b = train_batch(prompt_ids=prompt_mask * 5, prompt_mask=prompt_mask, response_ids=response_mask.long() * 5,
                    response_mask=response_mask, loss_mask=response_mask)
    for micro in micro_batches(b, token_budget=22):
        padded = len(micro) * (micro.prompt_ids.shape[1] + micro.response_ids.shape[1])
        assert padded <= 22 or len(micro) == 1


# --------------------------------------------------------------------------------------------------
# trimming and micro-batching do not change the logprobs
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rollout_batch(tiny_model, char_tokenizer) -> TrainBatch:
    """Real rollouts of prompts with very different lengths, plus extra all-padding columns on both sides."""
    texts = ["1+2=", "123+456=", "9=", "77+8=", "5+5=", "300+21=", "4+4="]
    prompts = [char_tokenizer(t)["input_ids"] for t in texts]
    out = TorchEngine(tiny_model, eos_token_id=EOS, pad_token_id=PAD).generate(prompts, max_new_tokens=12, seed=2)
    n = len(prompts)
    extra_left, extra_right = 3, 4  # padding columns no row needs, as _concat of chunks can produce
    prompt_ids = torch.cat([torch.full((n, extra_left), PAD), out.prompt_ids], 1)
    prompt_mask = torch.cat([torch.zeros(n, extra_left, dtype=torch.long), out.prompt_mask], 1)
    right = lambda x, v: torch.cat([x, torch.full((n, extra_right), v, dtype=x.dtype)], 1)  # noqa: E731
    response_mask = right(out.response_mask, 0.0)
    return train_batch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=right(out.response_ids, PAD),
                       response_mask=response_mask, loss_mask=response_mask.clone(),
                       old_logprobs=right(out.rollout_logprobs, 0.0))


def logprobs_of(model, b: TrainBatch) -> torch.Tensor:
    with torch.no_grad():
        lp, _ = response_logprobs(model, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask)
    return lp


def test_trimmed_micro_batch_logprobs_equal_untrimmed(tiny_model, rollout_batch):
    # Position ids come from the attention mask alone (cumsum - 1), so cutting all-padding columns
    # must not change any real token's logprob. Rows 0 and 2 have short prompts: their own trimmed
    # micro-batch loses most of the left padding and still has to agree with the full batch.
    full = logprobs_of(tiny_model, rollout_batch)
    rows = [0, 2]
    micro = rollout_batch.select(rows).trimmed()
    assert micro.prompt_ids.shape[1] < rollout_batch.prompt_ids.shape[1]
    assert micro.response_ids.shape[1] < rollout_batch.response_ids.shape[1]
    trimmed = logprobs_of(tiny_model, micro)
    width = trimmed.shape[1]
    mask = micro.response_mask.bool()
    assert_close(trimmed[mask], full[rows, :width][mask], rtol=1e-5, atol=1e-5)
    # and both equal the sampler's logprobs (the test batch carries them as old_logprobs)
    assert_close(trimmed[mask], micro.old_logprobs[mask], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("budget", [1, 40, 10_000])
def test_micro_batched_scoring_equals_one_pass(tiny_model, rollout_batch, budget):
    # Invariance (STYLE.md point 8): scoring in micro-batches (1 row each, a few, or all at once) and
    # scattering back equals one pass over the whole batch, at every real token.
    full = logprobs_of(tiny_model, rollout_batch)
    lengths = row_lengths(rollout_batch)
    out = torch.zeros_like(full)
    for rows in micro_batch_slices(lengths, budget):
        lp = logprobs_of(tiny_model, rollout_batch.select(rows).trimmed())
        out[torch.tensor(rows)[:, None], torch.arange(lp.shape[1])[None, :]] = lp
    mask = rollout_batch.response_mask.bool()
    assert_close(out[mask], full[mask], rtol=1e-5, atol=1e-5)


def test_scoring_pass_matches_a_single_pass(tiny_model, rollout_batch):
    # The trainer's scoring pass (train.loop.scoring_pass: old logprobs, reference logprobs and
    # entropy) micro-batches by train.micro_batch_tokens * 4 and chunks the head by
    # model.logprob_chunk_size; with a budget that forces ~1 row per group it must still equal one
    # pass, and be exactly 0 on padding (old logprobs feed the ratio only where the mask is 1).
    from mathrl.train.passes import scoring_pass

    cfg = load_config(None, ["train.micro_batch_tokens=5", "model.logprob_chunk_size=7"])  # budget 20
    logprobs, entropy = scoring_pass(tiny_model, rollout_batch, cfg, with_entropy=True)
    b = rollout_batch
    with torch.no_grad():
        ref_lp, ref_ent = response_logprobs(tiny_model, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask)
    mask = b.response_mask.bool()
    assert_close(logprobs[mask], ref_lp[mask], rtol=1e-5, atol=1e-5)
    assert_close(entropy[mask], ref_ent[mask], rtol=1e-5, atol=1e-5)
    assert (logprobs[~mask] == 0).all() and (entropy[~mask] == 0).all()
    assert not tiny_model.training  # restored to the mode it had (the fixture model is in eval mode)


def test_sum_pi_squared_pass_is_the_softmax_squared_over_the_vocabulary(tiny_model, rollout_batch):
    # the optimal token baseline's sum_v pi_v^2, against the model's full logits: softmax(logits / T)^2 summed
    from mathrl.train.passes import sum_pi_squared_pass

    cfg = load_config(None, ["train.micro_batch_tokens=64"])  # several micro-batches
    got = sum_pi_squared_pass(tiny_model, rollout_batch, cfg)
    b = rollout_batch
    ids = torch.cat([b.prompt_ids, b.response_ids], 1)
    attn = torch.cat([b.prompt_mask, b.response_mask], 1)
    with torch.no_grad():
        logits = tiny_model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp(min=0)).logits
    p = b.prompt_ids.shape[1]
    probs = torch.softmax(logits[:, p - 1 : p - 1 + b.response_ids.shape[1]].float() / cfg.rollout.temperature, -1)
    want = probs.square().sum(-1)
    mask = b.response_mask.bool()
    assert_close(got[mask], want[mask], rtol=1e-4, atol=1e-5)
    assert (got[~mask] == 0).all()
