"""A distillation teacher on another machine (teacher.url): the trainer POSTs the student's token ids and reads the
teacher's logprobs back from `mathrl serve-teacher` (train/serve_teacher.py). A plain HTTP client (`urllib.request`),
with a timeout per request and retries, in the style of the remote reward (reward/remote.py); unlike a reward, a
teacher's signal cannot be replaced by a zero, so a server that stays down after the retries stops the run with
one line.

    GET  <url>/info   -> {"model": "...", "vocab_size": 151936, "tokens": 151669, "fingerprint": "3f2a..."}
    POST <url>/score  {"prompts": [[ids], ...], "responses": [[ids], ...], "temperature": 1.0, "topk": 0}
                      -> {"logprobs": [[...], ...], "is_argmax": [[...], ...]}   (+ "topk_ids", "topk_logprobs"
                         [[[...] x K] x len(response)] per row when topk > 0)

Prompts are the real (unpadded) prompt ids, responses every token in the model's context (its own and the
observations'), both as the trainer holds them; each row's lists have the response's length.

    teacher = connect_teacher(cfg, student_vocab=tokenizer.get_vocab(), student_path=model_path)  # build_trainer
    logprobs, is_argmax, top_ids, top_lp = teacher.pass_over(batch, rows=..., temperature=1.0, k=None)
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
import urllib.error
import urllib.request

import torch

import mathrl.train.dist as tdist
from mathrl.train.batching import Rows

__all__ = ["RemoteTeacher", "connect_teacher", "tokenizer_fingerprint"]

_BACKOFF_S = 0.5  # wait before the first retry; doubled for each further one


def tokenizer_fingerprint(vocab: dict[str, int]) -> str:
    """16 hex digits of sha256 over the token -> id map (sorted): equal exactly when the two tokenizers map every
    token to the same id."""
    return hashlib.sha256(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


class RemoteTeacher:
    """The client of one teacher server (teacher.url): `info()` at the start, `pass_over` at every step."""

    def __init__(self, url: str, *, timeout_s: float = 120.0, retries: int = 2, batch_size: int = 64):
        self.url, self.timeout_s, self.retries, self.batch_size = url.rstrip("/"), float(timeout_s), int(retries), int(batch_size)
        self.vocab_size = 0  # the server's model's (its logits' width), from info()

    def info(self) -> dict:
        """The server's model, vocabulary size and tokenizer fingerprint (GET /info)."""
        info = self._request("/info", None)
        self.vocab_size = int(info.get("vocab_size") or 0)
        return info

    def score(self, prompts: list[list[int]], responses: list[list[int]], *, temperature: float, k: int) -> dict:
        """The teacher's view of these rows (POST /score, `batch_size` rows per request), lists per row."""
        out: dict[str, list] = {}
        for lo in range(0, len(responses), self.batch_size):
            got = self._request("/score", {"prompts": prompts[lo:lo + self.batch_size],
                                           "responses": responses[lo:lo + self.batch_size],
                                           "temperature": temperature, "topk": k})
            for key, value in got.items():
                out.setdefault(key, []).extend(value)
        return out

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
        """A server's answer is untrusted input: every asked row's logprobs (finite, <= 0) and argmax flags,
        and with `width` its top-k ids (in the vocabulary) and logprobs, one value (or `width`) per response
        token; else TeacherServerError in one line, never a zero or a traceback in the loss."""
        def bad(what: str) -> TeacherServerError:
            return TeacherServerError(f"teacher.url={self.url!r}/score answered {what}: a teacher's signal is never guessed")

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

    def _request(self, path: str, payload: dict | None) -> dict:
        """The server's JSON answer; after the retries (connection errors, timeouts, 5xx) or at once (4xx, a
        malformed answer) a RuntimeError of one line: a teacher's signal is never replaced by a zero."""
        body = None if payload is None else json.dumps(payload).encode("utf-8")
        detail = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(_BACKOFF_S * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url + path, data=body, method="GET" if body is None else "POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    text = response.read()
            except urllib.error.HTTPError as e:
                detail = f"answered HTTP {e.code}: {_error_of(e)}"
                if e.code < 500:
                    raise TeacherServerError(f"teacher.url={self.url!r} {detail}") from None
                continue
            except (TimeoutError, socket.timeout):
                detail = f"no answer within {self.timeout_s:g} s (teacher.timeout_s)"
                continue
            except urllib.error.URLError as e:
                detail = f"nothing answers ({e.reason}); start it with `mathrl serve-teacher MODEL --port N`"
                continue
            except (OSError, ValueError) as e:  # a connection reset mid-answer
                detail = f"{type(e).__name__}: {e}"
                continue
            try:
                got = json.loads(text)
            except ValueError:
                got = None
            if not isinstance(got, dict):
                raise TeacherServerError(f"teacher.url={self.url!r}{path} answered something that is not a JSON object")
            return got
        raise TeacherServerError(f"teacher.url={self.url!r}: {detail} (attempt {attempt + 1} of {self.retries + 1})")


class TeacherServerError(RuntimeError):
    """A teacher server that cannot be used (down after the retries, a refused request): one line for the user."""


def _error_of(e: urllib.error.HTTPError) -> str:
    """The server's {"error": ...} line, or the status's reason."""
    try:
        return str(json.loads(e.read())["error"])[:300]
    except (ValueError, KeyError, TypeError, OSError):
        return str(e.reason)


def connect_teacher(cfg, *, student_vocab: dict[str, int], student_path: str) -> RemoteTeacher:
    """The client of teacher.url, after its /info: a server with another tokenizer than the student's (vocabulary
    size or fingerprint) is a one-line ValueError naming both; a server that is down, a one-line RuntimeError."""
    t = cfg.teacher
    teacher = RemoteTeacher(t.url, timeout_s=t.timeout_s, retries=t.retries)
    info = teacher.info()
    mine = tokenizer_fingerprint(student_vocab)
    if info.get("tokens") != len(student_vocab) or info.get("fingerprint") != mine:
        raise ValueError(f"teacher.url={t.url!r} serves {info.get('model')!r} with another tokenizer (a vocabulary of "
                         f"{info.get('tokens')} tokens, fingerprint {info.get('fingerprint')}) than the student "
                         f"{student_path!r} ({len(student_vocab)} tokens, fingerprint {mine}): distillation compares "
                         "the two token by token; serve a teacher of the same tokenizer")
    return teacher
