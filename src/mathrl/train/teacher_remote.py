"""A distillation teacher on another machine (teacher.url): the trainer POSTs the student's token ids and reads the
teacher's logprobs back from `mathrl serve-teacher` (train/serve_teacher.py). A plain HTTP client (`urllib.request`),
with a timeout per request and retries, in the style of the remote reward (reward/remote.py); unlike a reward, a
teacher's signal cannot be replaced by a zero, so a server that stays down after the retries stops the run with one line.

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

from mathrl.train.teacher_rows import RowTeacher

__all__ = ["RemoteTeacher", "connect_teacher", "tokenizer_fingerprint"]

_BACKOFF_S = 0.5  # wait before the first retry; doubled for each further one


def tokenizer_fingerprint(vocab: dict[str, int]) -> str:
    """16 hex digits of sha256 over the token -> id map (sorted): equal exactly when the two tokenizers map every
    token to the same id."""
    return hashlib.sha256(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


class RemoteTeacher(RowTeacher):
    """The client of one teacher server (teacher.url): `info()` at the start, `pass_over` at every step."""

    def __init__(self, url: str, *, timeout_s: float = 120.0, retries: int = 2, batch_size: int = 64):
        self.url, self.timeout_s, self.retries, self.batch_size = url.rstrip("/"), float(timeout_s), int(retries), int(batch_size)
        self.vocab_size = 0  # the server's model's (its logits' width), from info()
        self.where = f"teacher.url={self.url!r}/score"

    def refused(self, message: str) -> Exception:
        return TeacherServerError(message)

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
