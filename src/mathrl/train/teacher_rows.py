"""A teacher that scores rows given as token-id lists, not as a model in the trainer: a teacher server
(train/teacher_remote.py) or a vLLM engine (train/teacher_vllm.py). A subclass answers `score`; `pass_over`
turns the answers into the tensors the in-process teacher's pass returns, after `check_answer`.

    got = teacher.score(prompts, responses, temperature=1.0, k=0)     # {"logprobs": [[...]], "is_argmax": ..., ...}
    logprobs, is_argmax, top_ids, top_lp = teacher.pass_over(batch, rows=..., temperature=1.0, k=None)
"""

from __future__ import annotations

import torch

import mathrl.train.dist as tdist
from mathrl.train.batching import Rows

__all__ = ["RowTeacher"]


class RowTeacher:
    """The shared half of the row-scoring teachers. Subclasses set `vocab_size` (its logits' width) and `where`
    (the setting named in errors) and answer `score`."""

    vocab_size: int = 0
    where: str = "teacher"

    def score(self, prompts: list[list[int]], responses: list[list[int]], *, temperature: float, k: int) -> dict:
        """{"logprobs", "is_argmax"} (and with k > 0 "topk_ids", "topk_logprobs"): one list per row, one value (or
        k values) per response token: the teacher's view of each response after its prompt."""
        raise NotImplementedError

    def refused(self, message: str) -> Exception:
        """The error an unusable answer raises (a subclass names its own kind)."""
        return RuntimeError(message)

    def close(self) -> None:
        """Release what it holds (an engine); a client holds nothing."""

    def pass_over(self, batch: Rows, *, rows: list[int] | None, temperature: float, k: int | None) -> list[torch.Tensor]:
        """What `per_token_pass` returns for `response_topk` on an in-process teacher: [N, T] logprobs and is_argmax
        and [N, T, K] top-k ids and logprobs (`k` None: none asked, [N, T, 1] zeros), float32 (ids long) on CPU,
        0 at masked positions; each rank scores its `rows`, summed over ranks (disjoint rows: exact)."""
        own = list(range(len(batch))) if rows is None else list(rows)
        prompts = [batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist() for i in own]
        lengths = [int(batch.context_mask[i].nonzero().max()) + 1 if batch.context_mask[i].any() else 0 for i in own]
        responses = [batch.response_ids[i, :n].tolist() for i, n in zip(own, lengths)]
        got = self.score(prompts, responses, temperature=temperature, k=k or 0) if own else {}
        n, t = batch.response_mask.shape
        width = min(k, self.vocab_size) if k else 1  # the server caps k at its model's vocabulary, as response_topk
        if own:
            self.check_answer(got, lengths, width=width if k else None)
        lp, argmax = torch.zeros(n, t), torch.zeros(n, t)
        top_ids, top_lp = torch.zeros(n, t, width, dtype=torch.long), torch.zeros(n, t, width)
        for j, (i, length) in enumerate(zip(own, lengths)):
            if not length:
                continue
            lp[i, :length] = torch.tensor(got["logprobs"][j], dtype=torch.float32)
            argmax[i, :length] = torch.tensor(got["is_argmax"][j], dtype=torch.float32)
            if k:
                top_ids[i, :length] = torch.tensor(got["topk_ids"][j], dtype=torch.long)
                top_lp[i, :length] = torch.tensor(got["topk_logprobs"][j], dtype=torch.float32)
        outputs = [tdist.all_reduce_sum_tensor(out) for out in (lp, argmax, top_ids, top_lp)]
        mask = batch.response_mask
        return [out * (mask if out.dim() == 2 else mask[..., None]).to(out.dtype) for out in outputs]

    def check_answer(self, got: dict, lengths: list[int], *, width: int | None) -> None:
        """An answer is checked before it reaches the loss (a server's is untrusted input): every asked row's
        logprobs (finite, <= 0) and argmax flags, and with `width` its top-k ids (in the vocabulary) and
        logprobs, one value (or `width`) per response token; else `refused(...)` in one line, never a zero or a
        traceback in the loss."""
        def bad(what: str) -> Exception:
            return self.refused(f"{self.where} answered {what}: a teacher's signal is never guessed")

        keys = ("logprobs", "is_argmax") + (("topk_ids", "topk_logprobs") if width else ())
        for key in keys:
            rows = got.get(key)
            if not isinstance(rows, list) or len(rows) != len(lengths):
                raise bad(f"{key!r} for {len(rows) if isinstance(rows, list) else 'no'} rows, not {len(lengths)}")
            for j, (row, length) in enumerate(zip(rows, lengths)):
                try:
                    values = torch.tensor(row, dtype=torch.float64)
                except (TypeError, ValueError):
                    raise bad(f"{key!r} of row {j} that is not numbers") from None
                shape = (length, width) if key.startswith("topk") else (length,)
                if tuple(values.shape) != shape or not torch.isfinite(values).all():
                    raise bad(f"{key!r} of row {j} with shape {tuple(values.shape)} or non-finite values, not {shape}")
                if key.endswith("logprobs") and (values > 1e-4).any():
                    raise bad(f"{key!r} of row {j} above 0 (not log-probabilities)")
                if key == "topk_ids" and ((values < 0) | (values >= self.vocab_size)).any():
                    raise bad(f"{key!r} of row {j} outside the vocabulary of {self.vocab_size}")
