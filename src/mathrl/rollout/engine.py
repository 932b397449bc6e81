"""Rollout engines: prompt token ids in, sampled token ids + per-token logprobs out.

Engines know nothing of text, rewards or tasks. `TorchEngine` samples from any Hugging Face causal LM
with a KV cache, in batches, with an explicit seed; it is the CPU default and the reference the
vLLM engine is compared against.

    engine = TorchEngine(model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    out = engine.generate([[5, 6, 7]] * 4, max_new_tokens=32, temperature=1.0, seed=0)
    out.response_ids, out.response_mask, out.logprobs   # [4, T] each
"""

from __future__ import annotations

from dataclasses import dataclass

import inspect

import torch


@dataclass
class RolloutBatch:
    """Sampled continuations of N prompts.

    prompt_ids:    [N, P] long, LEFT-padded with pad_token_id
    prompt_mask:   [N, P] long, 1 on real prompt tokens
    response_ids:  [N, T] long, RIGHT-padded with pad_token_id after the end
    response_mask: [N, T] float, 1 on sampled tokens (the EOS that ended a response included)
    logprobs:      [N, T] float, log-prob of each sampled token under the sampling distribution
                   (temperature applied, before top-p truncation), 0 where response_mask is 0
    truncated:     [N] bool, True if the response hit max_new_tokens without an EOS
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    truncated: torch.Tensor

    @property
    def response_lengths(self) -> torch.Tensor:  # [N]
        return self.response_mask.sum(-1).long()

    def __len__(self) -> int:
        return self.response_ids.shape[0]


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, max_len] ids left-padded with pad_id, and the [N, max_len] mask of real tokens."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def sample_top_p(logits: torch.Tensor, top_p: float, generator: torch.Generator) -> torch.Tensor:
    """Sample one token per row from softmax(logits) restricted to the top-p nucleus. logits: [B, V] -> [B]."""
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # keep a token if the mass before it is < top_p (so the most likely token is always kept)
        keep = (sorted_probs.cumsum(-1) - sorted_probs) < top_p
        sorted_probs = sorted_probs * keep
        choice = torch.multinomial(sorted_probs, 1, generator=generator)
        return order.gather(-1, choice).squeeze(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class TorchEngine:
    """Batched sampling with a KV cache from a Hugging Face causal LM (any device, any dtype)."""

    def __init__(self, model, *, eos_token_id: int, pad_token_id: int, batch_size: int = 512):
        self.model = model
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.batch_size = batch_size
        # transformers >= 5.2x renamed the cache argument of forward() from `past_key_values` to `cache`
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int,
    ) -> RolloutBatch:
        """Sample one continuation per prompt (repeat a prompt n times for n samples).

        The same seed, prompts and batch size give the same samples. Each chunk of `batch_size`
        prompts draws from its own generator seeded by (seed, chunk index), so results do not
        depend on what else was in the call.
        """
        was_training = self.model.training
        self.model.eval()
        try:
            chunks = [
                self._generate_chunk(
                    prompts[i : i + self.batch_size],
                    max_new_tokens=max_new_tokens,
                    temperature=temperature,
                    top_p=top_p,
                    seed=seed * 1_000_003 + i // self.batch_size,
                )
                for i in range(0, len(prompts), self.batch_size)
            ]
        finally:
            self.model.train(was_training)
        return concat_rollouts(chunks, self.pad_token_id)

    def _generate_chunk(self, prompts, *, max_new_tokens, temperature, top_p, seed) -> RolloutBatch:
        device = next(self.model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed)
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_token_id)
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
        n = prompt_ids.shape[0]

        attention_mask = prompt_mask
        position_ids = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # [N, P]; left padding does not shift positions
        tokens = torch.full((n, max_new_tokens), self.pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((n, max_new_tokens), dtype=torch.float32, device=device)
        mask = torch.zeros((n, max_new_tokens), dtype=torch.float32, device=device)
        finished = torch.zeros(n, dtype=torch.bool, device=device)

        out = self.model(
            input_ids=prompt_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
        )
        cache = _output_cache(out)
        next_position = position_ids[:, -1:] + 1  # [A, 1]
        logits = out.logits[:, -1, :]  # [A, V]
        rows = torch.arange(n, device=device)  # [A]: the output row of each still-active cache row
        for t in range(max_new_tokens):
            scaled = logits.float() / temperature  # [A, V]
            token = sample_top_p(scaled, top_p, generator)  # [A]
            tokens[rows, t] = token
            logprobs[rows, t] = torch.log_softmax(scaled, dim=-1).gather(-1, token[:, None]).squeeze(-1)
            mask[rows, t] = 1.0
            done = token == self.eos_token_id
            finished[rows[done]] = True
            if bool(done.all()) or t == max_new_tokens - 1:
                break
            if bool(done.any()):
                # drop finished rows from the batch and the KV cache: a long tail of unfinished
                # responses then costs only its own rows, not the whole batch's
                keep = (~done).nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                rows, token = rows[keep], token[keep]
                attention_mask, next_position = attention_mask[keep], next_position[keep]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(rows), 1))], dim=1)
            out = self.model(
                input_ids=token[:, None],
                attention_mask=attention_mask,
                position_ids=next_position,
                use_cache=True,
                **{self._cache_kwarg: cache},
            )
            cache = _output_cache(out)
            next_position = next_position + 1
            logits = out.logits[:, -1, :]

        width = max(1, int(mask.sum(-1).max().item()))
        return RolloutBatch(
            prompt_ids=prompt_ids.cpu(),
            prompt_mask=prompt_mask.cpu(),
            response_ids=tokens[:, :width].cpu(),
            response_mask=mask[:, :width].cpu(),
            logprobs=logprobs[:, :width].cpu(),
            truncated=(~finished).cpu(),
        )


def _output_cache(out):
    """The KV cache of a forward's output (`cache` in transformers >= 5.2x, `past_key_values` before)."""
    cache = out.get("cache") if hasattr(out, "get") else None
    return cache if cache is not None else out.past_key_values


def concat_rollouts(chunks: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """One RolloutBatch from several, re-padding prompts (left) and responses (right) to a common width."""
    if len(chunks) == 1:
        return chunks[0]
    p = max(c.prompt_ids.shape[1] for c in chunks)
    t = max(c.response_ids.shape[1] for c in chunks)

    def pad(x: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
        extra = width - x.shape[1]
        if extra == 0:
            return x
        filler = torch.full((x.shape[0], extra), value, dtype=x.dtype)
        return torch.cat([filler, x] if left else [x, filler], dim=1)

    return RolloutBatch(
        prompt_ids=torch.cat([pad(c.prompt_ids, p, pad_id, True) for c in chunks]),
        prompt_mask=torch.cat([pad(c.prompt_mask, p, 0, True) for c in chunks]),
        response_ids=torch.cat([pad(c.response_ids, t, pad_id, False) for c in chunks]),
        response_mask=torch.cat([pad(c.response_mask, t, 0.0, False) for c in chunks]),
        logprobs=torch.cat([pad(c.logprobs, t, 0.0, False) for c in chunks]),
        truncated=torch.cat([c.truncated for c in chunks]),
    )


def select_rollout_rows(batch: RolloutBatch, rows: torch.Tensor | list[int]) -> RolloutBatch:
    rows = torch.as_tensor(rows, dtype=torch.long)
    return RolloutBatch(**{k: v[rows] for k, v in batch.__dict__.items()})
