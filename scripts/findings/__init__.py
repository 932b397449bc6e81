"""Figures and tables for docs/findings.md from finished runs: mean ± 95% CI over seeds.

    python scripts/findings curves recipes/findings/x.yaml --out runs/x --fig docs/findings/x.png
    python scripts/findings curves runs/x/a runs/x/a_seed1 --fig x.png --x tokens   # run directories
    python scripts/findings passk --base tiny-arith runs/x/a runs/x/a_seed1 --n 64 --limit 100 --fig passk.png
    python scripts/findings overconfidence --base tiny-arith runs/x/a runs/x/a_seed1 --limit 100 --fig oc.png
    python scripts/findings entropy-tokens runs/x/a runs/x/a_seed1 --steps 0 100 200 300 --out tokens.md
    python scripts/findings positions recipes/findings/ppo.yaml --out runs/x --steps 1 50 --fig positions.png
    python scripts/findings teach --teacher runs/t RUN ... --group LABEL ... --fig teach.png  # arms by FLOP
    python scripts/findings all [--dry-run] [--only entropy ppo] [--jobs 2]   # every findings run and analysis

Each command writes the figure, a Markdown table next to it (same stem, .md; also printed) and, for
the two sampling commands, the per-run numbers as JSON (same stem, .json).

* `curves` (curves.py): one panel per metric, one line per variant (the mean over its seeds) with a
  Student-t 95% band, and the final values.
* `passk` (sampling.py): pass@k for k = 1, 2, 4, ..., n of the base model and of each run's final
  model, sampled here on the runs' held-out set at their eval temperature.
* `overconfidence` (sampling.py): how RL moved the probability of the tokens of a response: base vs
  RL probability of every token, on responses sampled from the RL model and from the base.
* `entropy-tokens` (entropy_tokens.py): the highest-entropy (previous token, token) pairs of responses
  sampled from a run's kept checkpoints, per step (`analysis.entropy_probe.top_entropy_tokens`), as Markdown.
* `positions` (positions.py): PPO runs' critic value and advantage by response position
  (positions.jsonl), bucketed, mean ± CI over seeds, at the given steps.
* `teach` (teach.py): distillation arms and RL against their compute: held-out pass@1 and pass@8 by
  step, by student-sampled token and by FLOP (teacher passes included), and what each takes to reach a
  share of the teacher's pass@1.
* `all` (pipeline.py): the runs of every grid in recipes/findings (and finding 6's), then every
  analysis of docs/findings.md, from the registry `FINDINGS`; resumable, one progress bar.

Runs group into variants by name: ablate.py names seed N of variant `a` `a_seedN` (seed 0 keeps `a`),
so `a`, `a_seed1`, `a_seed2` are one variant; `--group` names the variant of each run explicitly.
Confidence intervals come from `mathrl.evaluation.metrics.mean_std_ci95` (t-distribution over seeds;
with one seed the half-width is nan and no band is drawn).
"""
