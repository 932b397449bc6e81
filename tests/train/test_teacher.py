"""The distillation teacher in the trainer (train/teacher.py) and its loss terms (train/update.py):

- the teacher's logprobs of the student's tokens equal a plain Hugging Face forward of the teacher over the
  same transcript (CPU, float32, within 1e-5), single-turn and a tool episode, at a rollout temperature;
- observation and padding tokens get nothing from the teacher;
- the registered reverse_kl term is verl's k1 policy-gradient distillation (student = current) and Thinking
  Machines' (student = sampler), from the formulas written here;
- self-distillation: the answer is in the teacher's prompt ids, never in the student's;
- the config rules: one teacher per mode, the same vocabulary.
"""

from __future__ import annotations

import json

import pytest
import torch

from mathrl.config import Config, ConfigError
from mathrl.tasks.base import Problem
from mathrl.tasks.prompts import PromptEncoder
from mathrl.train.batching import Rows, TrainBatch
from mathrl.train.teacher import check_same_vocab, teacher_prompts, teacher_question, teacher_scores
from tool_plugins import EchoPool

TEMPERATURE = 0.7


def rows(tokenizer, *, tools: bool) -> Rows:
    """Two left-padded prompts and right-padded responses; with `tools`, the first response holds a tool's
    observation (mask 0 in response_mask, 1 in observation_mask) between two model turns."""
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompts = [enc("12+34="), enc("7+5=")]
    responses = [enc("46 ok"), enc("12")]
    obs = [[0] * 5, [0] * 2]
    if tools:
        responses[0] = enc("a") + enc("[9]") + enc("46")  # a model token, a 3-token observation, two model tokens
        obs[0] = [0, 1, 1, 1, 0, 0]
    p, t = max(map(len, prompts)), max(map(len, responses))
    pad = tokenizer.pad_token_id
    prompt_ids = torch.tensor([[pad] * (p - len(x)) + x for x in prompts])
    prompt_mask = torch.tensor([[0] * (p - len(x)) + [1] * len(x) for x in prompts])
    response_ids = torch.tensor([x + [pad] * (t - len(x)) for x in responses])
    observation = torch.tensor([o + [0] * (t - len(o)) for o in obs], dtype=torch.float32)
    context = torch.tensor([[1.0] * len(x) + [0.0] * (t - len(x)) for x in responses])
    return Rows(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                response_mask=context - observation, loss_mask=context - observation, correct=torch.zeros(2),
                rollout_logprobs=torch.full((2, t), -1.0), observation_mask=observation if tools else None)


def plain_forward(model, batch: Rows, i: int, temperature: float = TEMPERATURE) -> tuple[torch.Tensor, torch.Tensor]:
    """Row i's transcript (prompt without padding, then every response token, observations included) through the
    model as one unpadded sequence at `temperature`: [L] the logprob of each response token, [L, V] the
    distributions predicting them."""
    prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()]
    length = int(batch.context_mask[i].sum())
    response = batch.response_ids[i, :length]
    with torch.no_grad():
        logits = model(torch.cat([prompt, response])[None]).logits[0].float() / temperature
    logp = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + length], -1)  # [L, V]
    return logp.gather(-1, response[:, None])[:, 0], logp


@pytest.mark.parametrize("tools", [False, True], ids=["single_turn", "tool_episode"])
@pytest.mark.parametrize("mode", ["reverse_kl", "jsd"])
def test_teacher_logprobs_equal_a_plain_forward(make_tiny_qwen2, char_tokenizer, tools, mode):
    teacher = make_tiny_qwen2(seed=3)
    batch = rows(char_tokenizer, tools=tools)
    cfg = Config()
    cfg.algo.distill.mode, cfg.algo.distill.topk, cfg.rollout.temperature = mode, 5, TEMPERATURE
    cfg.train.micro_batch_tokens = 8  # several micro-batches
    got = teacher_scores(teacher, batch, cfg)
    largest = 0.0
    for i in range(len(batch)):
        lp, dist = plain_forward(teacher, batch, i)
        model_tokens = batch.response_mask[i, : len(lp)].bool()
        largest = max(largest, float((got.logprobs[i, : len(lp)] - lp)[model_tokens].abs().max()))
        assert torch.all(got.logprobs[i, : len(lp)][~model_tokens] == 0)  # observations: no signal
        argmax = (dist.argmax(-1) == batch.response_ids[i, : len(lp)]).float()
        assert torch.equal(got.is_argmax[i, : len(lp)][model_tokens], argmax[model_tokens])
        if mode == "jsd":
            top_lp, _ = dist.topk(5, -1)
            torch.testing.assert_close(got.topk_logprobs[i, : len(lp)][model_tokens], top_lp[model_tokens],
                                       atol=1e-5, rtol=0)
            assert torch.all(got.topk_logprobs[i, : len(lp)][~model_tokens] == 0)
        else:
            assert got.topk_ids is None
    assert largest < 1e-5, largest


