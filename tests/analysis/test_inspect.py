"""`mathrl inspect`: per-token scores against a plain forward pass, the base-vs-RL comparison and its
class split on hand-made scores, the exploration odds, the HTML page, tokenizer checks and the
command end to end on tiny random models.

Run: python -m pytest tests/analysis/test_inspect.py -q
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re

import pytest
import torch
from torch.testing import assert_close

from mathrl.analysis.entropy_probe import next_token_distribution, probe_checkpoint, top_entropy_positions
from mathrl.analysis.tokens import (
    TokenizerMismatchError,
    TokenScores,
    check_same_tokenizer,
    context_segments,
    context_text,
    token_probs,
)
from mathrl.analysis.tokens.comparison import ClassSummary, classify_token, compare, exploration_table
from mathrl.analysis.tokens.html import InspectReport, render_html, write_html

PROMPT = "25+213="
RESPONSE = "5+3+0=08,2+1+0=03,\\boxed{238} so <x> & y"


@pytest.fixture(scope="module")
def pair(make_tiny_qwen2):
    """Two different random inits of the same tiny Qwen2: 'base' and 'rl'."""
    return make_tiny_qwen2(seed=0, num_layers=1), make_tiny_qwen2(seed=1, num_layers=1)


def plain_probs(model, tokenizer, prompt: str, response: str) -> tuple[list[int], list[int], torch.Tensor]:
    """Reference: (prompt ids, response ids, softmax of a plain full forward [P+T, V])."""
    p = tokenizer(prompt)["input_ids"]
    r = tokenizer(response, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        probs = model(torch.tensor([p + r])).logits.float().softmax(-1)[0]  # [P+T, V]
    return p, r, probs


# ---------------------------------------------------------------------------- scores vs a plain forward


def test_token_probs_match_a_plain_forward(pair, char_tokenizer):
    # The state at index P-1+t predicts response token t; an off-by-one here would shift every
    # probability onto the wrong token.
    model = pair[0]
    p, r, probs = plain_probs(model, char_tokenizer, PROMPT, RESPONSE)
    expected = probs[torch.arange(len(p) - 1, len(p) + len(r) - 1), torch.tensor(r)]  # [T]
    expected_entropy = torch.distributions.Categorical(probs=probs[len(p) - 1 : -1]).entropy()  # [T]
    scores = token_probs(model, char_tokenizer, PROMPT, RESPONSE)
    assert scores.prompt_ids == p and scores.token_ids == r
    assert_close(scores.probs, expected, rtol=1e-5, atol=1e-6)
    assert_close(scores.entropy, expected_entropy, rtol=1e-5, atol=1e-5)
    assert "".join(scores.tokens) == RESPONSE  # byte-level 'Ġ' decoded back to spaces
    assert scores.tokens[scores.tokens.index(" ")] == " "
    # a response given as ids (a rollouts.jsonl record) scores the same as its text
    by_ids = token_probs(model, char_tokenizer, PROMPT, r)
    assert_close(by_ids.logprobs, scores.logprobs)


def test_next_token_distribution_matches_a_plain_forward(pair, char_tokenizer):
    model = pair[1]
    p, r, probs = plain_probs(model, char_tokenizer, PROMPT, RESPONSE)
    position = 6
    row = probs[len(p) - 1 + position]  # [V]: the distribution over response token `position`
    dist = next_token_distribution(model, char_tokenizer, PROMPT, RESPONSE, position, k=4)
    top = row.topk(4)
    assert [t[1] for t in dist.top] == top.indices.tolist()
    assert_close(torch.tensor([t[2] for t in dist.top]), top.values, rtol=1e-5, atol=1e-6)
    assert dist.actual_id == r[position]
    assert_close(torch.tensor(dist.actual_prob), row[r[position]], rtol=1e-5, atol=1e-6)
    assert dist.actual_rank == int((row > row[r[position]]).sum()) + 1
    assert_close(torch.tensor(dist.entropy), torch.distributions.Categorical(probs=row).entropy(), rtol=1e-5, atol=1e-5)
    assert dist.context == (PROMPT + RESPONSE[:position])[-20:]
    with pytest.raises(ValueError, match="outside the response"):
        next_token_distribution(model, char_tokenizer, PROMPT, RESPONSE, len(r), k=4)


def test_probe_checkpoint_top_entropy_positions(pair, char_tokenizer):
    scores = token_probs(pair[0], char_tokenizer, PROMPT, RESPONSE)
    probe = probe_checkpoint(pair[0], char_tokenizer, PROMPT, RESPONSE, name="base", entropy_k=3, position=2, dist_k=3)
    expected = sorted(range(len(scores)), key=lambda i: -float(scores.entropy[i]))[:3]
    assert [e.position for e in probe.top_positions] == expected
    assert probe.top_positions == top_entropy_positions(scores, 3)
    assert probe.top_positions[0].entropy >= probe.top_positions[1].entropy >= probe.top_positions[2].entropy
    # two code paths for the same number: the full scoring pass and the one-position head
    assert_close(torch.tensor(probe.distribution.actual_prob), scores.probs[2], rtol=1e-5, atol=1e-6)
    assert_close(torch.tensor(probe.mean_entropy), scores.entropy.mean())


# ---------------------------------------------------------------------------- compare on hand-made scores

# (token, class, p_base, p_rl, why)
HAND = [
    ("1", "formula", 0.95, 0.995, "over-confident: base already likely, RL pushed it past 0.99; Δp 0.045 not moved"),
    ("+", "formula", 0.50, 0.80, "moved up by 0.3"),
    (" the", "word", 0.30, 0.10, "moved down by 0.2"),
    ("x", "word", 0.92, 0.999, "over-confident; Δp 0.079 under the threshold"),
    (":", "other", 0.20, 0.20, "unchanged"),
    ("\\frac", "formula", 0.60, 0.45, "moved down by 0.15"),
    (" ", "other", 0.99, 0.995, "over-confident whitespace"),
    ("<eos>", "other", 0.10, 0.35, "moved up by 0.25"),
    ("2", "formula", 0.995, 0.991, "base confident but RL lowered it: not over-confident"),
    ("y", "word", 0.80, 0.999, "moved up by 0.199, but the base was not confident: not over-confident"),
]


def hand_scores() -> tuple[TokenScores, TokenScores]:
    tokens = [h[0] for h in HAND]
    ids = list(range(10, 10 + len(HAND)))

    def scores(col: int) -> TokenScores:
        lp = torch.tensor([h[col] for h in HAND], dtype=torch.float64).log().float()
        return TokenScores(prompt="Q: ", prompt_ids=[1], token_ids=ids, tokens=tokens, logprobs=lp,
                           entropy=torch.linspace(0.1, 1.0, len(HAND)))

    return scores(2), scores(3)


def test_compare_counts_by_class():
    base, rl = hand_scores()
    c = compare(base, rl, threshold=0.1, top_k=5)
    assert c.classes == [h[1] for h in HAND]
    assert c.overconfident.tolist() == [True, False, False, True, False, False, True, False, False, False]
    assert c.moved.tolist() == [False, True, True, False, False, True, False, True, False, True]
    assert c.top_moved == [1, 7, 2, 9, 5]  # |Δp| = 0.3, 0.25, 0.2, 0.199, 0.15
    got = {k: (s.n_tokens, s.n_moved, s.n_up, s.n_down, s.n_overconfident) for k, s in c.summary.items()}
    assert got == {
        "formula": (4, 2, 1, 1, 1),
        "word": (3, 2, 1, 1, 1),
        "other": (3, 1, 1, 0, 1),
        "all": (10, 5, 3, 2, 3),
    }
    assert c.summary["word"].share_moved == pytest.approx(2 / 3)
    assert c.summary["all"].share_moved == pytest.approx(0.5)
    assert math.isnan(ClassSummary(0, 0, 0, 0, 0).share_moved)  # an empty class has no share
    assert_close(c.delta_logp, rl.logprobs - base.logprobs)
    assert c.delta_logp[1] > 0 and c.delta_logp[2] < 0  # Δ is RL minus base


def test_compare_rejects_different_tokens():
    base, rl = hand_scores()
    rl.token_ids = rl.token_ids[::-1]
    with pytest.raises(ValueError, match="different token sequences"):
        compare(base, rl)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("7", "formula"),  # a digit
        (" 12", "formula"),  # leading whitespace (byte-level 'Ġ12') is ignored
        ("+", "formula"),
        ("=", "formula"),
        (").", "formula"),  # several formula symbols in one token
        ("\\frac", "formula"),  # a LaTeX command: backslash + letters, not a word
        ("\\boxed{", "formula"),  # a command followed by a brace
        ("\\", "formula"),  # a lone backslash
        ("<", "formula"),
        (" the", "word"),
        ("So", "word"),
        ("x", "word"),  # one-letter variables are alphabetic, so they count as words (documented)
        ("α", "word"),  # str.isalpha is Unicode-aware
        ("2x", "other"),  # mixed digits and letters
        (":", "other"),  # punctuation outside the formula set
        ("$", "other"),
        (" ", "other"),  # whitespace only
        ("\n", "other"),
        ("", "other"),
        ("<eos>", "other"),  # a special token: '<' is a formula symbol but 'eos' is not
        ("frac\\", "other"),  # letters not introduced by a backslash
    ],
)
def test_classify_token(text, expected):
    assert classify_token(text) == expected


# ---------------------------------------------------------------------------- exploration odds


def test_exploration_table_numbers():
    rows = exploration_table((0.9, 0.99, 0.999, 1.0, 0.0), (1, 4, 8, 16, 64))
    by_p = {r.p: r.chance for r in rows}
    assert by_p[0.99][16] == pytest.approx(0.1485422, abs=1e-7)  # ≈ 15%: the figure in docs/inspect.md
    assert by_p[0.999][16] == pytest.approx(0.015880, abs=1e-6)  # ≈ 1.6%
    assert by_p[0.9][1] == pytest.approx(0.1)
    assert by_p[1.0][64] == 0.0 and by_p[0.0][1] == 1.0
    for p, chances in by_p.items():  # against the plain formula
        for n, x in chances.items():
            assert x == pytest.approx(1 - p**n, rel=1e-12, abs=1e-15)
    with pytest.raises(ValueError):
        exploration_table((1.5,), (1,))


def test_exploration_table_counts_response_tokens():
    c = compare(*hand_scores())
    row = exploration_table((0.9,), (16,), comparison=c)[0]
    assert (row.n_base, row.n_rl) == (4, 5)  # base: 0.95 0.92 0.99 0.995; rl: 0.995 0.999 0.995 0.991 0.999


# ---------------------------------------------------------------------------- HTML


def hand_report() -> InspectReport:
    base, rl = hand_scores()
    c = compare(base, rl, top_k=3)
    return InspectReport(source="hand-made", prompt="Q: what is <1+1>?", base_path="/m/base", model_path="/m/rl",
                         comparison=c, exploration=exploration_table(comparison=c))


def test_html_is_self_contained_and_shows_every_token(tmp_path):
    report = hand_report()
    out = write_html(report, tmp_path / "sub" / "x.html")
    page = out.read_text(encoding="utf-8")
    assert page == render_html(report)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for external in ("http://", "https://", "src=", "<script", "<link", "url(", "@import"):
        assert external not in page, external
    spans = re.findall(r'<span class="(t[^"]*)" style="[^"]*" title="([^"]*)">([^<]*)</span>', page)  # token spans
    shown = [text for _, _, text in spans]
    for tok in (" the", "\\frac", "&lt;eos&gt;", ":", "y"):  # HTML-escaped token text
        assert shown.count(tok) == 3, tok  # base map, RL map, change view
    assert len(spans) == 3 * len(HAND)
    title = spans[0][1]
    assert "p_base 0.9500" in title and "p_rl 0.9950" in title and "Δlogp +0.046" in title
    assert sum("oc" in cls.split() for cls, _, _ in spans) == 3  # the over-confident tokens, outlined once each
    assert sum("top" in cls.split() for cls, _, _ in spans) == 3  # top_k=3 most-moved tokens
    assert "14.9%" in page and "1.6%" in page  # the exploration table
    assert "&lt;1+1&gt;" in page  # the prompt, escaped


# ---------------------------------------------------------------------------- tokenizer checks


def test_tokenizer_mismatch_is_reported(char_tokenizer):
    from tokenizers import normalizers

    from mathrl.model.tiny import build_char_tokenizer

    check_same_tokenizer(char_tokenizer, build_char_tokenizer(), [PROMPT, RESPONSE])  # same: no error
    extra = build_char_tokenizer()
    extra.add_tokens(["<think>"])
    with pytest.raises(TokenizerMismatchError, match="different vocabularies.*only in model"):
        check_same_tokenizer(char_tokenizer, extra, [PROMPT])
    lower = build_char_tokenizer()  # same vocabulary, different normaliser: only the encodings tell
    lower.backend_tokenizer.normalizer = normalizers.Lowercase()
    check_same_tokenizer(char_tokenizer, lower, ["12+3"])  # no letters: identical encodings
    with pytest.raises(TokenizerMismatchError, match="encode 'So x' differently"):
        check_same_tokenizer(char_tokenizer, lower, ["12+3", "So x"])


# ---------------------------------------------------------------------------- the command


def run_cli(argv: list[str]) -> tuple[int, str]:
    """`mathrl inspect` through the command line's one entry point; (exit status, stdout + stderr)."""
    from mathrl.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        rc = main(["inspect", *argv])
    return rc, buf.getvalue()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, make_tiny_qwen2, char_tokenizer):
    """A fake run directory: base model beside it, final/, one checkpoint and a rollouts.jsonl."""
    from mathrl.model.io import save_model

    root = tmp_path_factory.mktemp("inspect")
    save_model(make_tiny_qwen2(seed=0, num_layers=1), char_tokenizer, root / "base")
    run = root / "run"
    save_model(make_tiny_qwen2(seed=1, num_layers=1), char_tokenizer, run / "final")
    save_model(make_tiny_qwen2(seed=2, num_layers=1), char_tokenizer, run / "checkpoints" / "step_000001")
    records = []
    for step in (1, 2):
        for i, resp in enumerate(["5+3+0=08,\\boxed{8}", "1+1=2,\\boxed{2}"]):
            ids = char_tokenizer(resp, add_special_tokens=False)["input_ids"] + [char_tokenizer.eos_token_id]
            records.append({"step": step, "problem_id": f"p{i}", "prompt": PROMPT, "response": resp, "reward": 1.0,
                            "reason": "correct", "token_ids": ids, "tokens": char_tokenizer.convert_ids_to_tokens(ids),
                            "logprobs": [0.0] * len(ids)})
    (run / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root


def test_cli_end_to_end_from_a_run(run_dir, tmp_path):
    out = tmp_path / "inspect.html"
    rc, text = run_cli(["--base", str(run_dir / "base"), "--run", str(run_dir / "run"), "--step", "2", "--index", "1",
                        "--checkpoints", str(run_dir / "run" / "checkpoints" / "step_000001"),
                        str(run_dir / "run" / "final"),  # the model itself: skipped, not probed twice
                        str(run_dir / "run" / "checkpoints" / "step_000002.tmp-x"),  # still being written: skipped
                        "--out", str(out), "--entropy-k", "3", "--dist-k", "3"])
    assert rc == 0, text
    page = out.read_text(encoding="utf-8")
    assert "step 2 #1 (problem p1" in page
    assert "\\boxed{" in page and "&lt;eos&gt;" in page  # the recorded ids, EOS included
    assert "Next-token distribution at position" in page
    for name in ("base", "step_000001", "rl"):
        assert f"<th class=\"l\">{name}</th>" in page
    assert page.count("<th class=\"l\">rl</th>") == 1
    assert "exploration" in text and "entropy probe" in text and str(out) in text.replace("\n", "")
    assert "unfinished checkpoint" in text


def test_cli_prompt_and_response_with_explicit_position(run_dir, tmp_path):
    out = tmp_path / "x.html"
    rc, text = run_cli(["--base", str(run_dir / "base"), "--model", str(run_dir / "run" / "final"),
                        "--prompt", PROMPT, "--response", "5+3=8", "--position", "2", "--out", str(out)])
    assert rc == 0, text
    assert "next-token distribution at position 2" in text
    assert out.is_file()


def test_cli_input_errors(run_dir, tmp_path, char_tokenizer, make_tiny_qwen2):
    from mathrl.model.io import save_model

    base, model = str(run_dir / "base"), str(run_dir / "run" / "final")
    out = str(tmp_path / "never.html")
    cases = [
        (["--base", base, "--model", model], "no response to inspect"),
        (["--base", base, "--model", model, "--prompt", "1+1="], "go together"),
        (["--base", base, "--run", str(run_dir / "run"), "--step", "2", "--index", "5"], "out of range"),
        (["--base", base, "--run", str(run_dir / "run"), "--step", "9"], "no records for step 9"),
        (["--run", str(run_dir / "run"), "--step", "1"], "--base is required"),
        (["--base", base, "--model", model, "--prompt", "1=", "--response", "2", "--position", "7"], "outside"),
    ]
    for argv, message in cases:
        rc, text = run_cli(argv + ["--out", out])
        assert rc == 1 and message in text, (argv, text)
    # a model whose tokenizer differs from the base's
    other = build_other_tokenizer()
    save_model(make_tiny_qwen2(seed=3, num_layers=1), other, tmp_path / "other")
    rc, text = run_cli(["--base", base, "--model", str(tmp_path / "other"), "--prompt", "1+1=", "--response", "2",
                        "--out", out])
    assert rc == 1 and "different vocabularies" in text
    assert not (tmp_path / "never.html").exists()


def build_other_tokenizer():
    from mathrl.model.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.add_tokens(["<think>"])
    return tok


def test_cli_reads_base_and_template_from_the_run_config(run_dir, tmp_path):
    # With --run and no --base, the starting model is the run's config.yaml model.path; a run with
    # data.template: chat rendered its prompts with special tokens inside, so they are not added again.
    import shutil

    from mathrl.config import dump_yaml, load_config

    run = tmp_path / "run"
    shutil.copytree(run_dir / "run", run)
    cfg = load_config(None, [f"model.path={run_dir / 'base'}", "data.template=chat"])
    (run / "config.yaml").write_text(dump_yaml(cfg))
    out = tmp_path / "x.html"
    rc, text = run_cli(["--run", str(run), "--step", "1", "--out", str(out)])
    assert rc == 0, text
    page = out.read_text(encoding="utf-8")
    assert f"base <span class=\"mono\">{run_dir / 'base'}</span>" in page
    assert "prompt tokenized without special tokens" in page


def test_cli_survives_an_unreadable_run_config(run_dir, tmp_path):
    # A run written by another mathrl version may hold keys this one rejects; with --base given, the
    # config is only a convenience, so the command says so and goes on.
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir / "run", run)
    (run / "config.yaml").write_text("rollout:\n  nn: 3\n")
    rc, text = run_cli(["--base", str(run_dir / "base"), "--run", str(run), "--out", str(tmp_path / "x.html")])
    assert rc == 0, text
    assert "could not read" in text


