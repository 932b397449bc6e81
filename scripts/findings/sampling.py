"""`passk` and `overconfidence`: sample the base model and each run's final model on the runs' held-out set.

    python scripts/findings passk --base tiny-arith runs/x/a runs/x/a_seed1 --n 64 --limit 100 --fig passk.png
    python scripts/findings overconfidence --base tiny-arith runs/x/a runs/x/a_seed1 --limit 100 --fig oc.png

The held-out problems are the runs' own evaluation set (`build_eval_sets` with the run's config.yaml,
the first `--limit` problems of its first eval source); sampling goes through `evaluation.evaluate`
and `rollout.factory.build_engine` with the torch engine, the verifier is the run's `reward.*`.
`--base tiny-arith` is the run's cached tiny base model (built from its `base.*`, as the CLI does).

* passk: n samples per problem at the run's eval temperature and top-p; the unbiased pass@k for
  k = 1, 2, 4, ..., n (Chen et al. 2021). RL typically lifts pass@1 far more than pass@n (Yue et al.
  2025, "Does Reinforcement Learning Really Incentivize Reasoning Capacity in LLMs Beyond the Base
  Model?"): the curves cross or meet at large k.
* overconfidence: one response per problem at temperature 1, and every response token's probability
  under the base and under the RL model (`analysis.tokens.token_probs`, temperature 1): the share of
  tokens whose probability moved by more than 0.1, the shares above 0.99, and the mean RL probability
  of the tokens in each base-probability bin. Done on responses of the RL model and, as a control
  (the RL model's own samples are the ones it made likely), on responses of the base model.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from findings.common import MISSING, ci_cell, color, fmt, group_runs, markdown_table, new_figure, write_outputs
from mathrl.analysis.tokens import check_same_tokenizer, token_probs
from mathrl.config import Config, load_config
from mathrl.evaluation.evaluate import evaluate
from mathrl.evaluation.metrics import default_ks, mean_std_ci95
from mathrl.model.io import load_model_and_tokenizer
from mathrl.model.paths import TINY_BASE, resolve_model_path
from mathrl.rollout.factory import build_engine
from mathrl.tasks.arithmetic import base_pretraining_text
from mathrl.tasks.sources import build_eval_sets, prompt_encoder

TABLE_KS = (1, 8, 64)
BIN_EDGES = (0.1, 0.5, 0.9, 0.99)  # p_base bins [0,0.1) [0.1,0.5) [0.5,0.9) [0.9,0.99) [0.99,1]
BIN_NAMES = ("[0,0.1)", "[0.1,0.5)", "[0.5,0.9)", "[0.9,0.99)", "[0.99,1]")
MOVED = 0.1  # |p_rl - p_base| above this: the token's probability moved
SATURATED = 0.99


# ---- models and data ------------------------------------------------------------------------------


def run_config(run: Path) -> Config:
    """The run's config.yaml, sampling with the torch engine."""
    if not (run / "config.yaml").is_file() or not (run / "final" / "config.json").is_file():
        raise ValueError(f"{run} is not a finished run (needs config.yaml and final/)")
    cfg = load_config(run / "config.yaml", check_paths=False)
    cfg.rollout.engine = "torch"
    return cfg


def base_path(base: str, cfg: Config, console) -> str:
    """A model directory as given, or `tiny-arith`: the run's cached tiny base model (built if missing)."""
    if base == TINY_BASE and not Path(base).exists():
        cfg = copy.deepcopy(cfg)
        cfg.model.path = TINY_BASE
        return resolve_model_path(cfg, console, pretraining_text=base_pretraining_text(cfg.base))
    return base


def device_of(name: str) -> str:
    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name


def load(path: str | Path, cfg: Config, device: str):
    model, tokenizer = load_model_and_tokenizer(path, dtype=cfg.model.dtype, device=device)
    return model.eval(), tokenizer


def held_out(cfg: Config, tokenizer, limit: int):
    """The first `limit` problems of the run's first evaluation set."""
    return build_eval_sets(cfg, tokenizer, limit=limit)[0]


def _verifier(cfg: Config):
    from mathrl.reward.verify import Verifier

    return Verifier(num_workers=cfg.reward.num_workers, timeout_s=cfg.reward.timeout_s, boxed=cfg.reward.boxed)


def _group_label(groups: dict[str, list[Path]], run: Path) -> str:
    return next(name for name, runs in groups.items() if run in runs)


# ---- pass@k ---------------------------------------------------------------------------------------