@pytest.mark.parametrize("tools", [False, True], ids=["single_turn", "tool_episode"])
def test_teacher_logprobs_of_the_torch_engines_samples(make_tiny_qwen2, char_tokenizer, tools):
    # why: the transcripts the torch engine writes (left-padded prompts, observations forced into the context)
    # are what the teacher scores in training; its logprobs there equal a plain forward of each whole transcript
    from mathrl.rollout.engine import TorchEngine
    from mathrl.rollout.episodes import CallFormat, ToolUse

    student, teacher = make_tiny_qwen2(seed=1), make_tiny_qwen2(seed=4)
    star = char_tokenizer("*", add_special_tokens=False)["input_ids"][0]
    with torch.no_grad():
        student.lm_head.weight[star] *= 3.0  # calls (a closing "*") come often
    use = ToolUse(fmt=CallFormat("star", "", "*", "<", ">"), pool=EchoPool(), tokenizer=char_tokenizer, max_turns=3,
                  max_tool_calls=2, observation_max_tokens=12) if tools else None
    engine = TorchEngine(student, eos_token_id=char_tokenizer.eos_token_id, pad_token_id=char_tokenizer.pad_token_id,
                         tools=use)
    prompts = [char_tokenizer(t)["input_ids"] for t in ["1+2=", "123+456=", "9=", "77+8="]]
    out = engine.generate(prompts, max_new_tokens=24, seed=0, temperature=TEMPERATURE)
    if tools:
        assert int((out.observation_mask.sum(-1) > 0).sum()) >= 1, "the student should call a tool"
    batch = Rows(prompt_ids=out.prompt_ids, prompt_mask=out.prompt_mask, response_ids=out.response_ids,
                 response_mask=out.response_mask, loss_mask=out.response_mask, correct=torch.zeros(len(out)),
                 rollout_logprobs=out.rollout_logprobs, observation_mask=out.observation_mask if tools else None)
    cfg = Config()
    cfg.algo.distill.mode, cfg.rollout.temperature = "reverse_kl", TEMPERATURE
    got = teacher_scores(teacher, batch, cfg)
    largest = 0.0
    for i in range(len(batch)):
        lp, _ = plain_forward(teacher, batch, i)
        model_tokens = batch.response_mask[i, : len(lp)].bool()
        largest = max(largest, float((got.logprobs[i, : len(lp)] - lp)[model_tokens].abs().max()))
        assert torch.all(got.logprobs[i, : len(lp)][~model_tokens] == 0)
    assert largest < 1e-5, largest


def test_teacher_pass_micro_batch_split_invariant(make_tiny_qwen2, char_tokenizer):
    # why: the pass cuts the rows into micro-batches by a token budget; the scores must not depend on the cut
    teacher, batch, cfg = make_tiny_qwen2(seed=3), rows(char_tokenizer, tools=True), Config()
    cfg.algo.distill.mode, cfg.algo.distill.topk = "forward_kl_topk", 4
    whole = teacher_scores(teacher, batch, cfg)
    cfg.train.micro_batch_tokens = 4
    split = teacher_scores(teacher, batch, cfg)
    torch.testing.assert_close(whole.logprobs, split.logprobs, atol=1e-6, rtol=0)
    assert torch.equal(whole.topk_ids, split.topk_ids)


# ----------------------------------------------------------------------------- the reverse_kl loss term
def micro_batch(student_old: torch.Tensor, sampler: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor):
    n, t = mask.shape
    return TrainBatch(prompt_ids=torch.ones(n, 1, dtype=torch.long), prompt_mask=torch.ones(n, 1, dtype=torch.long),
                      response_ids=torch.ones(n, t, dtype=torch.long), response_mask=mask, loss_mask=mask,
                      correct=torch.zeros(n), rollout_logprobs=sampler, old_logprobs=student_old,
                      advantages=torch.zeros(n, t), ref_logprobs=torch.zeros(n, t), ref_entropy=torch.zeros(n, t),
                      teacher_logprobs=teacher)


def ppo_clip_formula(logprobs, old, adv, eps_low=0.2, eps_high=0.28):
    ratio = torch.exp(logprobs - old)
    return torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - eps_low, 1 + eps_high))