# ---------------------------------------------------------------------------- tool episodes

# A tool episode's response: the model's turn, the tool's output (forced into the transcript, not
# sampled, in no loss), the model's last turn. Character tokens, so each piece is len(piece) tokens.
TOOL_TURNS = [("calc(2+3)\n", 0), ("<out>5</out>\n", 1), ("so \\boxed{5}", 0)]


def tool_record(tokenizer, *, observation: bool = True) -> dict:
    ids, mask = [], []
    for text, tool in TOOL_TURNS:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        mask += [tool] * len(piece)
    ids.append(tokenizer.eos_token_id)
    mask.append(0)
    rec = {"step": 1, "problem_id": "t0", "prompt": PROMPT, "response": "".join(t for t, _ in TOOL_TURNS),
           "reward": 1.0, "reason": "correct", "token_ids": ids, "tokens": tokenizer.convert_ids_to_tokens(ids),
           "logprobs": [0.0] * len(ids)}
    if observation:
        rec |= {"observation": mask, "tool_calls": 1}
    return rec


def test_compare_leaves_tool_output_out_of_every_statistic():
    # Tool output at positions 0 (over-confident), 1 and 7 (moved): counted nowhere. Computed two ways:
    # (a) the masked comparison equals the comparison of the sampled tokens alone (positions mapped back);
    # (b) the tool tokens' log-probs and entropies changed wildly change no statistic.
    tool = [0, 1, 7]
    mask = torch.zeros(len(HAND), dtype=torch.bool)
    mask[tool] = True
    keep = [i for i in range(len(HAND)) if i not in tool]

    def masked(base: TokenScores, rl: TokenScores):
        base.observation, rl.observation = mask.clone(), mask.clone()
        c = compare(base, rl, threshold=0.1, top_k=5)
        probe = probe_checkpoint(None, None, base.prompt, base.token_ids, name="base", entropy_k=3, scores=base)
        return c, exploration_table(comparison=c), probe

    def stats(c, exploration, probe):
        return ({k: vars(s) for k, s in c.summary.items()}, c.top_moved, c.moved.tolist(), c.overconfident.tolist(),
                [(r.n_base, r.n_rl) for r in exploration], [e.position for e in probe.top_positions],
                probe.mean_entropy, float(c.delta_logp[c.sampled].sum()))

    c, exploration, probe = masked(*hand_scores())
    assert c.observation.tolist() == mask.tolist() and c.sampled.sum() == len(keep)
    assert not set(tool) & set(c.top_moved) and not c.moved[mask].any() and not c.overconfident[mask].any()
    assert not set(tool) & {e.position for e in probe.top_positions}

    # (a) against the response with the tool tokens cut out
    def cut(s: TokenScores) -> TokenScores:
        return TokenScores(prompt=s.prompt, prompt_ids=s.prompt_ids, token_ids=[s.token_ids[i] for i in keep],
                           tokens=[s.tokens[i] for i in keep], logprobs=s.logprobs[keep], entropy=s.entropy[keep])

    base, rl = hand_scores()
    ref = compare(cut(base), cut(rl), threshold=0.1, top_k=5)
    assert {k: vars(s) for k, s in c.summary.items()} == {k: vars(s) for k, s in ref.summary.items()}
    assert c.top_moved == [keep[i] for i in ref.top_moved]
    assert [(r.n_base, r.n_rl) for r in exploration] == [(r.n_base, r.n_rl) for r in exploration_table(comparison=ref)]
    assert probe.mean_entropy == pytest.approx(float(cut(base).entropy.mean()))

    # (b) the tool tokens' numbers made extreme, each way
    base, rl = hand_scores()
    for s, value in ((base, math.log(1e-6)), (rl, 0.0)):  # p_base 1e-6 -> p_rl 1: a huge move, over-confident-like
        s.logprobs[mask] = value
        s.entropy[mask] = 50.0  # far above every sampled token's entropy
    assert stats(*masked(base, rl)) == stats(c, exploration, probe)
    base, rl = hand_scores()
    base.logprobs[mask], rl.logprobs[mask] = 0.0, math.log(1e-6)
    assert stats(*masked(base, rl)) == stats(c, exploration, probe)


