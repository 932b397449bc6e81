"""Episodes with tools: model turns and tool observations as token ids, with a model/observation mask.

The engine samples model tokens; when a turn ends with the format's closing tag of a call (`CallFormat.call_close`),
the call is parsed from that turn's text, run in the tool pool, and its observation (the tool's output between the
format's observation tags) is tokenized once and appended as forced tokens, the tool's text as plain text
(`ToolUse.encode_text`). Nothing is re-tokenized and no chat template is re-applied: every model token stays the id sampled.

    tools = ToolUse(fmt=TOOL_FORMATS.get("python_blocks")(), pool=pool, tokenizer=tok, max_turns=4, max_tool_calls=3, observation_max_tokens=64)
    episodes = tools.start(rows=8)            # per-call state of 8 rows
    if episodes.feed(row, token_id):          # a model token; True: the row's turn closed a call
        obs = episodes.observations([row])[0] # waits for the call; the observation's token ids

Two call formats are registered (`mathrl.registry.TOOL_FORMATS`, config `rollout.tool_format`): python_blocks
(Qwen2.5-Math's tool-integrated prompts, ToRL) and chat_tool_call (the Hermes / Qwen2.5 chat templates' format);
models with another template set `rollout.tool_tags`. Each format's tags: docs/tools.md, "Configuration".
"""

from __future__ import annotations

import json
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import torch

from mathrl.config.shared import CUT_NOTE
from mathrl.registry import TOOL_FORMATS


@dataclass(frozen=True)
class CallFormat:
    """How a call and its observation are written. `parse` finds the call a turn ends with."""

    name: str
    call_open: str
    call_close: str
    observation_open: str
    observation_close: str

    def parse(self, turn: str) -> tuple[str, str | dict] | None:
        """(tool name, args) of the call that `turn` (the text of one model turn) ends with, or None
        when the closing tag closes no call (e.g. a python_blocks ```` ``` ```` after a block of
        another language). A malformed call body gives the name "" and an error message as args."""
        if not turn.endswith(self.call_close):
            return None
        start = turn.rfind(self.call_open, 0, len(turn) - len(self.call_close))
        if start < 0:
            return None
        body = turn[start + len(self.call_open) : len(turn) - len(self.call_close)]
        return self.parse_body(body)

    def parse_body(self, body: str) -> tuple[str, str | dict]:
        return "python", body

    def observation(self, output: str) -> str:
        return f"{self.observation_open}{output}{self.observation_close}"


@dataclass(frozen=True)
class JsonCallFormat(CallFormat):
    """A call whose body is JSON: {"name": <tool>, "arguments": {...}}."""

    def parse_body(self, body: str) -> tuple[str, str | dict]:
        try:
            call = json.loads(body)
        except json.JSONDecodeError as e:
            return "", f"error: the tool call is not JSON ({e.msg} at character {e.pos})"
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return "", 'error: a tool call is {"name": <tool>, "arguments": {...}}'
        args = call.get("arguments", {})
        if isinstance(args, str):  # some templates write the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        return call["name"], args


def python_blocks() -> CallFormat:
    return CallFormat("python_blocks", "```python\n", "```\n", "```output\n", "\n```\n")


