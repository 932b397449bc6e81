"""Turn a raw question into the text a model is prompted with.

Base models get a plain-text template (`render_prompt`); instruct models get their own chat format
(`render_chat`). Usage:

    from mathrl.tasks.prompts import render_prompt
    render_prompt("347+589", template="arith")          # -> "347+589="
    render_prompt(problem.question, template="zero")    # R1-Zero style conversation
    render_prompt(q, template="Q: {question}\\nA:")      # any custom string with {question}

    encoder = PromptEncoder(tokenizer, template="zero", max_prompt_tokens=512, max_new_tokens=3000)
    kept, ids, texts = encoder.encode(problems)   # encoder.dropped, encoder.unencodable count what went wrong

Substitution is a plain `str.replace` of "{question}", never `str.format`: LaTeX questions are full
of braces ("\\frac{1}{2}") that `format` would try to interpret.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mathrl.registry import PROMPT_TEMPLATES

__all__ = ["BOXED_INSTRUCTION", "TEMPLATES", "PromptEncoder", "model_context_length", "render_prompt", "render_chat"]

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
for _name in TEMPLATES:  # the names data.template accepts (besides chat and a custom string)
    PROMPT_TEMPLATES.register(_name, TEMPLATES[_name])


def render_prompt(question: str, *, template: str) -> str:
    """Fill `template` (a name in TEMPLATES or a custom string containing "{question}")."""
    if template in PROMPT_TEMPLATES.names():  # the built-ins of TEMPLATES and any registered later
        text = PROMPT_TEMPLATES.get(template)
    elif PLACEHOLDER in template:
        text = template
    else:
        raise ValueError(
            f"unknown prompt template {template!r}: use one of {sorted(PROMPT_TEMPLATES.names())} or a custom "
            f"string containing {PLACEHOLDER!r}"
        )
    # One pass of replace: a question that itself contains "{question}" is not substituted again.
    return text.replace(PLACEHOLDER, question)


def render_chat(question: str, tokenizer: Any, *, system: str | None = None, tools: list[dict] | None = None) -> str:
    """The question as a user turn in the tokenizer's own chat format, ending where the assistant's
    reply starts (add_generation_prompt=True). For instruct models; pass e.g.
    system=BOXED_INSTRUCTION to ask for a boxed answer.

    `tokenizer` is a Hugging Face tokenizer (anything with `chat_template` and
    `apply_chat_template`). `tools`: function schemas the template lists for the model (rollout.tools
    with tool_format chat_tool_call; `mathrl.tools.tool_schemas`).
    """
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", type(tokenizer).__name__)
        raise ValueError(  # data.template is the field behind both spellings; the command line is where it is set
            f"tokenizer {name!r} has no chat template (probably a base model): use a text template instead, "
            "data.template=zero (or plain) on the command line or in the recipe; mathrl eval: --template zero"
        )
    messages = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": question})
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra)


def model_context_length(tokenizer: Any) -> int | None:
    """max_position_embeddings of the model the tokenizer was loaded with (config.json in its
    directory), or None when that is not a local model directory."""
    config = Path(str(getattr(tokenizer, "name_or_path", "") or "")) / "config.json"
    if not config.is_file():
        return None
    data = json.loads(config.read_text())
    value = data.get("max_position_embeddings") or data.get("text_config", {}).get("max_position_embeddings")
    return int(value) if value else None


def _warn(message: str) -> None:
    print(f"mathrl: warning: {message}", file=sys.stderr, flush=True)


class PromptEncoder:
    """Question text -> prompt text -> token ids.

    A prompt is dropped (counted in `dropped`, never truncated) when it is longer than
    `max_prompt_tokens`, or than the model's context minus `max_new_tokens` (the response must fit
    after it). Characters the tokenizer cannot encode (it drops them, or maps them to its unknown
    token) are counted in `unencodable` and warned about once: a question in a script the tokenizer
    does not know would otherwise reach the model as a prompt with its words missing. `suffix`
    (data.question_suffix) is appended to every question, after a space, before the template.
    """

    def __init__(self, tokenizer: Any, *, template: str, max_prompt_tokens: int, max_new_tokens: int,
                 context_length: int | None = None, warn: Callable[[str], None] = _warn, suffix: str = "",
                 tools: list[dict] | None = None):
        self.template, self.tokenizer, self.warn, self.suffix = template, tokenizer, warn, suffix
        self.tools = tools  # function schemas for the chat template (tool_format chat_tool_call)
        self.max_tokens = max_prompt_tokens
        self.limit = f"data.max_prompt_tokens={max_prompt_tokens}"
        context = context_length if context_length is not None else model_context_length(tokenizer)
        if context is not None and context - max_new_tokens < max_prompt_tokens:
            self.max_tokens = context - max_new_tokens
            self.limit = (f"the model's context of {context} positions minus max_new_tokens={max_new_tokens} "
                          f"({self.max_tokens} tokens)")
            if self.max_tokens < 1:
                raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's context "
                                 f"of {context} positions (max_position_embeddings); lower rollout.max_new_tokens / "
                                 "eval.max_new_tokens")
        self.dropped = 0  # prompts over the limit
        self.unencodable = 0  # characters of kept prompts the tokenizer could not encode
        self._char_ok: dict[str, bool] = {}

    def text(self, question: str) -> str:
        if self.suffix:  # data.question_suffix, e.g. DeepScaleR's instruction after every problem
            question = f"{question} {self.suffix}"
        if self.template == "chat":
            return render_chat(question, self.tokenizer, tools=self.tools)
        return render_prompt(question, template=self.template)

    def lost_chars(self, text: str) -> list[str]:
        """The characters of `text` (whitespace aside) that do not survive encode -> decode."""
        lost = []
        for ch in dict.fromkeys(text):
            if ch.isspace():
                continue
            ok = self._char_ok.get(ch)
            if ok is None:
                ids = self.tokenizer(ch, add_special_tokens=False)["input_ids"]
                ok = self._char_ok[ch] = ch in self.tokenizer.decode(ids, skip_special_tokens=True)
            if not ok:
                lost.append(ch)
        return lost

    def encode(self, problems: list) -> tuple[list, list[list[int]], list[str]]:
        """(kept problems, their prompt ids, their prompt texts)."""
        kept, ids, texts = [], [], []
        for p in problems:
            text = self.text(p.question)
            # a chat template already contains the special tokens it needs
            tokens = self.tokenizer(text, add_special_tokens=self.template != "chat")["input_ids"]
            if len(tokens) > self.max_tokens:
                self.dropped += 1
                continue
            lost = self.lost_chars(text)
            if lost:
                if not self.unencodable:
                    self.warn(f"the tokenizer cannot encode some characters of the prompts ({''.join(lost[:10])!r} in "
                              f"problem {p.id}); they are left out of the prompt. Counted in data/unencodable_chars; "
                              "a model whose tokenizer knows them avoids this")
                self.unencodable += sum(text.count(ch) for ch in lost)
            kept.append(p)
            ids.append(tokens)
            texts.append(text)
        return kept, ids, texts


_TEXT_QUESTION = re.compile(r"[A-Za-z]{3,}")


def template_hint(template: str, source: str, questions: list[str]) -> str | None:
    """A hint when the arithmetic task's template ("<question>=") frames a dataset of word problems."""
    if template != "arith" or not any(_TEXT_QUESTION.search(q) for q in questions[:20]):
        return None
    return (f"data.template=arith frames each question of {source} as '<question>=' (the built-in arithmetic task), "
            "but its questions are text; use data.template=zero for a base model, plain or chat for an instruct model")
