"""Sample filter with stub detectors: priority order, laziness, precomputed flags, validation.

Run: python -m pytest tests/algo/test_sample_filter.py -q
"""

import pytest

from mathrl.algo.sample_filter import REASONS, sample_filter


# Stub detectors keyed on markers in the text, so each case states its reasons in plain sight.
def rep(text: str) -> bool:
    return "REP" in text


def garb(text: str) -> bool:
    return "GARB" in text


TEXTS = ["fine \\boxed{1}", "REP REP REP", "GARB", "REP GARB", "no box here", "REP and no box"]
NO_ANSWER = [False, True, False, False, True, True]
ALL = set(REASONS)


def test_all_reasons_first_one_wins():
    # 0 clean -> kept; 1 repetitive and no answer -> counted once, as repetitive (first in order);
    # 2 garbled; 3 repetitive and garbled -> repetitive; 4 no answer only; 5 repetitive + no answer.
    res = sample_filter(TEXTS, no_answer=NO_ANSWER, is_repetitive=rep, is_garbled=garb, drop=ALL)
    assert res.reasons == [None, "repetitive", "garbled", "repetitive", "no_answer", "repetitive"]
    assert res.keep_rows.tolist() == [True, False, False, False, False, False]
    assert res.counts == {"repetitive": 3, "garbled": 1, "no_answer": 1, "void_turn": 0}


def test_only_listed_reasons_drop():
    # drop = {no_answer}: repetitive/garbled texts with an answer (2, 3) are kept; rows 1, 4, 5 have
    # no answer and are counted under no_answer even though 1 and 5 are also repetitive.
    res = sample_filter(TEXTS, no_answer=NO_ANSWER, is_repetitive=rep, is_garbled=garb, drop={"no_answer"})
    assert res.reasons == [None, "no_answer", None, None, "no_answer", "no_answer"]
    assert res.counts == {"repetitive": 0, "garbled": 0, "no_answer": 3, "void_turn": 0}


def test_drop_order_does_not_matter():
    # Priority is REASONS order, not the order of `drop`: row 3 (REP GARB) is repetitive either way.
    a = sample_filter(TEXTS, no_answer=NO_ANSWER, is_repetitive=rep, is_garbled=garb, drop=["garbled", "repetitive"])
    b = sample_filter(TEXTS, no_answer=NO_ANSWER, is_repetitive=rep, is_garbled=garb, drop=["repetitive", "garbled"])
    assert a.reasons == b.reasons
    assert a.reasons[3] == "repetitive"


def test_empty_drop_keeps_everything_and_calls_nothing():
    # No active reasons: no detector may run (they can be slow), every row kept, counts all 0.
    def boom(text):
        raise AssertionError("detector called although its reason is not in drop")

    res = sample_filter(TEXTS, no_answer=NO_ANSWER, is_repetitive=boom, is_garbled=boom, drop=set())
    assert res.keep_rows.all() and res.reasons == [None] * len(TEXTS)
    assert res.counts == {"repetitive": 0, "garbled": 0, "no_answer": 0, "void_turn": 0}


def test_later_detectors_skip_already_dropped_rows():
    # is_garbled must run only on rows that is_repetitive did not already drop (0, 2, 4).
    seen = []

    def garb_spy(text):
        seen.append(text)
        return garb(text)

    sample_filter(TEXTS, no_answer=NO_ANSWER, is_repetitive=rep, is_garbled=garb_spy, drop=ALL)
    assert seen == [TEXTS[0], TEXTS[2], TEXTS[4]]


def test_precomputed_flags_instead_of_callables():
    # A detector may be N flags, e.g. is_garbled evaluated with each row's token logprobs.
    res = sample_filter(["a", "b", "c"], no_answer=[False, False, True], is_repetitive=[False, True, False],
                        is_garbled=[True, True, False], drop=ALL)
    assert res.reasons == ["garbled", "repetitive", "no_answer"]


def test_empty_batch():
    res = sample_filter([], no_answer=[], is_repetitive=rep, is_garbled=garb, drop=ALL)
    assert res.keep_rows.numel() == 0 and res.reasons == []


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"drop": {"repetition"}}, "unknown sample_filter reason"),
        ({"no_answer": [False]}, "no_answer has 1 flags for 2 texts"),
        ({"is_garbled": [True, False, True]}, "garbled has 3 flags"),
    ],
)
def test_invalid_arguments_raise(kwargs, match):
    args = {"no_answer": [False, False], "is_repetitive": rep, "is_garbled": garb, "drop": ALL} | kwargs
    with pytest.raises(ValueError, match=match):
        sample_filter(["x", "y"], **args)


def test_void_turn_drops_only_flagged_episodes_and_counts_last():
    # SimpleTIR's filter: a tool episode whose last turn has neither a call nor an answer is dropped.
    # It is the last reason in priority order, so a void episode without an answer that is also
    # filtered for no_answer counts under no_answer.
    texts = ["a", "b", "c"]
    res = sample_filter(texts, no_answer=[False, True, True], is_repetitive=[False] * 3, is_garbled=[False] * 3,
                        drop={"void_turn"}, void_turn=[False, True, False])
    assert res.keep_rows.tolist() == [True, False, True]
    assert res.counts["void_turn"] == 1
    both = sample_filter(texts, no_answer=[False, True, True], is_repetitive=[False] * 3, is_garbled=[False] * 3,
                         drop={"void_turn", "no_answer"}, void_turn=[False, True, False])
    assert both.reasons == [None, "no_answer", "no_answer"]
