"""Rollout engines: prompt token ids in, sampled token ids + per-token logprobs out.

Engines know nothing of text, rewards or tasks. `TorchEngine` samples from any Hugging Face causal LM
with a KV cache, in batches, with an explicit seed; it is the CPU default and the reference the
vLLM engine is compared against.

    engine = TorchEngine(model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    out = engine.generate([[5, 6, 7]] * 4, max_new_tokens=32, temperature=1.0, seed=0)
    out.response_ids, out.response_mask, out.rollout_logprobs   # [4, T] each
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from mathrl.model.io import full_tensor
from mathrl.model.lora import unwrap
from mathrl.rollout.base import RolloutBatch, concat_rollouts, left_pad, row_seed
from mathrl.rollout.lean import LeanDecoder
from mathrl.rollout.sampling import next_token, row_uniforms

__all__ = ["TorchEngine", "RolloutBatch", "concat_rollouts", "left_pad"]


@dataclass
class _Decoding:
    """One chunk's decode loop. The response buffers have a row for each of the chunk's N prompts and
    T = max_new_tokens columns; the A rows still decoding are `rows` (output row of each cache row),
    with their attention mask, next position, KV cache and next-token logits."""

    tokens: torch.Tensor  # [N, T] sampled (and observation) token ids, pad after the end
    logprobs: torch.Tensor  # [N, T] float32 sampling logprobs
    mask: torch.Tensor  # [N, T] 1.0 on sampled tokens
    observed: torch.Tensor | None  # [N, T] 1.0 on observation tokens; None without tools
    finished: torch.Tensor  # [N] bool: ended with EOS
    column: torch.Tensor  # [N] long: each row's next response column
    rows: torch.Tensor  # [A]
    attention_mask: torch.Tensor  # [A, P + columns fed so far]
    next_position: torch.Tensor  # [A, 1]
    cache: Any
    logits: torch.Tensor  # [A, V]

    def record(self, token: torch.Tensor, token_logprob: torch.Tensor, *, eos_token_id: int,
               rows: torch.Tensor | None = None) -> torch.Tensor:
        """Write sampled tokens ([S]) into the next columns of `rows` ([S] output rows; default all
        the active rows); returns [S] bool: EOS."""
        rows = self.rows if rows is None else rows
        at = self.column[rows]  # [S]
        self.tokens[rows, at] = token
        self.logprobs[rows, at] = token_logprob
        self.mask[rows, at] = 1.0
        self.column[rows] = at + 1
        done = token == eos_token_id
        self.finished[rows[done]] = True
        return done

    def observe(self, rows: list[int], ids: list[int]) -> None:
        """Write one observation token into the next column of each of `rows` (output rows)."""
        rows_t = torch.tensor(rows, dtype=torch.long, device=self.tokens.device)
        at = self.column[rows_t]
        self.tokens[rows_t, at] = torch.tensor(ids, dtype=torch.long, device=self.tokens.device)
        self.observed[rows_t, at] = 1.0
        self.column[rows_t] = at + 1

    def keep_rows(self, keep: torch.Tensor) -> None:
        """Keep only the active rows `keep` ([A'] indices into the active rows), in the cache too."""
        self.cache.batch_select_indices(keep)
        self.rows = self.rows[keep]
        self.attention_mask, self.next_position = self.attention_mask[keep], self.next_position[keep]

    def batch(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, episodes) -> RolloutBatch:
        """The chunk's RolloutBatch on the CPU, as wide as its longest response."""
        width = max(1, int(self.column.max().item()))
        extra = {}
        if episodes is not None:
            extra = {"observation_mask": self.observed[:, :width].cpu(), **episodes.stats()}
        return RolloutBatch(
            prompt_ids=prompt_ids.cpu(),
            prompt_mask=prompt_mask.cpu(),
            response_ids=self.tokens[:, :width].cpu(),
            response_mask=self.mask[:, :width].cpu(),
            rollout_logprobs=self.logprobs[:, :width].cpu(),
            truncated=(~self.finished).cpu(),
            **extra,
        )


@dataclass
class _Forced:
    """A row that feeds its call's observation instead of sampling (`TorchEngine._forced_inputs`)."""

    queue: list[int]  # tokens still to feed: the opening tag, then (once read) the output and the closing tag
    read_at: int | None  # the decode step at which the call's output is read; None once read
    logits: torch.Tensor | None = None  # [V] the row's logits after its last real token, kept while it pads


class TorchEngine:
    """Batched sampling with a KV cache from a Hugging Face causal LM (any device, any dtype).

    It usually samples from the training model itself, so `update_weights` has nothing to do; given
    its own copy of the model (e.g. an unsharded one beside an FSDP-sharded trainer) it copies the
    trainer's tensors into that copy.

    `decode="lean"` runs each forward with `rollout.lean.LeanDecoder` (Qwen2 and Llama models: the same
    logits from the model's own tensors without its modules, over a preallocated KV cache; `compile`
    compiles its one-token step); a model it does not support keeps the Hugging Face forward, with one
    log line. The sampler, the tool observation windows and the dropping of finished rows are the same
    for both.

    `draws` says where the sampler's uniforms come from: "chunk" (the default) draws [A, 1] per step
    from one generator per chunk of `batch_size` rows, so a row's draws depend on which other rows of
    its chunk are still sampling; "row" gives each row its own stream (`row_uniforms`), indexed by the
    response column, so that a row's draws depend only on (seed, row, column).
    """

    def __init__(self, model, *, eos_token_id: int, pad_token_id: int, batch_size: int = 512, tools=None,
                 decode: str = "hf", compile: bool = False, tool_delay_steps: int = 0, draws: str = "chunk"):
        self.model = model
        if decode not in ("hf", "lean"):
            raise ValueError(f"decode={decode!r}: use 'hf' or 'lean'")
        self.lean = LeanDecoder.for_model(model, compile=compile) if decode == "lean" else None
        self.tools = tools  # rollout.episodes.ToolUse: responses are episodes with tool calls; None: single-turn
        if isinstance(tool_delay_steps, bool) or not isinstance(tool_delay_steps, int) or tool_delay_steps < 0:
            raise ValueError(f"tool_delay_steps={tool_delay_steps!r}: use an integer >= 0")
        self.tool_delay_steps = tool_delay_steps  # D: the step a call's output is read, after the closing step (_generate_chunk)
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.batch_size = batch_size
        if draws not in ("chunk", "row"):
            raise ValueError(f"draws={draws!r}: use 'chunk' or 'row'")
        self.draws = draws
        # rows that share one random stream: each chunk of batch_size rows draws from its own generator,
        # or (draws="row") every row from its own
        self.seed_block = batch_size if draws == "chunk" else 1
        # transformers >= 5.2x renamed the cache argument of forward() from `past_key_values` to `cache`
        params = inspect.signature(unwrap(model).forward).parameters  # a PeftModel passes its kwargs on
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the given tensors (Hugging Face names) into the engine's model; tensors that already are
        the model's own (the engine shares the trainer's model) are skipped, so that case costs nothing."""
        own = self.model.state_dict(keep_vars=True)  # tied weights appear under every name that uses them
        for name, tensor in named_tensors:
            if name not in own:
                raise KeyError(f"update_weights: the engine's model has no tensor named {name!r}; "
                               "send the names of the model's state_dict()")
            target = own[name]
            if target is tensor:
                continue
            tensor = full_tensor(tensor)
            if target.data_ptr() != tensor.data_ptr():
                target.data.copy_(tensor)

    def sleep(self) -> None:
        """Nothing to free: the KV cache only lives during `generate`."""

    def wake_up(self) -> None:
        pass

    def close(self) -> None:
        if self.tools is not None:
            self.tools.pool.close()

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int,
        first_row: int = 0,
    ) -> RolloutBatch:
        """Sample one continuation per prompt (repeat a prompt n times for n samples).

        The same seed, prompts and batch size give the same samples. Each chunk of `batch_size`
        prompts draws from its own generator seeded by (seed, chunk index), so results do not
        depend on what else was in the call; with draws="row" each row draws from its own stream,
        seeded by (seed, first_row + its index), whatever the batch size.

        temperature=0 is greedy decoding (evaluation only; the config refuses it for training): the
        most likely token at every step, the seed unused, and `rollout_logprobs` those of the untempered
        model (temperature 1), since the greedy point mass would give 0 for every token.
        """
        if first_row % self.seed_block:
            raise ValueError(f"first_row={first_row} is not a multiple of the engine's batch size {self.batch_size}")
        was_training = self.model.training
        self.model.eval()
        try:
            chunks = [
                self._generate_chunk(
                    prompts[i : i + self.batch_size],
                    max_new_tokens=max_new_tokens,
                    temperature=temperature,
                    top_p=top_p,
                    seed=row_seed(seed, (first_row + i) // self.batch_size),  # one seed per block of batch_size rows
                    row_seeds=(seed, first_row + i) if self.draws == "row" else None,
                )
                for i in range(0, len(prompts), self.batch_size)
            ]
        finally:
            self.model.train(was_training)
        return concat_rollouts(chunks, self.pad_token_id)

    def _generate_chunk(self, prompts, *, max_new_tokens, temperature, top_p, seed, row_seeds=None) -> RolloutBatch:
        """One chunk of rows. With tools (`self.tools`), a row whose sampled token closes a call gets the
        call's observation as forced tokens, on one of two schedules (`tool_delay_steps`, D):

        - D = 0: the observation is fed in the next forward together with the closing token, one forward
          feeding each row its own tokens right-aligned in a window as wide as the longest observation,
          the columns a row does not use masked out of attention (so they change nothing but the cache's
          width). That forward waits for the calls closed at its step.
        - D >= 1: the calling row feeds its observation one token per decode step, the opening tag first
          (known before the call ends), while the other rows go on sampling; the call's output is read
          at step t + D (t: the step that closed the call), or once the tag is fed if that is later, and
          the row feeds masked padding in the steps between. Only that read waits, and only for a call
          still running.

        The calls run in parallel in the tool pool; on either schedule the samples never depend on how
        long a tool took (the same seed gives the same episodes).

        `row_seeds` (draws="row"): (the call's seed, the call row of the chunk's first row); each row's
        token at response column c is drawn with `row_uniforms`' [row, c], whatever the other rows do."""
        device = next(self.model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed)
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_token_id)
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
        episodes = self.tools.start(prompt_ids.shape[0], prompts) if self.tools is not None else None
        d = self._prefill(prompt_ids, prompt_mask, max_new_tokens, with_observations=episodes is not None)

        uniforms = None
        if row_seeds is not None and temperature != 0:
            uniforms = row_uniforms(*row_seeds, prompt_ids.shape[0], max_new_tokens, device)  # [N, T]

        def sample(logits, rows):
            """A token for each of the output rows `rows` ([S]) from their logits ([S, V])."""
            if uniforms is None:
                return next_token(logits, temperature, top_p, generator)  # [S], [S]
            return next_token(logits, temperature, top_p, None, uniforms[rows, d.column[rows]][:, None])

        self._decode(d, episodes, max_new_tokens=max_new_tokens, sample=sample)
        return d.batch(prompt_ids, prompt_mask, episodes)

    def _decode(self, d: _Decoding, episodes, *, max_new_tokens: int, sample) -> None:
        """The decode loop, with or without tools: each step every active row samples a token, feeds
        the next token of its forced queue (an observation, D >= 1) or feeds masked padding while it
        waits for its call's output; with D = 0 a call's observation rides in the next forward instead,
        in a window (`_observation_window`). Rows that end (EOS, a call at the last turn, the last
        column) leave the batch and the KV cache, so a long tail of unfinished responses costs only
        its own rows."""
        forced: dict[int, _Forced] = {}  # output row -> its observation still to feed (D >= 1)
        step = 0
        while True:
            inputs, fed, stop, called = self._step(d, episodes, forced, step, sample)  # [A] each; called: D = 0
            if episodes is None:  # one token per row and step: every row reaches the last column at this step
                if step == max_new_tokens - 1:
                    break
            else:
                stop |= d.column[d.rows] >= max_new_tokens
            if bool(stop.all()):
                break
            if bool(stop.any()):
                if forced:
                    for r in d.rows[stop].tolist():
                        forced.pop(r, None)  # cut off by max_new_tokens: its call is still counted (drain)
                keep = (~stop).nonzero().squeeze(1)
                d.keep_rows(keep)
                inputs, fed = inputs[keep], None if fed is None else fed[keep]
                if called:  # the calls of rows that stay, at their new places
                    slot = {int(k): j for j, k in enumerate(keep.tolist())}
                    called = [slot[i] for i in called if i in slot]
            if called:
                feed = self._observation_window(episodes, d.rows, inputs, called, d.column, d.next_position,
                                                max_new_tokens, d.tokens, d.observed)
            else:
                feed = inputs[:, None], None if fed is None else fed[:, None], d.next_position, fed
            if not self._feed(d, *feed, max_new_tokens):
                break
            step += 1
        if episodes is not None:
            episodes.drain()

    def _step(self, d: _Decoding, episodes, forced: dict, step: int, sample):
        """One decode step's tokens. Rows feeding an observation (D >= 1) take its next token (reading
        their call's output when it is due: the only wait) or masked padding; the others sample, and a
        sample that closes a call makes its row feed the observation: from the next step on (D >= 1),
        or in the next forward's window (D = 0: the row's index in `called`).
        -> ([A] input ids, [A] 1 where a row feeds a token and 0 on padding, or None when none pads,
        [A] bool: the row ends here: EOS, or a call at its last turn; the called rows of D = 0)."""
        n, device = len(d.rows), d.rows.device
        free, padded, ids = self._forced_inputs(d, episodes, forced, step) if forced else (range(n), [], None)
        every = len(free) == n
        inputs = None if every else torch.tensor(ids, dtype=torch.long, device=device)
        stop = None if every else torch.zeros(n, dtype=torch.bool, device=device)
        called: list[int] = []
        if free:
            index = None if every else torch.tensor(free, dtype=torch.long, device=device)
            at = d.rows if every else d.rows[index]
            token, token_logprob = sample(d.logits if every else d.logits[index], at)  # [S], [S]
            done = d.record(token, token_logprob, eos_token_id=self.eos_token_id, rows=at)
            if every:
                inputs, stop = token, done  # `done` is a tensor of its own (token == eos), free to change
            else:
                inputs[free] = token
                stop[free] = done
            if episodes is not None:
                read_after = max(self.tool_delay_steps, len(episodes.tools.opening) + 1)
                for i, r, tok, ended in zip(free, at.tolist(), token.tolist(), done.tolist()):
                    if not ended and episodes.feed(r, tok):
                        if self.tool_delay_steps == 0:
                            called.append(i)
                        else:
                            forced[r] = _Forced(list(episodes.tools.opening), read_at=step + read_after)
                    elif r in episodes.ended:
                        stop[i] = True
        fed = None
        if padded:
            fed = torch.ones(n, dtype=torch.long, device=device)
            fed[padded] = 0
        return inputs, fed, stop, called

    def _forced_inputs(self, d: _Decoding, episodes, forced: dict,
                       step: int) -> tuple[list[int], list[int], list[int]]:
        """The rows with a forced queue (D >= 1) feed their next observation token (written into the
        response buffers too), or padding while their call's output is not due. -> (the indices of the
        active rows that sample, of those that pad, and [A] input ids: pad where a row samples or pads)."""
        rows = d.rows.tolist()
        ids = [self.pad_token_id] * len(rows)
        free, padded, observed = [], [], []  # indices into the active rows
        for i, r in enumerate(rows):
            f = forced.get(r)
            if f is None:
                free.append(i)
                continue
            if not f.queue and f.read_at is not None and step >= f.read_at:
                f.queue, f.read_at = episodes.output(r), None  # waits only if the call is still running
            if f.queue:
                ids[i] = f.queue.pop(0)
                observed.append(i)
                if not f.queue and f.read_at is None:
                    del forced[r]  # its last observation token: the row samples from the next step on
            elif f.read_at is None:  # an empty observation: sample now, from the logits of the last real token
                del forced[r]
                if f.logits is not None:  # (after padding; else the last forward fed a real token)
                    d.logits[i] = f.logits
                free.append(i)
            else:
                if f.logits is None:
                    f.logits = d.logits[i].clone()  # the logits after the row's last real token
                padded.append(i)
        if observed:
            d.observe([rows[i] for i in observed], [ids[i] for i in observed])
        return free, padded, ids

    def _prefill(self, prompt_ids, prompt_mask, max_new_tokens: int, *, with_observations: bool) -> _Decoding:
        """The prompts' forward (left padding does not shift positions) and empty response buffers."""
        n, device = prompt_ids.shape[0], prompt_ids.device
        position_ids = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # [N, P]
        if self.lean is not None:
            cache, logits = self.lean.prefill(prompt_ids, prompt_mask, position_ids, new_columns=max_new_tokens)
        else:
            out = self.model(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                position_ids=position_ids,
                use_cache=True,
                logits_to_keep=1,
            )
            cache, logits = _output_cache(out), out.logits[:, -1, :]
        return _Decoding(
            tokens=torch.full((n, max_new_tokens), self.pad_token_id, dtype=torch.long, device=device),
            logprobs=torch.zeros((n, max_new_tokens), dtype=torch.float32, device=device),
            mask=torch.zeros((n, max_new_tokens), dtype=torch.float32, device=device),
            observed=torch.zeros((n, max_new_tokens), dtype=torch.float32, device=device) if with_observations else None,
            finished=torch.zeros(n, dtype=torch.bool, device=device),
            column=torch.zeros(n, dtype=torch.long, device=device),
            rows=torch.arange(n, device=device),
            attention_mask=prompt_mask,
            next_position=position_ids[:, -1:] + 1,
            cache=cache,
            logits=logits,
        )

    def _feed(self, d: _Decoding, inputs, window, positions, fed, max_new_tokens: int) -> bool:
        """The next forward: [A, W] `inputs` at `positions`, `window` 1 on the columns a row feeds (None:
        all), `fed` [A] the tokens each row feeds (None: one each). Updates `d`'s cache, attention mask,
        positions and logits; returns False when no row has columns left (an observation filled the last
        columns of every row)."""
        if self.lean is not None:
            d.logits = self.lean.feed(d.cache, inputs, window, positions)  # the lean cache keeps its own mask
        else:
            if window is None:
                window = d.attention_mask.new_ones(inputs.shape)
            d.attention_mask = torch.cat([d.attention_mask, window.to(d.attention_mask.dtype)], dim=1)
            out = self.model(
                input_ids=inputs,
                attention_mask=d.attention_mask,
                position_ids=positions,
                use_cache=True,
                **{self._cache_kwarg: d.cache},
            )
            d.cache = _output_cache(out)
            d.logits = out.logits[:, -1, :]
        d.next_position = d.next_position + (1 if fed is None else fed[:, None])
        if fed is not None and inputs.shape[1] > 1 and bool((d.column[d.rows] >= max_new_tokens).any()):
            # an observation filled a row's last columns: the row ends there, cut short
            keep = (d.column[d.rows] < max_new_tokens).nonzero().squeeze(1)
            if len(keep) == 0:
                return False
            d.keep_rows(keep)
            d.logits = d.logits[keep]
        return True

    def _observation_window(self, episodes, rows, token, called, column, next_position, max_new_tokens, tokens, observed):
        """The next forward's inputs when some rows feed observations: ([A, W] ids, [A, W] attention
        columns, [A, W] positions, [A] tokens fed per row). A row that called a tool feeds its
        observation (cut to the columns it has left), the others their one sampled token, each
        right-aligned so that the last column is every row's newest token; the unused columns are
        masked and take the row's next position (they are never attended to)."""
        device = token.device
        obs = dict(zip(called, episodes.observations([int(rows[i]) for i in called])))
        feeds = []
        for i in range(len(rows)):
            if i in obs:
                room = max_new_tokens - int(column[rows[i]])
                ids = obs[i][:room]
                r, c = int(rows[i]), int(column[rows[i]])
                if ids:
                    tokens[r, c : c + len(ids)] = torch.tensor(ids, dtype=torch.long, device=device)
                    observed[r, c : c + len(ids)] = 1.0
                    column[r] = c + len(ids)
                feeds.append([int(token[i])] + ids)  # the closing token is not in the cache yet
            else:
                feeds.append([int(token[i])])
        width = max(len(f) for f in feeds)
        inputs = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long, device=device)
        window = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        positions = next_position.expand(len(rows), width).clone()
        for i, f in enumerate(feeds):
            inputs[i, width - len(f) :] = torch.tensor(f, dtype=torch.long, device=device)
            window[i, width - len(f) :] = 1
            positions[i, width - len(f) :] = next_position[i, 0] + torch.arange(len(f), device=device)
        fed = torch.tensor([len(f) for f in feeds], dtype=torch.long, device=device)
        return inputs, window, positions, fed


def _output_cache(out):
    """The KV cache of a forward's output (`cache` in transformers >= 5.2x, `past_key_values` before)."""
    cache = out.get("cache") if hasattr(out, "get") else None
    return cache if cache is not None else out.past_key_values
