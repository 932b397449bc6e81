"""`mathrl distill-data`: a teacher's checked answers as SFT rows, the off-policy distillation of
DeepSeek-R1's small models (sample from a strong model, keep what the checker accepts, fine-tune on it).

    mathrl distill-data --teacher runs/rl/final --out distilled.jsonl --n 4 --prompts 2000
    mathrl sft data.train=distilled.jsonl --run-dir runs/sft          # then, optionally, RL from its final/

The prompts come from the config's data section as `mathrl train` reads it: the built-in arithmetic
task (distinct training-split problems, never held out) or data.train's rows in file order, with the
same field maps and data.template. The teacher samples `n` answers per prompt with the configured
rollout engine (rollout.engine: torch, or vllm where installed); the reward checker
(reward.checker, reward.boxed) verifies each against the gold answer; `select_rows` keeps at most
`max_per_prompt` distinct correct, untruncated answers per prompt. The rows are written as
{"problem", "answer", "response"}, the fields `write_arith_sft_jsonl` writes and `mathrl sft`'s
default field map and sft.response_field read; the counts go to <out>.summary.json beside them.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from rich.console import Console

from mathrl.config import Config, ConfigError, load_config, parse_override
from mathrl.config.shared import TINY_BASE
from mathrl.evaluation.evaluate import sample_rows
from mathrl.evaluation.sweep import model_device
from mathrl.model.io import load_model_and_tokenizer
from mathrl.model.paths import looks_like_hub_id, resolve_model_path
from mathrl.reward.verify import Verifier
from mathrl.rollout.factory import build_engine
from mathrl.tasks.arithmetic import base_pretraining_text
from mathrl.tasks.base import Problem
from mathrl.tasks.sources import ProblemStream
from mathrl.train.dist import decide_device

__all__ = ["DistillSettings", "DistillSummary", "distill_config", "distill_data", "select_rows", "summary_path"]

# Overrides the flags set: the override would be silently replaced, so it is refused with the flag to use.
_FLAG_KEYS = {"model.path": "--teacher", "seed": "--seed", "rollout.temperature": "--temperature", "rollout.n": "--n"}
_ARITH_PROMPTS = 1000  # --prompts default on the generated task (a data file: all its rows)
_PIECE_ROWS = 512  # rows sampled per engine call (rounded to the engine's seed block): memory and progress


@dataclass(frozen=True)
class DistillSettings:
    """What `mathrl distill-data` samples and keeps, and where it writes."""

    teacher: str  # a Hugging Face model directory or hub id, a run directory (its final/), or tiny-arith
    out: str  # the .jsonl file to write
    n: int = 4  # answers sampled per prompt
    prompts: int | None = None  # prompts to sample; None: every row of data.train, 1000 arithmetic problems
    max_per_prompt: int = 1  # distinct correct answers kept per prompt
    temperature: float | None = None  # None: rollout.temperature of the config
    seed: int | None = None  # the problem draw (arithmetic) and the sampling; None: seed of the config
    force: bool = False  # overwrite an existing --out

    def validate(self) -> None:
        errors = []
        if self.n < 1:
            errors.append(f"--n must be >= 1, got {self.n}")
        if self.prompts is not None and self.prompts < 1:
            errors.append(f"--prompts must be >= 1, got {self.prompts}")
        if self.max_per_prompt < 1:
            errors.append(f"--max-per-prompt must be >= 1, got {self.max_per_prompt}")
        if self.temperature is not None and not self.temperature > 0:
            errors.append(f"--temperature must be > 0 (several samples per prompt need sampling), got {self.temperature}")
        if Path(self.out).suffix != ".jsonl":
            errors.append(f"--out {self.out!r} must end in .jsonl (mathrl sft reads data.train by its suffix)")
        if errors:
            raise ConfigError("\n".join(errors))

    def check_out(self) -> None:
        """Refuse to replace an existing --out (without --force) and an --out that cannot be written."""
        out = Path(self.out).expanduser()
        if out.exists() and not self.force:
            raise FileExistsError(f"--out {str(out)!r} already exists; pass --force to overwrite it, or choose another path")
        if out.is_dir():
            raise IsADirectoryError(f"--out {str(out)!r} is a directory; give a .jsonl file path")
        parent = out.absolute().parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise PermissionError(f"--out {str(out)!r}: {str(parent)!r} cannot be written; choose another path")


@dataclass
class DistillSummary:
    """The counts of one distillation (<out>.summary.json). Every correct sample is kept or counted in
    exactly one of duplicates, over_cap and truncated: correct = kept + duplicates + over_cap + truncated."""

    prompts: int = 0  # prompts sampled
    samples: int = 0  # answers sampled: prompts x n
    correct: int = 0  # answers the checker accepted
    kept: int = 0  # rows written
    duplicates: int = 0  # correct answers whose text equals one already kept for the prompt
    over_cap: int = 0  # correct, distinct answers beyond max_per_prompt
    truncated: int = 0  # correct answers that hit rollout.max_new_tokens (no EOS: not a whole answer to learn)
    sampled_tokens: int = 0  # response tokens the teacher generated over all samples (the compute of the data)
    prompts_unsolved: int = 0  # prompts with no correct answer among their n
    prompts_dropped: int = 0  # data.train rows left out: prompt over the length limit
    kept_share: float = 0.0  # kept / samples
    correct_share: float = 0.0  # correct / samples: the teacher's pass@1 on these prompts
    settings: dict = field(default_factory=dict)  # teacher, data, template, engine, n, max_per_prompt, sampling, seed
    wall_seconds: float = 0.0

    def line(self) -> str:
        return (f"{self.prompts} prompts x {self.settings.get('n')} = {self.samples} samples; {self.correct} correct "
                f"({self.correct_share:.3f}); kept {self.kept} ({self.kept_share:.3f} of the samples); "
                f"{self.prompts_unsolved} prompts with no correct answer; {self.duplicates} duplicates, "
                f"{self.over_cap} over --max-per-prompt, {self.truncated} truncated left out; {self.wall_seconds:.1f} s")


def summary_path(out: str | Path) -> Path:
    """<out>.summary.json beside the rows: distilled.jsonl -> distilled.summary.json."""
    return Path(out).expanduser().with_suffix(".summary.json")


# ----------------------------------------------------------------------------------------------- selection
def select_rows(texts: list[str], correct: list[bool], truncated: list[bool], *, n: int,
                max_per_prompt: int) -> tuple[list[int], DistillSummary]:
    """Which samples become rows: rows are prompt-major, `n` per prompt. Within a prompt, in sample
    order, a sample is kept when the checker accepted it, it ended (not truncated), its text differs
    from those kept for the prompt, and fewer than `max_per_prompt` are kept. Returns the kept row
    indices and the counts (prompts, samples, correct, kept, duplicates, over_cap, truncated,
    prompts_unsolved, shares)."""
    if not len(texts) == len(correct) == len(truncated) or len(texts) % n:
        raise ValueError(f"got {len(texts)} texts, {len(correct)} verdicts, {len(truncated)} truncation flags; "
                         f"need the same number, a multiple of n={n}")
    kept, s = [], DistillSummary(prompts=len(texts) // n, samples=len(texts))
    for start in range(0, len(texts), n):
        seen: set[str] = set()
        solved = False
        for i in range(start, start + n):
            if not correct[i]:
                continue
            s.correct += 1
            solved = True
            if truncated[i]:
                s.truncated += 1
            elif texts[i] in seen:
                s.duplicates += 1
            elif len(seen) >= max_per_prompt:
                s.over_cap += 1
            else:
                seen.add(texts[i])
                kept.append(i)
        s.prompts_unsolved += not solved
    s.kept = len(kept)
    s.kept_share = s.kept / s.samples if s.samples else 0.0
    s.correct_share = s.correct / s.samples if s.samples else 0.0
    return kept, s


# ----------------------------------------------------------------------------------------------- config
def teacher_model_path(teacher: str) -> str:
    """The model directory (or hub id, or tiny-arith) that --teacher names; a run directory stands for
    its final/. Raises ValueError, one line, for a teacher that is none of those."""
    path = Path(teacher).expanduser()
    if teacher == TINY_BASE and not path.exists():
        return TINY_BASE
    if not path.exists():
        if looks_like_hub_id(teacher):
            return teacher  # the config's model.path check says whether it is in the cache
        raise ValueError(f"--teacher {teacher!r} does not exist; give a Hugging Face model directory, a run directory "
                         f"(its final/ is used) or {TINY_BASE}")
    if (path / "config.yaml").is_file() and not (path / "config.json").is_file():  # a run directory
        if not (path / "final" / "config.json").is_file():
            raise ValueError(f"--teacher {teacher!r} is a run directory without final/ (not finished); give one of its "
                             "checkpoints/step_*/ directories")
        return str(path / "final")
    if not (path / "config.json").is_file():
        raise ValueError(f"--teacher {teacher!r} is neither a Hugging Face model directory (no config.json) nor a run "
                         "directory (no config.yaml)")
    return str(path)


def distill_config(recipe: str | None, overrides: list[str], settings: DistillSettings) -> Config:
    """The recipe and overrides, with model.path the teacher and (when given) seed the --seed and
    rollout.temperature the --temperature; an override of a key a flag sets is refused, naming the flag."""
    for text in overrides:
        key, _ = parse_override(text)
        if key in _FLAG_KEYS:
            raise ConfigError(f"override {text!r} has no effect in `mathrl distill-data`; use {_FLAG_KEYS[key]} instead")
    teacher = teacher_model_path(settings.teacher)
    flags = [f"model.path={json.dumps(teacher)}"]
    flags += [f"seed={settings.seed}"] if settings.seed is not None else []
    flags += [f"rollout.temperature={settings.temperature}"] if settings.temperature is not None else []
    return load_config(recipe, [*overrides, *flags])


# ----------------------------------------------------------------------------------------------- prompts
def distill_prompts(cfg: Config, tokenizer, count: int | None) -> tuple[list[Problem], list[list[int]], int]:
    """(problems, prompt ids, rows dropped for length): `count` distinct training-split arithmetic
    problems drawn with cfg.seed (the default count 1000), or data.train's first `count` rows (all
    when None) whose prompts fit, rendered with data.template as `mathrl train` and `mathrl sft` do."""
    stream = ProblemStream(cfg, tokenizer)
    if stream.task is None:  # a data file: its rows in order
        rows = stream.pool if count is None else stream.pool[:count]
        problems, ids, _ = stream.encoder.encode(rows)
        if not problems:
            raise ValueError(f"data.train {cfg.data.train!r}: no prompt fits within {stream.encoder.limit}")
        return problems, ids, stream.encoder.dropped
    count = count or _ARITH_PROMPTS
    problems, ids, seen = [], [], set()
    for _attempt in range(20):  # draws repeat a problem now and then: draw again until `count` distinct
        batch, batch_ids, _ = stream.next_batch(count - len(problems))
        for p, i in zip(batch, batch_ids):
            if p.question not in seen:
                seen.add(p.question)
                problems.append(p)
                ids.append(i)
        if len(problems) == count:
            return problems, ids, 0
    raise ValueError(f"data.arith gives only {len(problems)} distinct training problems; lower --prompts "
                     "or widen the task (data.arith.max_digits)")


# ----------------------------------------------------------------------------------------------- the run
def distill_data(cfg: Config, settings: DistillSettings, *, console: Console | None = None,
                 verifier=None) -> DistillSummary:
    """Sample settings.n answers per prompt from the teacher (cfg.model.path, as `distill_config` sets
    it; rollout.temperature, rollout.top_p, rollout.max_new_tokens; the problem draw and the samples
    seeded by cfg.seed), keep the checked ones (`select_rows`) and write them to settings.out as SFT
    rows, with the summary beside them (`summary_path`). `verifier`: anything with the Verifier's
    `score(texts, golds)`; default the config's checker (reward.checker, reward.boxed) in worker processes."""
    console = console or Console()
    settings.validate()
    settings.check_out()
    t0 = time.time()
    device = decide_device(cfg.train.device, local_rank=0, cuda_available=torch.cuda.is_available())
    model_path = resolve_model_path(cfg, console, pretraining_text=base_pretraining_text(cfg.base))
    model, tokenizer = load_model_and_tokenizer(model_path, dtype=cfg.model.dtype,
                                                device=model_device(cfg.rollout.engine, device.type))
    problems, prompts, dropped = distill_prompts(cfg, tokenizer, settings.prompts)
    console.print(f"teacher {model_path}: {len(problems)} prompts x {settings.n} samples"
                  + (f" ({dropped} rows dropped: prompt too long)" if dropped else ""), highlight=False)
    engine = build_engine(cfg, model=model, tokenizer=tokenizer, model_path=model_path)
    own = verifier is None
    if own:
        verifier = Verifier(num_workers=cfg.reward.num_workers, timeout_s=cfg.reward.timeout_s,
                            boxed=cfg.reward.boxed, checker=cfg.reward.checker)
    try:
        texts, correct, truncated, tokens = _sample(engine, tokenizer, verifier, problems, prompts, cfg, settings,
                                                    console)
    finally:
        engine.close()
        if own:
            verifier.close()
    kept, summary = select_rows(texts, correct, truncated, n=settings.n, max_per_prompt=settings.max_per_prompt)
    summary.prompts_dropped, summary.sampled_tokens = dropped, tokens
    summary.settings = {"teacher": model_path, "data": cfg.data.train, "template": cfg.data.template,
                        "engine": cfg.rollout.engine, "n": settings.n, "max_per_prompt": settings.max_per_prompt,
                        "temperature": cfg.rollout.temperature, "top_p": cfg.rollout.top_p,
                        "max_new_tokens": cfg.rollout.max_new_tokens, "seed": cfg.seed, "out": str(settings.out)}
    summary.wall_seconds = time.time() - t0
    _write(settings, [problems[i // settings.n] for i in kept], [texts[i] for i in kept], summary)
    console.print(f"wrote {settings.out}: {summary.line()}", highlight=False)
    console.print(f"fine-tune on it: mathrl sft data.train={settings.out}", highlight=False)
    return summary


def _sample(engine, tokenizer, verifier, problems, prompts, cfg: Config, settings: DistillSettings,
            console: Console) -> tuple[list[str], list[bool], list[bool], int]:
    """Every row's text, verdict and truncation flag, rows prompt-major (n per prompt), and the response
    tokens sampled in all; sampled in pieces whose seeds are those of one whole call (each piece starts at
    a multiple of the engine's seed block)."""
    from mathrl.track.console import make_progress

    n = settings.n
    flat_prompts = [p for p in prompts for _ in range(n)]
    flat_problems = [p for p in problems for _ in range(n)]
    block = max(getattr(engine, "seed_block", 1), 1)
    piece = max(_PIECE_ROWS // block, 1) * block
    texts, correct, truncated, tokens = [], [], [], 0
    with make_progress(console, "distill-data") as progress:
        task = progress.add_task("sample", total=len(flat_prompts), info="")
        for lo in range(0, len(flat_prompts), piece):
            got = sample_rows(flat_prompts[lo : lo + piece], flat_problems[lo : lo + piece], first_row=lo, engine=engine,
                              tokenizer=tokenizer, verifier=verifier, max_new_tokens=cfg.rollout.max_new_tokens,
                              temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, seed=cfg.seed)
            texts += got.texts
            correct += [r.score > 0 for r in got.results]
            truncated += [bool(t) for t in got.truncated]
            tokens += sum(got.lengths)
            progress.update(task, advance=len(got.texts), info=f"{sum(correct)} correct")
    return texts, correct, truncated, tokens


def _write(settings: DistillSettings, problems: list[Problem], responses: list[str], summary: DistillSummary) -> None:
    """The rows and the summary, each written to a temporary file and renamed into place: an interrupted
    run leaves no half-written --out behind (which the next run would refuse to replace)."""
    out = Path(settings.out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    settings.check_out()  # again: something may have been written there while the teacher sampled
    rows = "".join(json.dumps({"problem": p.question, "answer": p.answer, "response": r}) + "\n"
                   for p, r in zip(problems, responses))
    for path, text in ((summary_path(out), json.dumps(asdict(summary), indent=2) + "\n"), (out, rows)):  # the rows last
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