@pytest.mark.parametrize("student", ["current", "sampler"])
def test_reverse_kl_term(student):
    # why: "current" is verl's use_policy_gradient with k1 (advantage -(log pi_theta - log pi_T), detached, at each
    # micro-batch); "sampler" is Thinking Machines' (the sampling logprobs); both through ppo_clip, token-mean
    from mathrl.registry import LOSS_TERMS
    from mathrl.train.update import TermInputs

    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    old = torch.tensor([[-1.0, -0.5, 0.0], [-2.0, -0.3, -1.2]])
    sampler = old + torch.tensor([[0.1, -0.2, 0.0], [0.0, 0.3, -0.1]])
    teacher = torch.tensor([[-0.2, -2.0, -5.0], [-1.0, -0.1, -3.0]])
    logprobs = (old + torch.tensor([[0.4, 0.0, 0.0], [-0.5, 0.1, 0.0]])).requires_grad_(True)  # ratios off 1
    cfg = Config()
    cfg.algo.distill.mode, cfg.algo.distill.student = "reverse_kl", student
    x = TermInputs(algo=cfg.algo, max_len=8, seed=0, micro=micro_batch(old, sampler, teacher, mask), logprobs=logprobs,
                   entropy=torch.zeros_like(mask), mask=mask, num_tokens=5.0, num_seqs=2.0, pos_tokens=0.0, pos_seqs=0.0,
                   coefs={"entropy": 0.0, "kl": 0.0})
    term = LOSS_TERMS.get("distill_reverse_kl").fn(x)
    loss, logged = term.loss, term.value
    s = logprobs.detach() if student == "current" else sampler
    adv = (teacher - s) * mask
    expected = (ppo_clip_formula(logprobs, old, adv) * mask).sum() / 5.0
    torch.testing.assert_close(loss, expected)
    grad, = torch.autograd.grad(loss, logprobs)
    expected_grad, = torch.autograd.grad(expected, logprobs)
    torch.testing.assert_close(grad, expected_grad)
    assert logged == pytest.approx(float(-(adv.sum()) / 5.0))
    assert grad[0, 2] == 0  # a masked token gets no gradient


# ----------------------------------------------------------------------------- self-distillation prompts
def test_self_distillation_answer_only_in_the_teachers_prompt(char_tokenizer):
    problems = [Problem("a", "12+34", "46"), Problem("b", "7+5", "12", meta={"solution": "7+5=12"})]
    encoder = PromptEncoder(char_tokenizer, template="arith", max_prompt_tokens=64, max_new_tokens=16)
    _, student_ids, _ = encoder.encode(problems)
    ids, mask = teacher_prompts(problems, n=2, encoder=encoder, tokenizer=char_tokenizer, context="{solution}|{question}")
    assert ids.shape[0] == 4  # each problem's prompt for its n samples
    decoded = [char_tokenizer.decode(row[m.bool()]) for row, m in zip(ids, mask)]
    assert decoded == ["46|12+34=", "46|12+34=", "7+5=12|7+5=", "7+5=12|7+5="]
    # on the token ids: the teacher's prompt is the answer's ids, then the student's prompt; the student's has no answer
    answer = char_tokenizer("46|", add_special_tokens=False)["input_ids"]
    assert ids[0][mask[0].bool()].tolist() == answer + student_ids[0]
    assert char_tokenizer("|", add_special_tokens=False)["input_ids"][0] not in student_ids[0]
    assert student_ids[0] == char_tokenizer("12+34=", add_special_tokens=False)["input_ids"]


def test_self_distillation_teacher_scores_from_its_own_prompt(make_tiny_qwen2, char_tokenizer):
    # why: the teacher reads the answer-bearing prompt, the student's rows are left as they were: the teacher's
    # logprobs are a plain forward of (teacher prompt + the student's response), not of the student's transcript
    model = make_tiny_qwen2(seed=3)
    batch = rows(char_tokenizer, tools=False)
    before = batch.prompt_ids.clone()
    problems = [Problem("a", "12+34", "46"), Problem("b", "7+5", "12")]
    encoder = PromptEncoder(char_tokenizer, template="arith", max_prompt_tokens=64, max_new_tokens=16)
    prompts = teacher_prompts(problems, n=1, encoder=encoder, tokenizer=char_tokenizer, context="{answer}:{question}")
    cfg = Config()
    cfg.algo.distill.mode, cfg.rollout.temperature = "reverse_kl", TEMPERATURE
    got = teacher_scores(model, batch, cfg, prompts=prompts)
    plain = teacher_scores(model, batch, cfg)
    assert torch.equal(batch.prompt_ids, before)
    seen = Rows(**{**batch.tensors(), "prompt_ids": prompts[0], "prompt_mask": prompts[1]})
    for i in range(len(batch)):
        lp, _ = plain_forward(model, seen, i)
        torch.testing.assert_close(got.logprobs[i, : len(lp)], lp * batch.response_mask[i, : len(lp)], atol=1e-5, rtol=0)
    assert (got.logprobs - plain.logprobs).abs().max() > 1e-3  # the answer in the prompt changed what it predicts


