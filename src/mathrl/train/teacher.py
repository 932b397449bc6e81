"""The teacher of on-policy distillation (algo.distill.mode, the `teacher` section): loaded frozen in the
trainer, it scores the student's own tokens through the same no-grad pass as the reference model
(`passes.per_token_pass`), one more scoring pass of the step, never a second rollout.

    teacher = load_teacher(cfg, model_path=..., ref_source=..., overrides=..., student_vocab=...)  # build_trainer
    scores = teacher_scores(model, rows, cfg, problems=..., encoder=..., tokenizer=...)          # train/step.py:score

Self-distillation (teacher.self) is the same pass with the model itself as the teacher, its prompt made of
teacher.context (the reference answer or solution beside the question), the student's prompt unchanged:
the answer is in the teacher's prompt ids only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from mathrl.algo.distill import teacher_stats
from mathrl.config import Config
from mathrl.model.dtypes import trainer_dtype
from mathrl.model.io import load_model_and_tokenizer
from mathrl.model.scoring import response_topk
from mathrl.rollout.base import left_pad
from mathrl.train.batching import Rows
from mathrl.train.passes import per_token_pass
from mathrl.train.teacher_remote import connect_teacher
from mathrl.train.teacher_rows import RowTeacher

DIRECT_MODES = ("forward_kl_topk", "jsd")  # the modes that read the teacher's top-k distribution


@dataclass
class TeacherScores:
    """The teacher's view of the step's N rows (all [N, T] or [N, T, K], 0 at masked positions)."""

    logprobs: torch.Tensor  # [N, T] its logprobs of the sampled tokens
    is_argmax: torch.Tensor  # [N, T] 1 where the sampled token is its most likely one
    topk_ids: torch.Tensor | None  # [N, T, K] long, its top-k ids (forward_kl_topk, jsd); None otherwise
    topk_logprobs: torch.Tensor | None  # [N, T, K]
    metrics: dict[str, float]  # distill/*


def load_teacher(cfg: Config, *, model_path: str, ref_source, overrides: dict | None, student_vocab: dict[str, int]):
    """The frozen teacher model, or a `RemoteTeacher` client (teacher.url), or a `VLLMTeacher` (teacher.engine=vllm);
    None when the current policy is the teacher (teacher.self_update) or no mode needs one: teacher.path's model,
    or (teacher.self) a copy of the starting model, the reference's source. A teacher whose tokenizer is not the
    student's is a one-line error naming both vocabularies."""
    t = cfg.teacher
    if not cfg.needs_teacher or t.self_update:
        return None
    if t.url is not None:  # a teacher server: no model here (train/teacher_remote.py)
        return connect_teacher(cfg, student_vocab=student_vocab, student_path=model_path)
    source = t.path if t.path is not None else ref_source
    if t.engine == "vllm":  # its own vLLM engine (train/teacher_vllm.py): no model in the trainer
        return vllm_teacher(cfg, source, model_path=model_path, student_vocab=student_vocab,
                            max_position_embeddings=(overrides or {}).get("max_position_embeddings") if t.self else None)
    teacher, tokenizer = load_model_and_tokenizer(source, dtype=trainer_dtype(cfg.model.dtype),
                                                  overrides=overrides if t.self else None)
    if t.path is not None:
        check_same_vocab(t.path, tokenizer.get_vocab(), teacher.config.vocab_size, model_path, student_vocab)
    return teacher.eval().requires_grad_(False)


def vllm_teacher(cfg: Config, source: str, *, model_path: str, student_vocab: dict[str, int],
                 max_position_embeddings: int | None):
    """teacher.engine=vllm: the teacher's tokenizer checked against the student's, then its engine built."""
    from transformers import AutoConfig, AutoTokenizer

    from mathrl.train.teacher_vllm import VLLMTeacher

    tokenizer = AutoTokenizer.from_pretrained(source)
    size = int(AutoConfig.from_pretrained(source).vocab_size)
    if cfg.teacher.path is not None:
        check_same_vocab(cfg.teacher.path, tokenizer.get_vocab(), size, model_path, student_vocab)
    topk = cfg.algo.distill.topk if cfg.algo.distill.mode in DIRECT_MODES else 0
    return VLLMTeacher(source, settings=replace(cfg.rollout.vllm, gpu_memory_utilization=cfg.teacher.gpu_memory_utilization),
                       vocab_size=size, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       seed=cfg.seed, dtype=trainer_dtype(cfg.model.dtype), topk=topk,
                       max_position_embeddings=max_position_embeddings,
                       where=f"the vLLM teacher {source!r} (teacher.engine=vllm)")


