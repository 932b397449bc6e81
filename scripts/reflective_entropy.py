"""Entropy of the reflective arithmetic task's decision tokens, for the base model and RL checkpoints.

A response of the reflective recipe (recipes/arith_check_grpo.yaml) is a chain of columns
`x+y+c=NN`, each optionally followed by a check `?x+y+c=MM`. Most tokens are copies of the prompt's
digits and carry no choice; the choices sit at three kinds of positions:

* decision — the token after a column sum: `?` (check) or `,` (go on);
* sum — the two digits of a column sum (where the pretraining text slipped);
* check sum — the two digits of a check's sum (always right in the pretraining text).

For each model, this samples one response per held-out problem (temperature 1, the torch engine),
scores every response token (full-distribution entropy at temperature 1, `analysis.tokens.token_probs`)
and prints the mean entropy per kind of position, with the token counts.

    python scripts/reflective_entropy.py MODEL_DIR [MODEL_DIR ...] --config recipes/arith_check_grpo.yaml --limit 100
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict

from mathrl.analysis.tokens import token_probs
from mathrl.config import load_config
from mathrl.evaluation.evaluate import evaluate
from mathrl.model.io import load_model_and_tokenizer
from mathrl.reward.verify import Verifier
from mathrl.rollout.engine import TorchEngine
from mathrl.tasks.sources import build_eval_sets

COLUMN = re.compile(r"\d\+\d\+\d=(\d\d)(\?\d\+\d\+\d=(\d\d))?")


def roles(response: str) -> list[str]:
    """The kind of each character position of a response: decision, sum, check_sum or other."""
    kind = ["other"] * len(response)
    for m in COLUMN.finditer(response):
        for i in range(*m.span(1)):
            kind[i] = "sum"
        after = m.end(1)
        if after < len(response):
            kind[after] = "decision"  # "?" or ","
        if m.group(3) is not None:
            for i in range(*m.span(3)):
                kind[i] = "check_sum"
    return kind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--config", default="recipes/arith_check_grpo.yaml")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cfg = load_config(args.config)
    print("| model | decision (`?` or `,`) | sum digits | check-sum digits | other tokens | all response tokens |")
    print("| --- | --- | --- | --- | --- | --- |")
    for path in args.models:
        model, tokenizer = load_model_and_tokenizer(path, dtype="float32", device="cpu")
        model.eval()
        (es,) = build_eval_sets(cfg, tokenizer, limit=args.limit)
        engine = TorchEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        with Verifier(num_workers=0) as verifier:
            result = evaluate(es.name, es.problems, es.prompt_ids, engine=engine, tokenizer=tokenizer, verifier=verifier,
                              n=1, max_new_tokens=cfg.rollout.max_new_tokens, temperature=1.0, top_p=1.0, seed=args.seed)
        sums, counts = defaultdict(float), defaultdict(int)
        prompts = {p.id: tokenizer.decode(es.prompt_ids[i]) for i, p in enumerate(es.problems)}
        for sample in result.samples:
            scores = token_probs(model, tokenizer, prompts[sample["problem_id"]], sample["response"])
            kinds = roles(sample["response"])  # one token per character (the tiny model's tokenizer)
            for t, kind in enumerate(kinds[: len(scores)]):
                for key in (kind, "all"):
                    sums[key] += float(scores.entropy[t])
                    counts[key] += 1
        cells = [f"{sums[k] / counts[k]:.3f} nats ({counts[k]})" if counts[k] else "—"
                 for k in ("decision", "sum", "check_sum", "other", "all")]
        print(f"| {path} | " + " | ".join(cells) + " |", flush=True)
        del model


if __name__ == "__main__":
    main()
