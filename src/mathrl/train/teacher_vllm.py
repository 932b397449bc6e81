"""A distillation teacher on its own vLLM engine (teacher.engine=vllm): each row's prompt and response go to
vLLM as one prompt, and its `prompt_logprobs` give the teacher's logprob of every response token, the rank of
that token (rank 1: the teacher's argmax) and, for the top-k modes, the k most likely tokens. vLLM computes
prompt logprobs from the untempered logits, so the config allows this teacher at rollout.temperature 1 only,
where they are the tempered ones the loss reads.

    teacher = VLLMTeacher(path, settings=cfg.rollout.vllm, vocab_size=..., eos_token_id=..., pad_token_id=...)
    logprobs, is_argmax, top_ids, top_lp = teacher.pass_over(batch, rows=..., temperature=1.0, k=None)
"""

from __future__ import annotations

from dataclasses import replace

import torch

from mathrl.rollout.vllm_engine import VLLMEngine
from mathrl.train.teacher_rows import RowTeacher

__all__ = ["VLLMTeacher"]


class VLLMTeacher(RowTeacher):
    """A frozen teacher model in a vLLM engine of its own, scoring the student's tokens (`score`)."""

    def __init__(self, model_path: str, *, settings, vocab_size: int, eos_token_id: int, pad_token_id: int,
                 seed: int = 0, dtype: str = "float32", topk: int = 0, max_position_embeddings: int | None = None,
                 where: str | None = None):
        """`settings`: a `config.VLLMConfig` (the trainer's rollout.vllm with teacher.gpu_memory_utilization);
        `topk`: the most top-k entries a request will ask (vLLM refuses more than it was built for)."""
        if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            raise ValueError("teacher.engine=vllm runs with one trainer process; under torchrun use teacher.engine=torch "
                             "or a teacher server on vLLM (teacher.url, mathrl serve-teacher --engine vllm)")
        self.vocab_size = int(vocab_size)
        self.threads = torch.get_num_threads()  # vLLM's CPU attention plans for the building thread's OpenMP threads
        self.engine = VLLMEngine(model_path, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                                 settings=replace(settings, enable_sleep_mode=False), seed=seed, dtype=dtype,
                                 max_position_embeddings=max_position_embeddings,
                                 max_logprobs=max(20, min(topk, self.vocab_size)))
        self.where = where or f"the vLLM teacher {model_path!r}"

    def score(self, prompts: list[list[int]], responses: list[list[int]], *, temperature: float, k: int) -> dict:
        """Each row's prompt + response as one vLLM prompt; per response token its logprob, whether it is the
        teacher's argmax (vLLM's rank 1) and, with k > 0, the top-k ids and logprobs (k capped at the vocabulary)."""
        from vllm import SamplingParams, TokensPrompt

        if temperature != 1.0:  # the config refuses it; a direct caller gets the same reason
            raise ValueError(f"a vLLM teacher scores at temperature 1 only (vLLM's prompt logprobs are untempered), "
                             f"not {temperature:g}")
        width = min(k, self.vocab_size) if k else 0
        rows = [list(p) + list(r) for p, r in zip(prompts, responses)]
        longest = max((len(r) for r in rows), default=0)
        if longest + 1 > self.engine.max_model_len:  # vLLM generates one token after the prompt it scores
            raise ValueError(f"a transcript of {longest} tokens does not fit the teacher's vLLM engine "
                             f"(max_model_len={self.engine.max_model_len}, one position kept for a generated token); "
                             "raise rollout.vllm.max_model_len or lower rollout.max_new_tokens")
        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=width, detokenize=False)
        if torch.get_num_threads() != self.threads:  # called from another thread (a server's handler): the same count
            torch.set_num_threads(self.threads)
        outputs = self.engine.llm.generate([TokensPrompt(prompt_token_ids=r) for r in rows], params, use_tqdm=False)
        out: dict[str, list] = {"logprobs": [], "is_argmax": []}
        if width:
            out.update(topk_ids=[], topk_logprobs=[])
        for prompt, response, got in zip(prompts, responses, outputs):
            positions = got.prompt_logprobs[len(prompt):]  # position i: the logprobs of row token i given the rest before it
            out["logprobs"].append([pos[tok].logprob for pos, tok in zip(positions, response)])
            out["is_argmax"].append([float(pos[tok].rank == 1) for pos, tok in zip(positions, response)])
            if width:
                tops = [sorted(pos.items(), key=lambda item: (item[1].rank, -item[1].logprob))[:width] for pos in positions]
                out["topk_ids"].append([[i for i, _ in top] for top in tops])
                out["topk_logprobs"].append([[v.logprob for _, v in top] for top in tops])
        return out

    def close(self) -> None:
        self.engine.close()
