"""ToRL's training parquet (verl's dataset layout) as the jsonl that recipes/real/torl_qwen2.5_math_1.5b.yaml
reads: one {"problem", "answer", "source", "id"} row per problem.

    python scripts/torl_to_jsonl.py torl_data/train.parquet data/torl_train.jsonl
    mathrl train --nproc 8 recipes/real/torl_qwen2.5_math_1.5b.yaml data.train=data/torl_train.jsonl

verl's rows nest what mathrl's loader reads flat: the question is the content of the last "user" message
of `prompt` (a list of {"role", "content"}; ToRL's prompt[0] is a system message its template does not
use), the gold answer is `reward_model.ground_truth`, `data_source` names the source set and
`extra_info.index` numbers the row. A row without a question or an answer stops the conversion with
its row number (--skip-bad leaves such rows out and counts them). Read with pyarrow, which `datasets`
(a mathrl dependency) brings.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def question_of(prompt: Any) -> str | None:
    """The content of the last user message of a verl `prompt` (a list of messages, or its JSON text)."""
    if isinstance(prompt, str):
        try:
            prompt = json.loads(prompt)
        except json.JSONDecodeError:
            return prompt or None  # a plain-text prompt: the question itself
    users = [m.get("content") for m in prompt or [] if isinstance(m, dict) and m.get("role") == "user"]
    return users[-1] if users and users[-1] else None


def answer_of(reward_model: Any) -> str | None:
    """`reward_model.ground_truth` as text (a list joined with ", ", as the loader joins list answers)."""
    if not isinstance(reward_model, dict):
        return None
    truth = reward_model.get("ground_truth")
    if isinstance(truth, (list, tuple)):
        truth = ", ".join(str(t) for t in truth)
    return None if truth is None or str(truth).strip() == "" else str(truth)


def convert_rows(rows: list[dict[str, Any]], *, skip_bad: bool = False) -> tuple[list[dict[str, str]], int]:
    """(the jsonl rows, the count of rows left out); raises ValueError naming the first bad row unless `skip_bad`."""
    out, skipped = [], 0
    for i, row in enumerate(rows):
        question, answer = question_of(row.get("prompt")), answer_of(row.get("reward_model"))
        if question is None or answer is None:
            if not skip_bad:
                missing = "prompt has no user message" if question is None else "reward_model.ground_truth is missing"
                raise ValueError(f"row {i}: {missing} (--skip-bad leaves such rows out)")
            skipped += 1
            continue
        extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
        index = extra.get("index", i)
        out.append({"problem": question, "answer": answer, "source": str(row.get("data_source") or ""),
                    "id": f"torl-{index}"})
    return out, skipped


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("parquet", type=Path, help="ToRL's train.parquet (verl's layout)")
    p.add_argument("out", type=Path, help="the jsonl file to write")
    p.add_argument("--skip-bad", action="store_true", help="leave out rows without a question or an answer")
    args = p.parse_args(argv)
    import pyarrow.parquet as pq

    try:
        rows, skipped = convert_rows(pq.read_table(args.parquet).to_pylist(), skip_bad=args.skip_bad)
    except (OSError, ValueError) as e:
        print(f"torl_to_jsonl: {args.parquet}: {e}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} problems to {args.out}" + (f" ({skipped} rows without a question or answer left out)" if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