@pytest.mark.parametrize("context, expected, why", [
    ("{answer}:{question}", "46:1{answer}", "a question holding a placeholder is not substituted again"),
    ("{question} {solution}", "1{answer} 46", "no solution in the data: the answer stands in"),
    ("\\frac{1}{2} {answer}", "\\frac{1}{2} 46", "other braces (LaTeX) are kept as they are"),
])
def test_teacher_question(context, expected, why):
    assert teacher_question(Problem("p", "1{answer}", "46"), context) == expected, why


# ----------------------------------------------------------------------------- config rules
@pytest.mark.parametrize("settings, message", [
    ({"mode": "reverse_kl"}, "needs exactly one teacher"),
    ({"mode": "jsd", "path": "x", "self": True}, "not teacher.path and teacher.self"),
    ({"path": "somewhere"}, "algo.distill.mode is none"),
    ({"mode": "reverse_kl", "self_update": True}, "teacher.self_update=true needs teacher.self=true"),
    ({"mode": "reverse_kl", "self": True, "context": "hint: {question}"}, "put {answer} or {solution}"),
])
def test_teacher_rules(settings, message):
    cfg = Config()
    cfg.algo.distill.mode = settings.pop("mode", "none")
    for key, value in settings.items():
        setattr(cfg.teacher, key, value)
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
        cfg.validate(check_paths=False)


def test_self_distillation_config_is_valid():
    cfg = Config()
    cfg.algo.distill.mode, cfg.teacher.self = "reverse_kl", True
    cfg.validate(check_paths=False)


def test_another_vocabulary_is_a_one_line_error_naming_both(tmp_path):
    from mathrl.config.rules import vocab_errors

    for name, size in (("teacher", 151936), ("student", 99)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"vocab_size": size}))
    errors = vocab_errors(str(tmp_path / "teacher"), str(tmp_path / "student"))
    assert len(errors) == 1 and "\n" not in errors[0]
    assert "151936" in errors[0] and "99" in errors[0] and "same tokenizer" in errors[0]
    (tmp_path / "student" / "config.json").write_text(json.dumps({"vocab_size": 151936}))
    assert vocab_errors(str(tmp_path / "teacher"), str(tmp_path / "student")) == []


def test_a_teacher_of_another_vocabulary_is_refused_before_loading(make_tiny_qwen2, char_tokenizer, tmp_path):
    # why: the whole config path, from the overrides: model directories on disk, the student's vocabulary of 99
    # tokens, a teacher's padded to 128 (another tokenizer): one line, both sizes, before any model loads
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mathrl.config import load_config
    from mathrl.model.tiny import build_char_tokenizer

    student = make_tiny_qwen2(seed=0)
    student.save_pretrained(tmp_path / "student")
    char_tokenizer.save_pretrained(tmp_path / "student")
    wide = build_char_tokenizer(vocab_size=128)
    config = Qwen2Config(**{**student.config.to_dict(), "vocab_size": len(wide)})
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "teacher")
    wide.save_pretrained(tmp_path / "teacher")
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"model.path={tmp_path / 'student'}", f"teacher.path={tmp_path / 'teacher'}",
                           "algo.distill.mode=reverse_kl"])
    (line,) = str(err.value).splitlines()
    assert f"{len(wide)} tokens" in line and f"{len(char_tokenizer)}" in line and "same tokenizer" in line


def test_same_size_another_tokenizer_is_refused(char_tokenizer):
    # why: equal sizes are not enough: the ids must mean the same tokens
    vocab = char_tokenizer.get_vocab()
    swapped = {**vocab, "a": vocab["b"], "b": vocab["a"]}
    with pytest.raises(ValueError, match=f"{len(vocab)} tokens"):
        check_same_vocab("t", swapped, len(vocab), "s", vocab)
    check_same_vocab("t", dict(vocab), len(vocab), "s", vocab)
