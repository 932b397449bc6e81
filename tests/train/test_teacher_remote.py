"""A remote distillation teacher (teacher.url; train/teacher_remote.py) and its server (`mathrl serve-teacher`;
train/serve_teacher.py), started in-process on a free port with a tiny model:

- its logprobs, argmax flags and top-k of the student's tokens equal the in-process teacher's (the same model in
  the trainer) within 1e-6, single-turn and a tool episode (observations get nothing, as in the trainer);
- the start-up check: another tokenizer is one line naming both vocabularies and fingerprints;
- a server that is down is one line after the retries, never a zero; a refused request is one line at once;
- the config rules: teacher.url excludes teacher.path and teacher.self, and must be an http(s) address;
- 2 training steps with teacher.url against a `mathrl serve-teacher` process (slow).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import torch
from test_distill_e2e import BASE, DISTILL_METRICS, OVERRIDES
from test_teacher import TEMPERATURE, rows

from mathrl.config import Config, ConfigError
from mathrl.train.serve_teacher import TeacherServer
from mathrl.train.teacher import teacher_scores
from mathrl.train.teacher_remote import RemoteTeacher, TeacherServerError, connect_teacher, tokenizer_fingerprint
from run_helpers import metrics


@pytest.fixture
def served(make_tiny_qwen2, char_tokenizer):
    """(the teacher model, its server on a free port of 127.0.0.1)."""
    model = make_tiny_qwen2(seed=3)
    server = TeacherServer(model, char_tokenizer, name="tiny", port=0).start()
    yield model, server
    server.stop()


def config(url: str, mode: str) -> Config:
    cfg = Config()
    cfg.algo.distill.mode, cfg.algo.distill.topk, cfg.rollout.temperature = mode, 5, TEMPERATURE
    cfg.teacher.url, cfg.teacher.retries = url, 0
    cfg.train.micro_batch_tokens = 8  # the in-process pass in several micro-batches; the server in one request
    return cfg


@pytest.mark.parametrize("tools", [False, True], ids=["single_turn", "tool_episode"])
@pytest.mark.parametrize("mode", ["reverse_kl", "forward_kl_topk"])
def test_the_servers_scores_equal_the_in_process_teachers(served, char_tokenizer, tools, mode):
    model, server = served
    cfg = config(server.url, mode)
    batch = rows(char_tokenizer, tools=tools)
    remote = connect_teacher(cfg, student_vocab=char_tokenizer.get_vocab(), student_path="tiny")
    got, want = teacher_scores(remote, batch, cfg), teacher_scores(model, batch, cfg)
    assert float((got.logprobs - want.logprobs).abs().max()) < 1e-6
    assert torch.equal(got.is_argmax, want.is_argmax)
    assert got.metrics.keys() == want.metrics.keys()
    assert all(abs(got.metrics[k] - want.metrics[k]) < 1e-6 for k in want.metrics)
    if mode == "forward_kl_topk":
        assert torch.equal(got.topk_ids, want.topk_ids)
        assert float((got.topk_logprobs - want.topk_logprobs).abs().max()) < 1e-6
    else:
        assert got.topk_ids is None and want.topk_ids is None
    if tools:  # the observation's tokens carry nothing, from either teacher
        assert torch.all(got.logprobs[batch.observation_mask.bool()] == 0)


def test_info_names_the_tokenizer(served, char_tokenizer):
    _, server = served
    info = RemoteTeacher(server.url).info()
    assert info == {"model": "tiny", "vocab_size": len(char_tokenizer), "tokens": len(char_tokenizer.get_vocab()),
                    "fingerprint": tokenizer_fingerprint(char_tokenizer.get_vocab())}


def test_another_tokenizer_is_one_line_naming_both(served, char_tokenizer):
    _, server = served
    vocab = dict(char_tokenizer.get_vocab())
    first, second = sorted(vocab)[:2]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # the same size, two tokens swapped
    with pytest.raises(ValueError, match=r"^teacher.url=.* serves 'tiny' with another tokenizer .* fingerprint") as e:
        connect_teacher(config(server.url, "reverse_kl"), student_vocab=vocab, student_path="student")
    assert "\n" not in str(e.value) and tokenizer_fingerprint(vocab) in str(e.value)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_that_is_down_is_one_line_after_the_retries():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    teacher = RemoteTeacher(url, timeout_s=2, retries=1)
    with pytest.raises(TeacherServerError, match=r"nothing answers .* \(attempt 2 of 2\)$") as e:
        teacher.score([[1]], [[2, 3]], temperature=1.0, k=0)
    assert "\n" not in str(e.value) and "mathrl serve-teacher" in str(e.value)
    with pytest.raises(TeacherServerError, match="nothing answers"):  # at the start, too: never a silent zero
        connect_teacher(config(url, "reverse_kl"), student_vocab={}, student_path="student")


@pytest.mark.parametrize("payload, message, why", [
    ({"prompts": [[1]], "responses": [[10**6]]}, r"every token id must be an integer in \[0, ", "an id past the vocabulary"),
    ({"prompts": [[1]], "responses": []}, "of the same length", "a response per prompt"),
    ({"prompts": [[]], "responses": [[1]]}, "at least one token", "a response is predicted from its prompt"),
    ({"prompts": [[1]], "responses": [[1]], "temperature": 0}, "'temperature' must be a number > 0", "a tempered softmax"),
])
def test_a_refused_request_is_one_line_at_once(served, payload, message, why):
    _, server = served
    with pytest.raises(TeacherServerError, match=r"answered HTTP 400: .*" + message) as e:
        RemoteTeacher(server.url, retries=3)._request("/score", payload)
    assert "\n" not in str(e.value), why


@pytest.mark.parametrize("settings, message", [
    ({"url": "http://h:1", "path": "x"}, "not teacher.path and teacher.url"),
    ({"url": "http://h:1", "self": True}, "not teacher.url and teacher.self"),
    ({"url": "h:1"}, "teacher.url='h:1' must look like http://host:port"),
])
def test_url_rules(settings, message):
    cfg = Config()
    cfg.algo.distill.mode = "reverse_kl"
    for key, value in settings.items():
        setattr(cfg.teacher, key, value)
    with pytest.raises(ConfigError, match=message):
        cfg.validate(check_paths=False)


@pytest.mark.slow
def test_two_steps_with_a_teacher_server(tmp_path):
    """`mathrl serve-teacher` on the tiny base as a process, then 2 training steps scored through it."""
    env = {**os.environ, "MATHRL_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    build = subprocess.run([sys.executable, "-m", "mathrl.cli", "base", *BASE, "base.steps=200"], env=env,
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mathrl.cli", "serve-teacher", build.stdout.strip(),
                               "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):  # until it listens (a hang guard, not a timing check)
            try:
                RemoteTeacher(url, retries=0, timeout_s=5).info()
                break
            except TeacherServerError:
                time.sleep(0.2)
        run = tmp_path / "run"
        done = subprocess.run([sys.executable, "-m", "mathrl.cli", "train", *OVERRIDES, "algo.distill.mode=reverse_kl",
                               f"teacher.url={url}", "--run-dir", str(run)], env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        rows_ = metrics(run)
        for step in (1, 2):
            assert all(isinstance(rows_[step][k], float) and rows_[step][k] == rows_[step][k] for k in DISTILL_METRICS)
            assert rows_[step]["distill/teacher_logprob"] < 0.0  # a real teacher's logprobs, never a zero
    finally:
        server.terminate()
        server.wait(timeout=60)


@pytest.mark.parametrize("answer, message, why", [
    ({"logprobs": [[-0.5, -0.1]]}, "'is_argmax' for no rows", "a key missing"),
    ({"logprobs": [[-0.5]], "is_argmax": [[1.0, 0.0]]}, "'logprobs' of row 0 with shape (1,)", "a row cut short"),
    ({"logprobs": [[-0.5, float("nan")]], "is_argmax": [[1.0, 0.0]]}, "non-finite", "a NaN"),
    ({"logprobs": [[-0.5, 3.0]], "is_argmax": [[1.0, 0.0]]}, "above 0", "a probability above 1"),
    ({"logprobs": [["a", -0.1]], "is_argmax": [[1.0, 0.0]]}, "not numbers", "text"),
    ({"logprobs": [[-0.5, -0.1]], "is_argmax": [[1.0, 0.0]], "topk_ids": [[[0], [99]]], "topk_logprobs": [[[-0.1], [-0.2]]]},
     "outside the vocabulary", "an id the student's model has no row for"),
])
def test_a_servers_malformed_answer_is_one_line_not_a_zero(answer, message, why):
    # the server is another process, possibly another program: what it answers is checked before any
    # of it reaches the loss
    teacher = RemoteTeacher("http://127.0.0.1:1")
    teacher.vocab_size = 10
    width = 1 if "topk_ids" in answer else None
    with pytest.raises(TeacherServerError) as e:
        teacher.check_answer(answer, [2], width=width)
    assert message in str(e.value) and "\n" not in str(e.value), why
    good = {"logprobs": [[-0.5, -0.1]], "is_argmax": [[1.0, 0.0]], "topk_ids": [[[0], [9]]], "topk_logprobs": [[[-0.1], [-0.2]]]}
    teacher.check_answer(good, [2], width=1)  # a well-formed answer passes
