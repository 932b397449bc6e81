"""`mathrl serve-teacher MODEL [--host --port]`: a distillation teacher over HTTP (teacher.url), the server side of
train/teacher_remote.py (its docstring has the protocol). Standard library only (`http.server`); the model is
loaded frozen once and scores one request at a time, through `response_topk`, the in-process teacher's pass.

    mathrl serve-teacher runs/teacher --port 8100          # a run directory: its final/
    mathrl train algo.distill.mode=reverse_kl teacher.url=http://127.0.0.1:8100
"""

from __future__ import annotations

import functools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from mathrl.model.scoring import response_topk
from mathrl.rollout.base import left_pad
from mathrl.train.teacher_remote import tokenizer_fingerprint

__all__ = ["TeacherServer", "score_rows"]


@torch.no_grad()
def score_rows(model, pad_id: int, prompts: list[list[int]], responses: list[list[int]], *, temperature: float,
               k: int) -> dict[str, list]:
    """The teacher's logprobs and argmax flags of each response's tokens given its prompt (and with k > 0 its
    top-k ids and logprobs), each row's lists as long as its response: prompts left-padded, responses
    right-padded, every response token in the context."""
    if not responses:
        return {"logprobs": [], "is_argmax": []}
    prompt_ids, prompt_mask = left_pad(prompts, pad_id)
    width = max(1, max(len(r) for r in responses))
    response_ids = torch.full((len(responses), width), pad_id, dtype=torch.long)
    response_mask = torch.zeros(len(responses), width)
    for i, r in enumerate(responses):
        response_ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        response_mask[i, :len(r)] = 1.0
    lp, is_argmax, top_ids, top_lp = response_topk(model, prompt_ids, prompt_mask, response_ids, response_mask,
                                                   temperature=temperature, k=max(k, 1))
    out = {"logprobs": [lp[i, :len(r)].tolist() for i, r in enumerate(responses)],
           "is_argmax": [is_argmax[i, :len(r)].tolist() for i, r in enumerate(responses)]}
    if k > 0:
        out["topk_ids"] = [top_ids[i, :len(r)].tolist() for i, r in enumerate(responses)]
        out["topk_logprobs"] = [top_lp[i, :len(r)].tolist() for i, r in enumerate(responses)]
    return out


def _request_problem(body, vocab_size: int) -> str | None:
    """Why a /score request is malformed (one line), or None."""
    if not isinstance(body, dict):
        return "the request is not a JSON object"
    prompts, responses = body.get("prompts"), body.get("responses")
    if not isinstance(prompts, list) or not isinstance(responses, list) or len(prompts) != len(responses):
        return "'prompts' and 'responses' must be lists of token id lists of the same length"
    for row in (*prompts, *responses):
        if not isinstance(row, list) or any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < vocab_size for x in row):
            return f"every token id must be an integer in [0, {vocab_size})"
    if any(not p for p in prompts):
        return "every prompt needs at least one token"
    temperature, k = body.get("temperature", 1.0), body.get("topk", 0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        return f"'temperature' must be a number > 0, got {temperature!r}"
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        return f"'topk' must be an integer >= 0, got {k!r}"
    return None


class TeacherServer:
    """A frozen teacher behind /info and /score on `host`:`port` (port 0: a free one, `self.port` says which):
    a model scored by `score_rows`, or with `scorer` (a `VLLMTeacher`'s `score`) any function of the same
    arguments, whose ValueError is the client's to fix (400)."""

    def __init__(self, model, tokenizer, *, name: str, host: str = "127.0.0.1", port: int = 8100,
                 scorer=None, vocab_size: int | None = None):
        self.name = name
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        if scorer is None:
            model = model.eval().requires_grad_(False)
            scorer = functools.partial(score_rows, model, self.pad_id)
        self.model, self.scorer = model, scorer
        vocab = tokenizer.get_vocab()
        self.info = {"model": name, "vocab_size": int(vocab_size or model.config.vocab_size), "tokens": len(vocab),
                     "fingerprint": tokenizer_fingerprint(vocab)}
        self._lock = threading.Lock()  # one forward at a time
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.host, self.port = self.httpd.server_address[:2]
        self._thread: threading.Thread | None = None

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet: one line per request would drown the console
                pass

            def _send(self, code: int, payload: dict) -> None:
                data = json.dumps(payload).encode("utf-8")
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/") != "/info":
                    return self._send(404, {"error": f"no {self.path}: GET /info or POST /score"})
                self._send(200, server.info)

            def do_POST(self):
                if self.path.rstrip("/") != "/score":
                    return self._send(404, {"error": f"no {self.path}: GET /info or POST /score"})
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                except ValueError:
                    body = None
                problem = _request_problem(body, server.info["vocab_size"])
                if problem:
                    return self._send(400, {"error": problem})
                try:
                    with server._lock:
                        out = server.scorer(body["prompts"], body["responses"],
                                            temperature=float(body.get("temperature", 1.0)), k=int(body.get("topk", 0)))
                except ValueError as e:  # a request this teacher cannot serve (vLLM: a temperature other than 1)
                    return self._send(400, {"error": str(e)[:300]})
                except Exception as e:  # noqa: BLE001 - the client retries a 5xx and names it
                    return self._send(500, {"error": f"{type(e).__name__}: {e}"[:300]})
                self._send(200, out)

        return Handler

    def start(self) -> TeacherServer:
        """Serve in a background thread (tests, notebooks)."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def serve_teacher(model_path: str, *, host: str, port: int, dtype: str, device: str, console, engine: str = "torch",
                  gpu_memory_utilization: float = 0.9, max_topk: int = 128) -> None:
    """Load `model_path` (a model directory, hub id, run directory or tiny-arith) and serve it until Ctrl-C: on
    the torch pass, or (engine "vllm") on a vLLM engine's prompt logprobs (temperature 1 only)."""
    from mathrl.config import load_config
    from mathrl.model.io import load_model_and_tokenizer
    from mathrl.model.paths import resolve_model_path
    from mathrl.tasks.arithmetic import base_pretraining_text
    from mathrl.train.distill_data import teacher_model_path

    path = teacher_model_path(model_path)
    cfg = load_config(None, [f"model.path={json.dumps(path)}"], check_paths=False)
    path = resolve_model_path(cfg, console, pretraining_text=base_pretraining_text(cfg.base))
    if engine == "vllm":
        from transformers import AutoConfig, AutoTokenizer

        from mathrl.config import VLLMConfig
        from mathrl.train.teacher_vllm import VLLMTeacher

        tokenizer, size = AutoTokenizer.from_pretrained(path), int(AutoConfig.from_pretrained(path).vocab_size)
        teacher = VLLMTeacher(path, settings=VLLMConfig(gpu_memory_utilization=gpu_memory_utilization), vocab_size=size,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, dtype=dtype,
                              topk=max_topk, where=f"the vLLM teacher {model_path!r}")
        server = TeacherServer(None, tokenizer, name=model_path, host=host, port=port, scorer=teacher.score,
                               vocab_size=size)
    else:
        model, tokenizer = load_model_and_tokenizer(path, dtype=dtype, device=device)
        server = TeacherServer(model, tokenizer, name=model_path, host=host, port=port)
    console.print(f"teacher {path} ({server.info['tokens']} tokens, fingerprint {server.info['fingerprint']}) "
                  f"at {server.url} (GET /info, POST /score)")
    try:
        server.httpd.serve_forever()
    finally:
        server.httpd.server_close()
