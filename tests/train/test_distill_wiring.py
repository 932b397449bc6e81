"""On-policy distillation's wiring in the step (train/step.py, train/update.py, train/teacher.py), on hand-made rows:

- the distillation terms read the loss mask: a tool observation and a token a correction dropped (response_mask 1,
  loss_mask 0) carry no signal, in the loss, its gradient or the logged value;
- with teacher.self the step hands the teacher its own prompts (the answer beside the question); with a teacher
  model, none;
- algo.distill.reward_weight scales the task's advantage;
- a teacher model whose tokenizer is not the student's is refused when it is loaded, naming both;
- a row-scoring teacher's answer (a server's, vLLM's) is checked on every pass, and the step's distill/* metrics
  are means over the loss mask.
"""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch

from mathrl.config import Config
from mathrl.registry import LOSS_TERMS
from mathrl.tasks.base import Problem
from mathrl.tasks.prompts import PromptEncoder
from mathrl.train.batching import Rows, TrainBatch
from mathrl.train.teacher import teacher_scores
from mathrl.train.teacher_rows import RowTeacher
from mathrl.train.update import TermInputs

# one row of 4 tokens: a model token, a tool observation, a model token a correction dropped, a model token
RESPONSE = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
OBSERVATION = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
LOSS = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
OLD = torch.tensor([[-1.0, 0.0, -0.7, -0.4]])
TEACHER = torch.tensor([[-0.2, 0.0, -3.0, -2.0]])
OUTSIDE = torch.tensor([[0.0, 1.0, 1.0, 0.0]]).bool()  # the positions that must carry nothing


def term_inputs(mode: str, teacher: torch.Tensor, teacher_top: torch.Tensor, policy_top: torch.Tensor,
                logprobs: torch.Tensor) -> TermInputs:
    cfg = Config()
    cfg.algo.distill.mode, cfg.algo.distill.beta = mode, 0.5
    n, t = RESPONSE.shape
    micro = TrainBatch(prompt_ids=torch.ones(n, 1, dtype=torch.long), prompt_mask=torch.ones(n, 1, dtype=torch.long),
                       response_ids=torch.ones(n, t, dtype=torch.long), response_mask=RESPONSE, loss_mask=LOSS,
                       observation_mask=OBSERVATION, correct=torch.zeros(n), rollout_logprobs=OLD, old_logprobs=OLD,
                       advantages=torch.zeros(n, t), ref_logprobs=torch.zeros(n, t), ref_entropy=torch.zeros(n, t),
                       teacher_logprobs=teacher, teacher_topk_ids=torch.zeros(n, t, 2, dtype=torch.long),
                       teacher_topk_logprobs=teacher_top)
    return TermInputs(algo=cfg.algo, max_len=8, seed=0, micro=micro, logprobs=logprobs, entropy=torch.zeros(n, t),
                      mask=micro.loss_mask, num_tokens=float(LOSS.sum()), num_seqs=1.0, pos_tokens=0.0, pos_seqs=0.0,
                      coefs={"entropy": 0.0, "kl": 0.0}, topk_logprobs=policy_top)


def run_term(name: str, mode: str, *, outside: float):
    """The term's (loss, logged value, grad wrt logprobs, grad wrt the policy's top-k) with the teacher's values at
    the positions outside the loss mask moved by `outside`."""
    shift = OUTSIDE.float() * outside
    teacher = TEACHER - shift.abs()
    teacher_top = torch.log_softmax(torch.tensor([[[2.0, 0.0], [0.0, 0.0], [-1.0, 1.0], [0.5, 0.0]]]) + shift[..., None]
                                    * torch.tensor([1.0, -1.0]), -1)
    policy_top = torch.log_softmax(torch.tensor([[[0.0, 1.0], [1.0, 0.0], [2.0, 0.0], [0.0, 0.3]]]), -1).requires_grad_(True)
    logprobs = (OLD + torch.tensor([[0.1, 0.0, -0.2, 0.05]])).requires_grad_(True)
    term = LOSS_TERMS.get(name).fn(term_inputs(mode, teacher, teacher_top, policy_top, logprobs))
    g_lp, g_top = torch.autograd.grad(term.loss, [logprobs, policy_top], allow_unused=True)
    return term.loss.detach(), term.value, g_lp, g_top


