"""Tests for mathrl.model.tiny: building, saving, caching and loading the tiny base model.

The model built here is far smaller and shorter-trained than the real one (3 steps, hidden 32):
these tests check the plumbing, not that the model learns.

Run: python -m pytest tests/model/test_tiny_base.py -q
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mathrl.model.tiny as tiny
from mathrl.config import BaseModelConfig
from mathrl.model.tiny import base_model_dir, build_char_tokenizer, ensure_base_model, recipe_hash
from mathrl.tasks.arithmetic import base_pretraining_text

TINY = BaseModelConfig(steps=3, batch_size=4, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                       num_kv_heads=1)
TEXT = base_pretraining_text(TINY)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(cache_root, model dir, directories announced by on_build_start) after one real build."""
    root = tmp_path_factory.mktemp("cache")
    announced = []
    path = ensure_base_model(TINY, pretraining_text=TEXT, cache_root=root, on_build_start=announced.append)
    return root, path, announced


def test_build_writes_a_standard_hf_directory(built):
    # The base model must be an ordinary Hugging Face directory any tool can load, not a mathrl format.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root, path, announced = built
    assert path == base_model_dir(TINY, root)
    assert announced == [path]  # the first call really built (and said so before starting)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "mathrl_base.json"):
        assert (path / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1
    assert model.config.num_key_value_heads == 1
    assert model.config.vocab_size == len(tokenizer)
    # rollouts stop on EOS and pad with PAD: both must survive the round trip
    assert tokenizer.eos_token_id == model.config.eos_token_id == 1
    assert tokenizer.pad_token_id == model.config.pad_token_id == 0
    assert json.loads((path / "mathrl_base.json").read_text())["recipe"] == dataclasses.asdict(TINY)


def test_build_leaves_no_temporary_directories(built):
    # Builds go to a temp dir renamed at the end; nothing half-written may stay next to the model,
    # where a later run might pick it up.
    root, path, _ = built
    assert list(path.parent.iterdir()) == [path]


def test_mathrl_loader_reads_it(built):
    # The training loop's loader (model.io) must accept the directory as it is.
    from mathrl.model.io import load_model_and_tokenizer

    _, path, _ = built
    model, tokenizer = load_model_and_tokenizer(path)
    assert tokenizer.eos_token_id == 1 and model.config.tie_word_embeddings


@pytest.mark.parametrize(
    "text",
    [
        "347+589=9+7+0=16,4+8+1=13,3+5+1=09,\\boxed{936}",  # a worked solution as pretraining sees it
        "\\boxed{}",  # braces and the backslash must be single characters, not dropped or merged
        "0347+0589=",  # leading zeros (padded operands) are characters like any other
    ],
)
def test_saved_tokenizer_round_trips_arithmetic_text(built, text):
    # The tokenizer the trainer loads from the directory must give the ids pretraining used.
    from transformers import AutoTokenizer

    _, path, _ = built
    reference = build_char_tokenizer()
    loaded = AutoTokenizer.from_pretrained(path)
    ids = loaded(text)["input_ids"]
    assert ids == reference(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, no BOS/EOS added
    assert loaded.unk_token_id not in ids
    assert loaded.decode(ids) == text


def test_char_tokenizer_keeps_whitespace():
    # The in-memory char tokenizer has tokens for space and newline (templates "zero"/"plain" need them).
    tok = build_char_tokenizer()
    text = "User: 2 + 2?\nAssistant: \\boxed{4}"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text) and tok.decode(ids) == text


def test_saved_tokenizer_keeps_whitespace(built):
    # Bug story: the saved directory has model_type qwen2, and AutoTokenizer in transformers 5.x
    # ignores tokenizer_config's class for qwen2 (MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS) and
    # rebuilds a Qwen2Tokenizer: NFC + GPT-2 byte-level pre-tokenizer over our vocabulary. Space and
    # newline become the byte-level symbols 'Ġ'/'Ċ', which are not in the vocabulary, and BPE without
    # an unk token drops them silently. Arithmetic prompts have no whitespace, so the default demo
    # works; any "zero"/"plain" template or jsonl question reaches the model with its spaces removed.
    from transformers import AutoTokenizer

    _, path, _ = built
    text = "User: 2 + 2?\nAssistant: \\boxed{4}"
    assert AutoTokenizer.from_pretrained(path)(text)["input_ids"] == build_char_tokenizer()(text)["input_ids"]


def test_eos_is_dropped_when_decoding(built):
    # Rewards are computed on batch_decode(..., skip_special_tokens=True): EOS and padding must vanish,
    # both for the in-memory tokenizer and for the one the trainer loads from the directory.
    from transformers import AutoTokenizer

    _, path, _ = built
    for tok in (build_char_tokenizer(), AutoTokenizer.from_pretrained(path)):
        ids = tok("\\boxed{7}")["input_ids"] + [tok.eos_token_id, tok.pad_token_id, tok.pad_token_id]
        assert tok.decode(ids, skip_special_tokens=True) == "\\boxed{7}"


# --------------------------------------------------------------------------------------------------
# the cache key
# --------------------------------------------------------------------------------------------------
def _changed(value):
    return not value if isinstance(value, bool) else value + 1 if isinstance(value, int) else value * 0.5 + 0.01


def test_base_model_dir_changes_with_every_recipe_field(tmp_path):
    # The cache is keyed by a hash of the recipe: changing ANY field must build a new model instead of
    # silently reusing one trained differently.
    # mul_digits shapes only products: it is changed on a recipe that has some (mul_share > 0); without
    # them it trains nothing differently, and tests/tasks/test_products.py checks that it then keeps the hash.
    dirs = {base_model_dir(TINY, tmp_path)}
    for f in dataclasses.fields(BaseModelConfig):
        start = dataclasses.replace(TINY, mul_share=0.5) if f.name == "mul_digits" else TINY
        changed = dataclasses.replace(start, **{f.name: _changed(getattr(start, f.name))})
        assert base_model_dir(changed, tmp_path) != base_model_dir(start, tmp_path), f.name
        dirs.add(base_model_dir(changed, tmp_path))
    assert len(dirs) == 1 + len(dataclasses.fields(BaseModelConfig))


def test_base_model_dir_is_stable(tmp_path, monkeypatch):
    # Same recipe -> same directory (also for an equal but distinct object); the root comes from
    # cache_root or else MATHRL_CACHE.
    same = dataclasses.replace(TINY)
    assert base_model_dir(TINY, tmp_path) == base_model_dir(same, tmp_path)
    assert base_model_dir(TINY, tmp_path).parent == tmp_path / "base"
    assert base_model_dir(TINY, tmp_path).name == f"tiny-arith-{recipe_hash(TINY)}"
    monkeypatch.setenv("MATHRL_CACHE", str(tmp_path / "env"))
    assert base_model_dir(TINY) == tmp_path / "env" / "base" / f"tiny-arith-{recipe_hash(TINY)}"


def test_recipe_hash_is_pinned():
    # The default recipe's hash is part of every user's cache path; it should change only on purpose
    # (bumping BASE_FORMAT_VERSION or a recipe field), never by accident (e.g. dict ordering).
    assert recipe_hash(BaseModelConfig()) == "710f9396d286"
    assert recipe_hash(TINY) != recipe_hash(BaseModelConfig())


def test_ensure_base_model_uses_the_cache(built, monkeypatch):
    # The second call must find the built model and not train again (the real build takes minutes).
    root, path, _ = built

    def fail(*args, **kwargs):
        raise AssertionError("build_base_model called although the model is cached")

    monkeypatch.setattr(tiny, "build_base_model", fail)
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    announced = []
    assert ensure_base_model(TINY, pretraining_text=TEXT, cache_root=root, on_build_start=announced.append) == path
    assert announced == []
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime


def test_ensure_base_model_rebuilds_an_incomplete_directory(tmp_path, monkeypatch):
    # A directory without model.safetensors (e.g. a crash in an old version) is not a cached model: it
    # is replaced by a model built in a temporary directory beside it.
    calls = []

    def build(cfg, out, pretraining_text, progress=None):
        calls.append(out)
        (out / "model.safetensors").write_text("new")
        return out

    monkeypatch.setattr(tiny, "build_base_model", build)
    out = base_model_dir(TINY, tmp_path)
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    assert ensure_base_model(TINY, pretraining_text=TEXT, cache_root=tmp_path) == out
    assert len(calls) == 1 and calls[0].name.startswith(out.name + ".tmp-")
    assert (out / "model.safetensors").read_text() == "new" and not (out / "config.json").exists()
    assert list(out.parent.iterdir()) == [out]


RACER = """
import hashlib, json, sys, time
from pathlib import Path

from transformers import Qwen2ForCausalLM  # loaded before the start line, so that the builds overlap

from mathrl.config import BaseModelConfig
from mathrl.model.tiny import ensure_base_model
from mathrl.tasks.arithmetic import base_pretraining_text

cfg = BaseModelConfig(steps=5, batch_size=4, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                      num_kv_heads=1)
Path(sys.argv[1]).touch()  # ready
while not Path(sys.argv[2]).exists():  # the start line
    time.sleep(0.01)
events = []
path = ensure_base_model(cfg, pretraining_text=base_pretraining_text(cfg), on_build_start=lambda p: events.append("built"),
                         on_wait=lambda line: events.append("waited"))
sha = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
print(json.dumps({"path": str(path), "sha": sha, "events": events}))
"""


@pytest.mark.slow
def test_processes_racing_for_one_base_model_build_it_once(tmp_path):
    # Bug story: two processes building the same base model into an empty cache (ablate.py --jobs 2)
    # both trained it; the second died with "[Errno 39] Directory not empty" on the final rename.
    n, cache, go = 3, tmp_path / "cache", tmp_path / "go"
    env = {**os.environ, "MATHRL_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path / f"ready{i}"), str(go)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
    deadline = time.time() + 240
    while not all((tmp_path / f"ready{i}").exists() for i in range(n)) and time.time() < deadline:
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.05)
    go.touch()
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0] * n, [err[-2000:] for _, err in outs]
    results = [json.loads(out.splitlines()[-1]) for out, _ in outs]
    assert len({r["path"] for r in results}) == 1 and len({r["sha"] for r in results}) == 1
    events = sorted(e for r in results for e in r["events"])
    assert events.count("built") == 1, events  # one process built it; the others waited for it (or found it)
    model = Path(results[0]["path"])
    assert list(model.parent.iterdir()) == [model]  # no temporary directory, no lock file left


def test_progress_is_reported_every_step(tmp_path):
    # The CLI's progress bar relies on (step, total, loss) callbacks, one per optimizer step.
    seen = []
    tiny.build_base_model(dataclasses.replace(TINY, steps=2), tmp_path / "m", pretraining_text=TEXT, progress=lambda *a: seen.append(a))
    assert [(s, t) for s, t, _ in seen] == [(1, 2), (2, 2)]
    assert all(loss > 0 for _, _, loss in seen)