def test_compare_without_a_mask_counts_every_token():
    # a response with no tool output: an all-zero mask and no mask give the same comparison
    base, rl = hand_scores()
    plain = compare(base, rl, top_k=5)
    base.observation = rl.observation = torch.zeros(len(HAND), dtype=torch.bool)
    zeros = compare(base, rl, top_k=5)
    assert {k: vars(s) for k, s in plain.summary.items()} == {k: vars(s) for k, s in zeros.summary.items()}
    assert plain.top_moved == zeros.top_moved and plain.summary["all"].n_tokens == len(HAND)
    assert not plain.observation.any()
    base.observation = torch.ones(len(HAND), dtype=torch.bool)
    with pytest.raises(ValueError, match="different tokens as tool output"):
        compare(base, rl)


def test_context_segments_mark_tool_output():
    tokens = ["a", "b", "<o", "ut>", "c", "d"]
    mask = torch.tensor([0, 0, 1, 1, 0, 0], dtype=torch.bool)
    assert context_segments("Q:", tokens, 5, 20, observation=mask) == [("Q:ab", False), ("<out>", True), ("c", False)]
    assert context_segments("Q:", tokens, 5, 4, observation=mask) == [("ut>", True), ("c", False)]  # cut mid-token
    for position in range(len(tokens)):
        for width in (1, 3, 6, 20):
            for m in (mask, None):
                got = context_segments("Q: 1+1=", tokens, position, width, observation=m)
                assert "".join(t for t, _ in got) == context_text("Q: 1+1=", tokens, position, width)