def check_same_vocab(teacher_path: str, teacher_vocab: dict[str, int], teacher_size: int, student_path: str,
                     student_vocab: dict[str, int]) -> None:
    """Raise ValueError (one line) unless the teacher's tokenizer maps every token as the student's does."""
    if teacher_vocab != student_vocab:
        raise ValueError(f"teacher.path={teacher_path!r} has another tokenizer (a vocabulary of {len(teacher_vocab)} "
                         f"tokens, its model {teacher_size}) than the student {student_path!r} ({len(student_vocab)} "
                         "tokens): distillation compares the two token by token; choose a teacher of the same tokenizer")


def teacher_question(problem, context: str) -> str:
    """teacher.context filled for one problem: {question}, {answer} and {solution} (the problem's worked
    solution where the data has one, else its answer), each substituted once (plain replace, never format:
    LaTeX braces)."""
    solution = str(problem.meta.get("solution") or problem.answer)
    out, rest = "", context
    while rest:  # one left-to-right pass: a substituted text is never substituted again
        hits = [(rest.find(key), key) for key in ("{question}", "{answer}", "{solution}") if key in rest]
        if not hits:
            return out + rest
        at, key = min(hits)
        value = {"{question}": problem.question, "{answer}": problem.answer, "{solution}": solution}[key]
        out, rest = out + rest[:at] + value, rest[at + len(key):]
    return out


def teacher_prompts(problems, *, n: int, encoder, tokenizer, context: str) -> tuple[torch.Tensor, torch.Tensor]:
    """([N, P] left-padded ids, [N, P] mask): each row's teacher prompt, data.template applied to
    teacher.context's question (`encoder.text`), tokenized as the student's prompts are; rows are the
    problems' n samples in order."""
    add_special = encoder.template != "chat"  # a chat template already holds its special tokens
    ids = [tokenizer(encoder.text(teacher_question(p, context)), add_special_tokens=add_special)["input_ids"]
           for p in problems]
    return left_pad([row for row in ids for _ in range(n)], tokenizer.pad_token_id)


def teacher_scores(model, batch: Rows, cfg: Config, *, rows: list[int] | None = None,
                   prompts: tuple[torch.Tensor, torch.Tensor] | None = None) -> TeacherScores:
    """The teacher's logprobs, argmax flags and (forward_kl_topk, jsd) top-k of `batch`'s sampled tokens, no
    grad, at the rollout temperature (each rank scores its `rows`, `per_token_pass`; a `RowTeacher`, its server or vLLM engine). `prompts`: the teacher's
    own prompt ids and mask (self-distillation) in place of the student's; the responses are the same tokens.
    The metrics compare it with the sampler's logprobs over the loss mask (`algo.distill.teacher_stats`)."""
    mode, temperature = cfg.algo.distill.mode, cfg.rollout.temperature
    k = cfg.algo.distill.topk if mode in DIRECT_MODES else 1
    seen = batch if prompts is None else replace(batch, prompt_ids=prompts[0], prompt_mask=prompts[1])

    def forward(model, mb: Rows) -> list[torch.Tensor]:
        lp, is_argmax, top_ids, top_lp = response_topk(model, mb.prompt_ids, mb.prompt_mask, mb.response_ids,
                                                       mb.context_mask, temperature=temperature, k=k)
        return [lp, is_argmax, top_ids, top_lp]

    if isinstance(model, RowTeacher):  # a teacher server or vLLM engine: rows go as token-id lists
        logprobs, is_argmax, top_ids, top_lp = model.pass_over(seen, rows=rows, temperature=temperature,
                                                               k=k if mode in DIRECT_MODES else None)
    else:
        logprobs, is_argmax, top_ids, top_lp = per_token_pass(model, seen, cfg, forward, rows=rows)
    metrics = teacher_stats(batch.rollout_logprobs, logprobs, is_argmax, batch.loss_mask)
    if mode not in DIRECT_MODES:
        top_ids = top_lp = None
    return TeacherScores(logprobs, is_argmax, top_ids, top_lp, metrics)