@pytest.mark.parametrize("name, mode, why", [
    ("distill_reverse_kl", "reverse_kl", "the advantage and its logged mean count only the loss mask's tokens"),
    ("distill_forward_kl_topk", "forward_kl_topk", "the direct loss is aggregated over the loss mask, not the context"),
    ("distill_jsd", "jsd", "the same for the generalized JSD"),
])
def test_distillation_terms_read_the_loss_mask(name, mode, why):
    loss, value, g_lp, g_top = run_term(name, mode, outside=0.0)
    moved_loss, moved_value, _, _ = run_term(name, mode, outside=5.0)
    assert float(moved_loss) == pytest.approx(float(loss), abs=1e-7), why
    assert moved_value == pytest.approx(value, abs=1e-7), why
    for grad in (g_lp, g_top):
        if grad is not None:
            assert torch.count_nonzero(grad[OUTSIDE]) == 0, why
    if mode == "reverse_kl":  # the logged value by hand: -(sum over the 2 counted tokens of (teacher - sampler)) / 2
        assert value == pytest.approx(-((-0.2 + 1.0) + (-2.0 + 0.4)) / 2, abs=1e-6), why


# ----------------------------------------------------------------------------- the step's teacher prompts
@pytest.mark.parametrize("self_, expected, why", [
    (True, ["46:12+34=", "46:12+34=", "12:7+5=", "12:7+5="],
     "teacher.self: the teacher reads teacher.context (the answer, then the question), n rows per problem"),
    (False, None, "a teacher model reads the student's own rows: no prompts of its own"),
])
def test_the_step_gives_the_teacher_its_own_prompts(char_tokenizer, monkeypatch, self_, expected, why):
    from mathrl.train import step

    calls = []
    monkeypatch.setattr(step, "teacher_scores", lambda model, batch, cfg, *, rows, prompts: calls.append((batch, prompts)))
    cfg = Config()
    cfg.algo.distill.mode, cfg.rollout.n, cfg.teacher.context = "reverse_kl", 2, "{answer}:{question}"
    cfg.teacher.self = self_
    encoder = PromptEncoder(char_tokenizer, template="arith", max_prompt_tokens=64, max_new_tokens=16)
    trainer = SimpleNamespace(cfg=cfg, train_stream=SimpleNamespace(encoder=encoder), tokenizer=char_tokenizer,
                              teacher=lambda: contextlib.nullcontext("model"))
    got = SimpleNamespace(problems=[Problem("a", "12+34", "46"), Problem("b", "7+5", "12")])
    student = Rows(prompt_ids=torch.tensor([[7, 8, 9]] * 4), prompt_mask=torch.ones(4, 3, dtype=torch.long),
                   response_ids=torch.ones(4, 2, dtype=torch.long), response_mask=torch.ones(4, 2),
                   loss_mask=torch.ones(4, 2), correct=torch.zeros(4), rollout_logprobs=torch.zeros(4, 2))
    step.score_teacher(trainer, got, SimpleNamespace(batch=student, rows=None))
    ((batch, prompts),) = calls
    assert batch is student and batch.prompt_ids.tolist() == [[7, 8, 9]] * 4, "the student's rows are left as they were"
    assert batch.prompt_mask.tolist() == [[1, 1, 1]] * 4, why
    if expected is None:
        assert prompts is None, why
    else:
        ids, mask = prompts
        assert [char_tokenizer.decode(r[m.bool()]) for r, m in zip(ids, mask)] == expected, why


# ----------------------------------------------------------------------------- algo.distill.reward_weight
@pytest.mark.parametrize("weight, expected, why", [
    (0.0, [0.0, 0.0, 0.0, 0.0], "0 (the default): distillation alone, the task's advantage is 0"),
    (0.5, [0.5, -0.5, 0.0, 0.0], "half of RLOO's (1 - 0, 0 - 1) and (1 - 1, 1 - 1)"),
    (1.0, [1.0, -1.0, 0.0, 0.0], "1: the task's advantage as it is"),
])
def test_reward_weight_scales_the_tasks_advantage(weight, expected, why):
    from mathrl.train import step

    cfg = Config()
    cfg.algo.distill.mode, cfg.algo.distill.reward_weight, cfg.algo.adv.estimator = "reverse_kl", weight, "rloo"
    cfg.rollout.n, cfg.teacher.path = 2, "teacher"
    mask = torch.tensor([[1.0, 1.0, 0.0]] * 4)
    trainer = SimpleNamespace(cfg=cfg, critic=None)
    got = SimpleNamespace(problems=["p", "q"], rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]), scores=None,
                          greedy_rewards=None)
    prep = SimpleNamespace(batch=SimpleNamespace(response_mask=mask), rows=None)
    out = step.advantages(trainer, got, prep, SimpleNamespace(loss_mask=mask), coefs={"entropy": 0.0, "kl": 0.0})
    torch.testing.assert_close(out.advantages, torch.tensor(expected)[:, None] * mask, msg=why)


