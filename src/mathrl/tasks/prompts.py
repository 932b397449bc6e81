"""Turn a raw question into the text a model is prompted with.

Base models get a plain-text template (`render_prompt`); instruct models get their own chat format
(`render_chat`). Usage:

    from mathrl.tasks.prompts import render_prompt
    render_prompt("347+589", template="arith")          # -> "347+589="
    render_prompt(problem.question, template="zero")    # R1-Zero style conversation
    render_prompt(q, template="Q: {question}\\nA:")      # any custom string with {question}

Substitution is a plain `str.replace` of "{question}", never `str.format`: LaTeX questions are full
of braces ("\\frac{1}{2}") that `format` would try to interpret.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BOXED_INSTRUCTION", "TEMPLATES", "render_prompt", "render_chat"]

PLACEHOLDER = "{question}"

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
"""Qwen2.5-Math's instruction; also a good `system` for `render_chat`."""

TEMPLATES: dict[str, str] = {
    # The built-in arithmetic task: "347+589" -> "347+589=", the model continues with the digits.
    "arith": "{question}=",
    # R1-Zero style for base models (DeepSeek-R1, Guo et al. 2025, Table 1): a conversation frame
    # that makes a base model answer as "Assistant" and end with a boxed answer we can verify.
    "zero": (
        "A conversation between User and Assistant. The User asks a math question and the "
        "Assistant solves it. The Assistant first thinks through the reasoning step by step, then "
        "gives the final answer in \\boxed{}.\n"
        "User: {question}\n"
        "Assistant:"
    ),
    # The question followed by Qwen2.5-Math's step-by-step instruction.
    "plain": "{question}\n" + BOXED_INSTRUCTION + "\n",
}


def render_prompt(question: str, *, template: str) -> str:
    """Fill `template` (a name in TEMPLATES or a custom string containing "{question}")."""
    if template in TEMPLATES:
        text = TEMPLATES[template]
    elif PLACEHOLDER in template:
        text = template
    else:
        raise ValueError(
            f"unknown prompt template {template!r}: use one of {sorted(TEMPLATES)} or a custom "
            f"string containing {PLACEHOLDER!r}"
        )
    # One pass of replace: a question that itself contains "{question}" is not substituted again.
    return text.replace(PLACEHOLDER, question)


def render_chat(question: str, tokenizer: Any, *, system: str | None = None) -> str:
    """The question as a user turn in the tokenizer's own chat format, ending where the assistant's
    reply starts (add_generation_prompt=True). For instruct models; pass e.g.
    system=BOXED_INSTRUCTION to ask for a boxed answer.

    `tokenizer` is a Hugging Face tokenizer (anything with `chat_template` and
    `apply_chat_template`).
    """
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", type(tokenizer).__name__)
        raise ValueError(
            f"tokenizer {name!r} has no chat template (probably a base model): use "
            "render_prompt(question, template='zero' or 'plain') instead"
        )
    messages = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": question})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