def test_token_probs_scores_tool_output_as_context(pair, char_tokenizer):
    # The mask changes no score: tool tokens stay in place, so later positions are what training saw.
    rec = tool_record(char_tokenizer)
    plain = token_probs(pair[0], char_tokenizer, PROMPT, rec["token_ids"])
    masked = token_probs(pair[0], char_tokenizer, PROMPT, rec["token_ids"], observation=rec["observation"])
    assert torch.equal(plain.logprobs, masked.logprobs) and torch.equal(plain.entropy, masked.entropy)
    assert masked.observation.tolist() == [bool(x) for x in rec["observation"]] and plain.observation is None
    with pytest.raises(ValueError, match="one 0/1 entry per token"):
        token_probs(pair[0], char_tokenizer, PROMPT, rec["token_ids"], observation=rec["observation"][:-1])


def _inspect_record(run_dir, tmp_path, name: str, rec: dict, *extra: str) -> tuple[int, str, str]:
    path = tmp_path / name / "rollouts.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps(rec) + "\n")
    out = tmp_path / name / "inspect.html"
    rc, text = run_cli(["--base", str(run_dir / "base"), "--model", str(run_dir / "run" / "final"),
                        "--rollouts", str(path), "--out", str(out), *extra])
    return rc, text, out.read_text(encoding="utf-8") if rc == 0 else ""