# ----------------------------------------------------------------------------- the teacher's vocabulary at load
def test_a_teacher_model_of_another_tokenizer_is_refused_at_load(make_tiny_qwen2, char_tokenizer, tmp_path):
    # why: the config rule compares vocabulary sizes only; a teacher of the same size whose ids mean other tokens
    # is refused when it is loaded, in one line naming both vocabularies
    from mathrl.train.teacher import load_teacher

    make_tiny_qwen2(seed=0).save_pretrained(tmp_path / "teacher")
    char_tokenizer.save_pretrained(tmp_path / "teacher")
    cfg = Config()
    cfg.algo.distill.mode, cfg.teacher.path = "reverse_kl", str(tmp_path / "teacher")
    vocab = char_tokenizer.get_vocab()
    swapped = {**vocab, "a": vocab["b"], "b": vocab["a"]}
    with pytest.raises(ValueError) as err:
        load_teacher(cfg, model_path="student", ref_source="student", overrides=None, student_vocab=swapped)
    (line,) = str(err.value).splitlines()
    assert f"{len(vocab)} tokens" in line and "'student'" in line and "same tokenizer" in line
    assert load_teacher(cfg, model_path="student", ref_source="student", overrides=None, student_vocab=vocab) is not None


# ----------------------------------------------------------------------------- a row-scoring teacher's answers
class CannedTeacher(RowTeacher):
    """A row-scoring teacher that answers what it is given (a server's answer, as the client reads it)."""

    vocab_size, where = 10, "the canned teacher"

    def __init__(self, answer: dict):
        self.answer = answer

    def score(self, prompts, responses, *, temperature, k):
        return self.answer


def one_row() -> Rows:
    """The row above as the step holds it: a 2-token prompt, then the 4 response tokens."""
    return Rows(prompt_ids=torch.tensor([[1, 2]]), prompt_mask=torch.ones(1, 2, dtype=torch.long),
                response_ids=torch.tensor([[3, 4, 5, 6]]), response_mask=RESPONSE, loss_mask=LOSS,
                observation_mask=OBSERVATION, correct=torch.zeros(1),
                rollout_logprobs=torch.tensor([[-1.0, 0.0, -2.0, -0.25]]))


GOOD = {"logprobs": [[-0.5, -9.0, -3.0, -1.0]], "is_argmax": [[1.0, 1.0, 0.0, 0.0]]}


@pytest.mark.parametrize("answer, message, why", [
    ({"logprobs": GOOD["logprobs"]}, "'is_argmax' for no rows", "a key missing"),
    ({**GOOD, "logprobs": [[-0.5, -9.0, -3.0]]}, "shape (3,)", "a row shorter than the response"),
    ({**GOOD, "logprobs": [[-0.5, float("nan"), -3.0, -1.0]]}, "non-finite", "a NaN, even on an observation token"),
    ({**GOOD, "logprobs": [[-0.5, -9.0, 2.0, -1.0]]}, "above 0", "not log-probabilities"),
])
def test_every_pass_checks_the_teachers_answer(answer, message, why):
    cfg = Config()
    cfg.algo.distill.mode = "reverse_kl"
    with pytest.raises(RuntimeError) as err:
        teacher_scores(CannedTeacher(answer), one_row(), cfg)
    assert message in str(err.value) and "\n" not in str(err.value), why


def test_teacher_metrics_are_means_over_the_loss_mask():
    # why: the counted tokens are 0 and 3 (sampler -1, -0.25; teacher -0.5, -1; argmax 1, 0); the observation
    # (token 1) and the dropped token (token 2) count in none of the four
    cfg = Config()
    cfg.algo.distill.mode = "reverse_kl"
    got = teacher_scores(CannedTeacher(GOOD), one_row(), cfg)
    assert got.logprobs.tolist() == [[-0.5, 0.0, -3.0, -1.0]]  # nothing on the observation
    k3 = [math.exp(0.5) - 0.5 - 1, math.exp(-0.75) + 0.75 - 1]  # r - log r - 1, r = p_T / p_S
    assert got.metrics["distill/reverse_kl_k1"] == pytest.approx(((-1.0 + 0.5) + (-0.25 + 1.0)) / 2)
    assert got.metrics["distill/reverse_kl_k3"] == pytest.approx(sum(k3) / 2)
    assert got.metrics["distill/teacher_logprob"] == pytest.approx(-0.75)
    assert got.metrics["distill/teacher_argmax_frac"] == pytest.approx(0.5)