def chat_tool_call() -> CallFormat:
    return JsonCallFormat("chat_tool_call", "<tool_call>\n", "</tool_call>",
                          "<|im_end|>\n<|im_start|>user\n<tool_response>\n",
                          "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


TOOL_FORMATS.register("python_blocks", python_blocks)
TOOL_FORMATS.register("chat_tool_call", chat_tool_call)


def call_format(name: str, tags=None) -> CallFormat:
    """The registered format `name` with the non-null fields of `tags` (a ToolTagsConfig) replacing its own."""
    fmt = TOOL_FORMATS.get(name)()
    if tags is None:
        return fmt
    return replace(fmt, **{k: v for k, v in vars(tags).items() if v is not None})


def cut_middle(ids: list[int], limit: int, note) -> list[int]:
    """`ids` when it holds at most `limit` tokens; else its head and tail around `note(cut)` (the token
    ids of a note saying how many were cut), `limit` tokens in all. A limit too small for the note
    keeps the first `limit` tokens, silently: the config refuses such a limit (`note_room`)."""
    if len(ids) <= limit:
        return ids
    keep = limit - len(note(len(ids) - limit))
    if keep < 2:
        return ids[:limit]
    marker = note(len(ids) - keep)  # the count of what is really cut (a count of other width: adjust once)
    keep = limit - len(marker)
    marker = note(len(ids) - keep)
    head = (keep + 1) // 2
    return ids[:head] + marker + ids[len(ids) - (keep - head):]


def note_room(tokenizer) -> int:
    """The shortest observation limit whose cut says so with `tokenizer`: the cut note with a 7-digit
    count, and a token of output either side (config.shared.MIN_OBSERVATION_TOKENS bounds it at one
    token per character before any tokenizer loads)."""
    return len(tokenizer(CUT_NOTE.format(cut=9_999_999), add_special_tokens=False)["input_ids"]) + 2


@dataclass
class ToolUse:
    """What an engine needs to run episodes: the format, the tool pool, the tokenizer, the limits."""

    fmt: CallFormat
    pool: object  # tools.ToolPool: submit(name, args) -> Future[ToolResult]
    tokenizer: object
    max_turns: int = 4
    max_tool_calls: int = 3
    observation_max_tokens: int = 32

    def __post_init__(self) -> None:
        self._close_width = len(self.tokenizer(self.fmt.call_close, add_special_tokens=False)["input_ids"]) + 2
        self.opening = self.encode(self.fmt.observation_open)  # an observation's first tokens, the same for every call
        self.closing = self.encode(self.fmt.observation_close)
        # A turn can only end with the closing tag after a token whose own text ends with the tag's last
        # character; checked once per token id, so that most sampled tokens cost no decode of the turn.
        # Only for an ASCII last character: a token's text alone is then the end of its text in context.
        last = self.fmt.call_close[-1:]
        self._last_char = last if last.isascii() else None
        self._may_close: dict[int, bool] = {}

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode_text(self, text: str) -> list[int]:
        """The ids of a tool's text as plain text: a special token it prints (``<|im_end|>``,
        ``<|im_start|>``, the EOS) is spelled out in the characters' ids, never the control token, so
        that no output can end a turn or open one. The tags around it (`encode`) keep theirs."""
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def may_close(self, token: int) -> bool:
        """False when `token` cannot be the last token of a call's closing tag (no decode of the turn needed)."""
        if self._last_char is None:
            return True
        known = self._may_close.get(token)
        if known is None:
            known = self._may_close[token] = self.tokenizer.decode([token]).endswith(self._last_char)
        return known

    def start(self, rows: int, prompts: list[list[int]] | None = None) -> Episodes:
        """The episodes of one call's `rows`. With `prompts`, a prompt that ends inside an open call
        (e.g. "...```python\n", to make every row use the tool) counts: each row's first turn starts
        with its prompt's last tokens, as many as the call's opening tag holds."""
        episodes = Episodes(self, rows)
        if prompts is not None:
            width = len(self.encode(self.fmt.call_open))
            episodes.turn = [list(p[len(p) - width :]) if width else [] for p in prompts]
        return episodes


@dataclass
class Episodes:
    """Per-row state of one generate call's episodes (rows are the call's output rows)."""

    tools: ToolUse
    rows: int
    turn: list[list[int]] = field(default_factory=list)  # the current turn's model token ids
    pending: dict[int, Future | str] = field(default_factory=dict)  # row -> its call's future (or a text, not run)
    ended: set[int] = field(default_factory=set)  # rows whose episode hit rollout.max_turns at a call

    def __post_init__(self) -> None:
        n = self.rows
        self.turn = [[] for _ in range(n)]
        self.calls = torch.zeros(n, dtype=torch.long)  # calls run
        self.errors = torch.zeros(n, dtype=torch.long)
        self.timeouts = torch.zeros(n, dtype=torch.long)
        self.capped = torch.zeros(n, dtype=torch.long)  # calls past rollout.max_tool_calls, not run
        self.turns = torch.ones(n, dtype=torch.long)
        self.seconds = torch.zeros(n, dtype=torch.float32)

    def feed(self, row: int, token: int) -> bool:
        """A sampled model token of `row`. True when it closes a call: the call is submitted to the pool
        (or, past the limits, answered without running) and the row's next tokens are its observation.
        A call at the last allowed turn ends the episode instead (`ended`)."""
        t = self.tools
        turn = self.turn[row]
        turn.append(token)
        if not t.may_close(token):
            return False
        tail = t.tokenizer.decode(turn[-t._close_width :])
        if not tail.endswith(t.fmt.call_close):
            return False
        call = t.fmt.parse(t.tokenizer.decode(turn))
        if call is None:
            return False
        self.turn[row] = []
        if self.turns[row] >= t.max_turns:
            self.ended.add(row)
            return False
        self.turns[row] += 1
        name, args = call
        if not name:  # a malformed call: its parse error is the observation
            self.errors[row] += 1
            self.pending[row] = str(args)
        elif self.calls[row] + self.capped[row] >= t.max_tool_calls:
            self.capped[row] += 1
            self.pending[row] = f"error: the tool-call limit of this episode ({t.max_tool_calls}) is reached; answer without tools"
        else:
            self.calls[row] += 1
            self.pending[row] = t.pool.submit(name, args)
        return True

    def observations(self, rows: list[int]) -> list[list[int]]:
        """The observation token ids of `rows` (each with a call pending), waiting for their calls; the
        calls already run in parallel in the pool. The tool's output is cut in the middle to
        rollout.observation_max_tokens tokens, with a note saying how many were cut."""
        return [self.tools.opening + self.output(row) for row in rows]

    def output(self, row: int) -> list[int]:
        """The observation of `row`'s pending call after its opening tag (`ToolUse.opening`): the tool's
        output, cut in the middle to rollout.observation_max_tokens tokens with a note saying how many
        were cut, then the closing tag. Waits for the call if it is still running."""
        t = self.tools
        pending = self.pending.pop(row)
        if isinstance(pending, str):
            text = pending
        else:
            result = pending.result()
            text = result.text
            self.seconds[row] += result.seconds
            self.errors[row] += result.status == "error"
            self.timeouts[row] += result.status == "timeout"
        body = cut_middle(t.encode_text(text), t.observation_max_tokens, lambda cut: t.encode(CUT_NOTE.format(cut=cut)))
        return body + t.closing

    def ready(self, row: int) -> bool:
        """Whether `row`'s pending call has finished (reading its output would not wait)."""
        pending = self.pending[row]
        return isinstance(pending, str) or pending.done()

    def drain(self) -> None:
        """Wait for the calls whose output no row read (a row cut off by max_new_tokens while its call
        ran), so that every call run is counted in the stats."""
        for row in list(self.pending):
            self.output(row)

    def stats(self) -> dict[str, torch.Tensor]:
        """Per-row counts for the RolloutBatch: calls run, errors, timeouts, capped calls, turns, seconds."""
        return {"tool_calls": self.calls, "tool_errors": self.errors, "tool_timeouts": self.timeouts,
                "tool_capped": self.capped, "turns": self.turns, "tool_seconds": self.seconds}


def last_turn_start(rollout, row: int) -> int:
    """The response column where row `row`'s last model turn starts: after its last observation token
    (0 for a single-turn response)."""
    if rollout.observation_mask is None:
        return 0
    seen = rollout.observation_mask[row].nonzero()
    return int(seen.max()) + 1 if len(seen) else 0


def void_turns(rollout, tokenizer, *, has_answer) -> list[bool]:
    """Per row: a tool episode whose last model turn holds neither a tool call nor a final answer
    (`has_answer(text)`; SimpleTIR's void turn). A turn that ends in a call is followed by an
    observation, so only the last turn can be void. All False for single-turn responses."""
    if rollout.observation_mask is None:
        return [False] * len(rollout)
    lengths = rollout.context_lengths.tolist()
    return [not has_answer(tokenizer.decode(rollout.response_ids[i, last_turn_start(rollout, i) : lengths[i]].tolist(),
                                            skip_special_tokens=True))
            for i in range(len(rollout))]


def episode_metrics(rollout, void: list[bool]) -> dict[str, float]:
    """The tool and turn metrics of a batch of episodes (docs/metrics.md); {} for single-turn responses.

    void: per row, whether the episode's last turn has neither a call nor a final answer."""
    if rollout.observation_mask is None or len(rollout) == 0:
        return {}
    calls = rollout.tool_calls.float()
    total = float(calls.sum())
    context = float(rollout.context_mask.sum())
    return {
        "tool/calls_mean": float(calls.mean()),
        "tool/call_rate": float((calls > 0).float().mean()),
        "tool/error_rate": float(rollout.tool_errors.sum()) / total if total else 0.0,
        "tool/timeout_rate": float(rollout.tool_timeouts.sum()) / total if total else 0.0,
        "tool/capped_calls": float(rollout.tool_capped.float().mean()),
        "tool/seconds": float(rollout.tool_seconds.sum()),
        "tool/void_turn_rate": sum(void) / len(void),
        "rollout/turns_mean": float(rollout.turns.float().mean()),
        "rollout/turns_max": float(rollout.turns.max()),
        "rollout/observation_token_share": float(rollout.observation_mask.sum()) / context if context else 0.0,
    }