def test_cli_shows_tool_output_apart(run_dir, tmp_path, char_tokenizer):
    rec = tool_record(char_tokenizer)
    tool_positions = [i for i, m in enumerate(rec["observation"]) if m]
    n_sampled = len(rec["token_ids"]) - len(tool_positions)
    rc, text, page = _inspect_record(run_dir, tmp_path, "tool", rec, "--entropy-k", "40")
    assert rc == 0, text
    spans = re.findall(r'<span class="(t[^"]*)" style="[^"]*" title="([^"]*)">([^<]*)</span>', page)
    assert len(spans) == 3 * len(rec["token_ids"])  # base map, RL map, change view
    for view in range(3):
        tool = [i for i, (cls, _, _) in enumerate(spans[view * len(rec["token_ids"]):][:len(rec["token_ids"])])
                if "obs" in cls.split()]
        assert tool == tool_positions, view
    for cls, title, _ in spans:
        assert ("obs" in cls.split()) == title.startswith("tool output (not sampled, in no loss)")
        if "obs" in cls.split():
            assert "oc" not in cls.split() and "top" not in cls.split()
    assert ".t.obs" in page and "written by a tool" in page
    # the class table counts only the sampled tokens ("all" row: tokens column)
    all_row = re.search(r'<tr><td class="l">all</td><td>(\d+)</td>', page)
    assert int(all_row[1]) == n_sampled
    # --entropy-k beyond the sampled count: every probe lists the sampled positions only
    probe_positions = re.findall(r'<tr><td>(\d+)</td><td class="l"><span class="mono">', page)
    assert probe_positions and not {int(p) for p in probe_positions} & set(tool_positions)
    assert re.search(r'<span class="obs">[^<]*</span>', page)  # tool output marked inside a context cell
    # the console lists the tool span and counts the sampled tokens
    assert f"{n_sampled} sampled tokens (+ {len(tool_positions)} written by a tool)" in text
    assert f"tool {tool_positions[0]}..{tool_positions[-1]}" in text


def test_cli_record_without_observation_renders_as_before(run_dir, tmp_path, char_tokenizer):
    # No `observation` field: every token counts and nothing is marked as tool output; an all-zero
    # mask gives the very same page, byte for byte.
    rec = tool_record(char_tokenizer, observation=False)
    rc, text, page = _inspect_record(run_dir, tmp_path, "plain", rec)
    assert rc == 0, text
    assert not re.search(r'class="[^"]*\bobs\b', page) and ".obs" not in page and "tool output" not in page
    all_row = re.search(r'<tr><td class="l">all</td><td>(\d+)</td>', page)
    assert int(all_row[1]) == len(rec["token_ids"])
    zero_mask = {"observation": [0] * len(rec["token_ids"])}
    rc, text_zeros, zeros = _inspect_record(run_dir, tmp_path, "zeros", rec | zero_mask)
    assert rc == 0 and zeros.replace("zeros", "plain") == page
    assert "written by a tool" not in text and "written by a tool" not in text_zeros
    # a mask that does not fit the tokens is a worded error
    rc, text, _ = _inspect_record(run_dir, tmp_path, "bad", rec | {"observation": [0, 1]})
    assert rc == 1 and "'observation' field does not fit" in text
