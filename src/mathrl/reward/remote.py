"""A reward server: the trainer POSTs batches of samples as JSON and reads one score per sample back.

The server is the user's (a judge model, a sandbox, a unit-test runner); this is a plain HTTP client (`urllib.request`)
with a timeout per request and retries. The schema field by field and the retries' waits: docs/rewards.md, "A reward server".

    POST <url>  {"prompts": [...], "responses": [...], "fields": [{"answer": "42", ...}], "tokens": [[12, 7]], "kwargs": {}}
            ->  {"scores": [1.0, 0.0, {"score": 0.5, "style": 0.2}, ...]}   # one per sample, in order

A connection error, a timeout or a 5xx status is retried ``retries`` times; a 4xx status, a body that is
not this schema, or the last failed attempt scores every sample of the batch 0 and counts it
(``reward/<name>/errors``, or ``reward/<name>/timeouts`` when the last attempt timed out). A reward server
never stops the run once it has started; an unreachable one stops it at the start (`check_reachable`).

    server = RemoteReward("http://127.0.0.1:8000/score", timeout_s=30, batch_size=64, retries=2)
    outcome = server.score(prompts, responses, fields, tokens)   # RemoteOutcome: values and failures
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Literal

from mathrl.reward.verify import RewardValue, _reward_value

__all__ = ["RemoteOutcome", "RemoteReward", "check_reachable", "url_problem"]

_BACKOFF_S = 0.5  # wait before the first retry; doubled for each further one


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a reward server's address, or None: it must be http(s)://host[:port][/path]."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return "must start with http:// or https://"
    if not parts.hostname:
        return "has no host"
    try:
        parts.port  # noqa: B018 - raises for a port that is not a number in range
    except ValueError:
        return "has a port that is not a number in 0-65535"
    return None


def check_reachable(url: str, *, timeout_s: float = 5.0) -> str | None:
    """Why nothing answers at `url`'s host and port (one line), or None when a TCP connection opens.

    Only the connection is tried, not a request: a server need not answer an empty batch."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return None
    except OSError as e:
        return f"nothing answers at {parts.hostname}:{port} ({e.strerror or type(e).__name__})"


@dataclass
class RemoteOutcome:
    """The scores of one `RemoteReward.score` call: per sample a value, or None and why it has none."""

    values: list[RewardValue | None]
    failures: list[Literal["", "error", "timeout"]]
    details: list[str] = field(default_factory=list)  # one line per failed batch, for the console


class RemoteReward:
    """The client of one reward server (one `reward.functions` entry with a `url`)."""

    def __init__(self, url: str, *, timeout_s: float = 30.0, batch_size: int = 64, retries: int = 2,
                 kwargs: dict | None = None):
        problem = url_problem(url)
        if problem:
            raise ValueError(f"reward server url {url!r} {problem}")
        self.url, self.timeout_s, self.batch_size, self.retries = url, float(timeout_s), int(batch_size), int(retries)
        self.kwargs = dict(kwargs or {})

    def score(self, prompts: list[str], responses: list[str], fields: list[dict], tokens: list[list[int]]) -> RemoteOutcome:
        """POST the samples in batches of `batch_size`, in order; never raises for what the server does."""
        out = RemoteOutcome([], [], [])
        for lo in range(0, len(responses), self.batch_size):
            hi = min(lo + self.batch_size, len(responses))
            payload = {"prompts": prompts[lo:hi], "responses": responses[lo:hi], "fields": fields[lo:hi],
                       "tokens": tokens[lo:hi], "kwargs": self.kwargs}
            status, values, detail = self._post(payload, hi - lo)
            if status == "ok":
                out.values += values
                out.failures += ["" if v is not None else "error" for v in values]
                if detail:
                    out.details.append(detail)
            else:
                out.values += [None] * (hi - lo)
                out.failures += [status] * (hi - lo)
                out.details.append(detail)
        return out

    def _post(self, payload: dict, n: int) -> tuple[str, list, str]:
        """("ok", values, detail) or ("error" | "timeout", [], detail) after the retries."""
        body = json.dumps(payload).encode("utf-8")
        status, detail = "error", ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(_BACKOFF_S * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    text = response.read()
            except urllib.error.HTTPError as e:
                status, detail = "error", f"{self.url} answered HTTP {e.code}"
                if e.code < 500:
                    break  # the request is wrong: asking again gives the same answer
                continue
            except (TimeoutError, socket.timeout) as e:
                status, detail = "timeout", f"{self.url}: no answer within {self.timeout_s:g} s ({e})"
                continue
            except urllib.error.URLError as e:
                timed_out = isinstance(e.reason, (TimeoutError, socket.timeout))
                status = "timeout" if timed_out else "error"
                detail = f"{self.url}: {e.reason}"
                continue
            except (OSError, ValueError) as e:  # a connection reset mid-answer, a malformed response
                status, detail = "error", f"{self.url}: {type(e).__name__}: {e}"
                continue
            return self._parse(text, n)
        return status, [], f"{detail} (attempt {attempt + 1} of {self.retries + 1})"

    def _parse(self, text: bytes, n: int) -> tuple[str, list, str]:
        try:
            scores = json.loads(text)["scores"]
        except (ValueError, KeyError, TypeError):
            return "error", [], f"{self.url}: the answer is not a JSON object with 'scores'"
        if not isinstance(scores, list) or len(scores) != n:
            got = len(scores) if isinstance(scores, list) else type(scores).__name__
            return "error", [], f"{self.url}: {got} scores for {n} samples"
        values = [_reward_value(v) for v in scores]
        bad = next((v for v, c in zip(scores, values) if c is None), None)
        detail = "" if bad is None else f"{self.url}: a score is not a finite number or an object with a 'score': {str(bad)[:80]}"
        return "ok", values, detail