def model_pass_at_k(model_path: str | Path, cfg: Config, *, n: int, limit: int, seed: int, device: str,
                    verifier) -> dict[int, float]:
    """k -> unbiased pass@k of the model, n samples per held-out problem at cfg's eval temperature."""
    model, tokenizer = load(model_path, cfg, device)
    es = held_out(cfg, tokenizer, limit)
    engine = build_engine(cfg, model=model, tokenizer=tokenizer, model_path=model_path)
    result = evaluate(es.name, es.problems, es.prompt_ids, engine=engine, tokenizer=tokenizer, verifier=verifier, n=n,
                      max_new_tokens=cfg.eval_max_new_tokens, temperature=cfg.eval.temperature, top_p=cfg.eval.top_p,
                      seed=seed)
    return result.pass_at_k


def run_passk(base: str, runs: Sequence[Path], *, n: int, limit: int, fig_path: Path, labels: Sequence[str] | None = None,
              seed: int | None = None, device: str = "auto", verifier=None, console=None) -> tuple[str, dict]:
    """Sample, plot and tabulate; returns (table, results). `verifier` defaults to the first run's."""
    from mathrl.track.console import make_console

    console = console or make_console(stderr=True)
    runs = [Path(r) for r in runs]
    groups = group_runs(runs, labels)
    device = device_of(device)
    ks = default_ks(n)
    configs = {run: run_config(run) for run in runs}
    own_verifier = verifier is None
    verifier = verifier or _verifier(configs[runs[0]])
    results: dict = {"ks": ks, "n": n, "limit": limit, "base": {}, "base_of": {}, "runs": {}}
    try:
        for run in runs:
            cfg = configs[run]
            draw = cfg.eval.seed if seed is None else seed
            path = base_path(base, cfg, console)
            if path not in results["base"]:  # the runs of a grid usually share one base model
                console.print(f"pass@k of the base {path} (n={n}, {limit} problems)")
                results["base"][path] = model_pass_at_k(path, cfg, n=n, limit=limit, seed=draw, device=device,
                                                         verifier=verifier)
            results["base_of"].setdefault(path, [])
            if _group_label(groups, run) not in results["base_of"][path]:
                results["base_of"][path].append(_group_label(groups, run))
            console.print(f"pass@k of {run}/final")
            results["runs"][str(run)] = {
                "group": _group_label(groups, run), "base": path,
                "pass@k": model_pass_at_k(run / "final", cfg, n=n, limit=limit, seed=draw, device=device,
                                          verifier=verifier),
            }
    finally:
        if own_verifier:
            verifier.close()

    per_group = {g: [results["runs"][str(r)]["pass@k"] for r in members] for g, members in groups.items()}
    shown = [k for k in TABLE_KS if k in ks] + ([ks[-1]] if ks[-1] not in TABLE_KS else [])
    rows = []
    for path, table in results["base"].items():
        rows.append([_base_label(path, results), "1"] + [fmt(table[k]) for k in shown])
    for g, tables in per_group.items():
        rows.append([g, str(len(tables))] + [ci_cell([t[k] for t in tables]) for k in shown])
    table = markdown_table(["model", "runs"] + [f"pass@{k}" for k in shown], rows)

    fig, (ax,) = new_figure(1, size=(6.0, 4.0))
    group_index = {g: i for i, g in enumerate(groups)}
    for path, t in results["base"].items():  # several bases (runs from different base.* settings): their runs' colour
        base_color = "black" if len(results["base"]) == 1 else color(group_index[results["base_of"][path][0]])
        ax.plot(ks, [t[k] for k in ks], color=base_color, linestyle="--", marker="o", markersize=3,
                label=_base_label(path, results))
    for i, (g, tables) in enumerate(per_group.items()):
        stats = [mean_std_ci95([t[k] for t in tables]) for k in ks]
        mean = [m for m, _, _ in stats]
        ax.plot(ks, mean, color=color(i), marker="o", markersize=3, label=f"{g} (n={len(tables)})")
        if len(tables) > 1:
            ax.fill_between(ks, [m - h for m, _, h in stats], [m + h for m, _, h in stats], color=color(i), alpha=0.2,
                            linewidth=0)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("k (samples per problem)")
    ax.set_ylabel("pass@k")
    ax.set_title(f"held-out pass@k, n={n}, {limit} problems", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    write_outputs(fig_path, fig, table)
    fig_path.with_suffix(".json").write_text(json.dumps(results, indent=2))
    return table, results


def _base_label(path: str, results: dict) -> str:
    """"base", or with several base models "base of <the variants trained from it>"."""
    return "base" if len(results["base"]) == 1 else f"base of {', '.join(results['base_of'][path])}"


# ---- over-confidence ------------------------------------------------------------------------------


def token_shift_stats(p_base: torch.Tensor, p_rl: torch.Tensor, *, moved: float = MOVED,
                      saturated: float = SATURATED) -> dict:
    """Summary of how RL moved the probabilities of a set of tokens. p_base, p_rl: [T], the same tokens.

    moved: share with |p_rl - p_base| > `moved`; rl_saturated / base_saturated: shares with p > `saturated`;
    bins: per p_base bin (BIN_EDGES) the token count and the mean p_base and p_rl of its tokens (nan
    when empty).
    """
    if p_base.shape != p_rl.shape or p_base.dim() != 1:
        raise ValueError(f"need two [T] tensors of the same tokens, got {tuple(p_base.shape)} and {tuple(p_rl.shape)}")
    p_base, p_rl = p_base.double(), p_rl.double()
    which = torch.bucketize(p_base, torch.tensor(BIN_EDGES, dtype=torch.float64), right=True)  # [T] in 0..4
    bins = []
    for b, name in enumerate(BIN_NAMES):
        sel = which == b
        count = int(sel.sum())
        bins.append({"bin": name, "tokens": count,
                     "p_base": float(p_base[sel].mean()) if count else math.nan,
                     "p_rl": float(p_rl[sel].mean()) if count else math.nan})
    tokens = len(p_base)
    share = (lambda mask: float(mask.double().mean())) if tokens else (lambda mask: math.nan)
    return {"tokens": tokens, "moved": share((p_rl - p_base).abs() > moved), "rl_saturated": share(p_rl > saturated),
            "base_saturated": share(p_base > saturated), "bins": bins}


@torch.no_grad()
def sample_and_score(sampler, base_model, rl_model, tokenizer, cfg: Config, es, *, seed: int,
                     model_path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(p_base, p_rl), each [total response tokens]: one response per problem sampled from `sampler` at
    temperature 1, every token (the EOS that ended it included) scored by both models at temperature 1."""
    engine = build_engine(cfg, model=sampler, tokenizer=tokenizer, model_path=model_path)
    out = engine.generate(es.prompt_ids, max_new_tokens=cfg.eval_max_new_tokens, temperature=1.0, top_p=1.0, seed=seed)
    encoder = prompt_encoder(cfg, tokenizer, max_new_tokens=cfg.eval_max_new_tokens)
    special = cfg.data.template != "chat"  # as PromptEncoder: a chat template carries its special tokens
    p_base, p_rl = [], []
    for i, problem in enumerate(es.problems):
        prompt = encoder.text(problem.question)
        if list(tokenizer(prompt, add_special_tokens=special)["input_ids"]) != list(es.prompt_ids[i]):
            raise ValueError(f"problem {problem.id}: its prompt text does not re-encode to the prompt ids that were sampled")
        ids = out.response_ids[i, : int(out.response_lengths[i])].tolist()
        if not ids:
            continue
        p_base.append(token_probs(base_model, tokenizer, prompt, ids, add_special_tokens=special).probs)
        p_rl.append(token_probs(rl_model, tokenizer, prompt, ids, add_special_tokens=special).probs)
    return torch.cat(p_base), torch.cat(p_rl)


def run_overconfidence(base: str, runs: Sequence[Path], *, limit: int, fig_path: Path,
                       labels: Sequence[str] | None = None, seed: int | None = None, device: str = "auto",
                       console=None) -> tuple[str, dict]:
    """Sample, score, plot and tabulate; returns (table, results)."""
    from mathrl.track.console import make_console

    console = console or make_console(stderr=True)
    runs = [Path(r) for r in runs]
    groups = group_runs(runs, labels)
    device = device_of(device)
    bases: dict[str, tuple] = {}
    results: dict = {"limit": limit, "runs": {}}
    histogram = None  # (p_base, p_rl) of the first run's own responses
    for run in runs:
        cfg = run_config(run)
        draw = cfg.eval.seed if seed is None else seed
        path = base_path(base, cfg, console)
        if path not in bases:
            bases[path] = load(path, cfg, device)
        base_model, tokenizer = bases[path]
        rl_model, rl_tokenizer = load(run / "final", cfg, device)
        check_same_tokenizer(tokenizer, rl_tokenizer, names=("base", f"{run}/final"))
        es = held_out(cfg, tokenizer, limit)
        console.print(f"over-confidence of {run}/final against {path} ({len(es.problems)} problems)")
        record = {"group": _group_label(groups, run), "base": path}
        for source, sampler, sampler_path in (("rl", rl_model, run / "final"), ("base", base_model, path)):
            p_base, p_rl = sample_and_score(sampler, base_model, rl_model, tokenizer, cfg, es, seed=draw,
                                            model_path=sampler_path)
            record[f"{source}_samples"] = token_shift_stats(p_base, p_rl)
            if histogram is None and source == "rl":
                histogram = (run.name, p_base.numpy(), p_rl.numpy())
        results["runs"][str(run)] = record
        del rl_model

    table = overconfidence_table(results, groups)
    fig = overconfidence_figure(results, groups, histogram)
    write_outputs(fig_path, fig, table)
    fig_path.with_suffix(".json").write_text(json.dumps(results, indent=2))
    return table, results


SOURCES = (("rl", "RL model"), ("base", "base model"))


def overconfidence_table(results: dict, groups: dict[str, list[Path]]) -> str:
    """One row per variant and response source: shares and per-bin mean p_RL, mean ± ci95 over runs."""
    header = ["variant", "responses from", "tokens", f"|Δp| > {MOVED}", f"p_RL > {SATURATED}", f"p_base > {SATURATED}"]
    header += [f"mean p_RL, p_base in {b}" for b in BIN_NAMES]
    rows = []
    for g, members in groups.items():
        for source, source_name in SOURCES:
            stats = [results["runs"][str(r)][f"{source}_samples"] for r in members]
            row = [g, source_name, str(sum(s["tokens"] for s in stats))]
            row += [ci_cell([s[key] for s in stats if s["tokens"]]) for key in ("moved", "rl_saturated", "base_saturated")]
            for b in range(len(BIN_NAMES)):
                count = sum(s["bins"][b]["tokens"] for s in stats)
                cell = ci_cell([s["bins"][b]["p_rl"] for s in stats if s["bins"][b]["tokens"]])
                row.append(MISSING if cell == MISSING else f"{cell}, {count} tok")
            rows.append(row)
    return markdown_table(header, rows)


def overconfidence_figure(results: dict, groups: dict[str, list[Path]], histogram):
    fig, (ax, hist_ax) = new_figure(2, size=(5.2, 4.2))
    ax.plot([0, 1], [0, 1], color="grey", linewidth=0.8, linestyle=":", label="p_RL = p_base")
    for i, (g, members) in enumerate(groups.items()):
        for source, source_name in SOURCES:
            stats = [results["runs"][str(r)][f"{source}_samples"] for r in members]
            xs, ys, errs = [], [], []
            for b in range(len(BIN_NAMES)):
                filled = [s["bins"][b] for s in stats if s["bins"][b]["tokens"]]
                if filled:
                    xs.append(sum(f["p_base"] for f in filled) / len(filled))
                    mean, _, half = mean_std_ci95([f["p_rl"] for f in filled])
                    ys.append(mean)
                    errs.append(0.0 if math.isnan(half) else half)
            ax.errorbar(xs, ys, yerr=errs if len(stats) > 1 else None, color=color(i), marker="o", markersize=3,
                        capsize=2, linestyle="-" if source == "rl" else "--",
                        label=f"{g} (n={len(stats)}), {source_name} responses")
    ax.set_xlabel("mean p_base of the bin")
    ax.set_ylabel("mean p_RL")
    ax.set_title("p_RL by p_base bin, " + " ".join(BIN_NAMES), fontsize=8)
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    if histogram is not None:
        from matplotlib.colors import LogNorm

        name, p_base, p_rl = histogram
        *_, image = hist_ax.hist2d(p_base, p_rl, bins=40, range=[[0, 1], [0, 1]], norm=LogNorm(), cmap="viridis")
        fig.colorbar(image, ax=hist_ax, label="tokens")
        hist_ax.plot([0, 1], [0, 1], color="white", linewidth=0.6, linestyle=":")
        hist_ax.set_title(f"{name}: tokens of its own responses", fontsize=8)
        hist_ax.set_xlabel("p_base")
        hist_ax.set_ylabel("p_RL")
    return fig


__all__ = ["BIN_EDGES", "BIN_NAMES", "model_pass_at_k", "overconfidence_table", "run_overconfidence", "run_passk",
           "sample_and_score", "token_shift_stats"]
