"""A lean decode loop for small dense decoders: the Qwen2 and Llama forward over a preallocated KV cache.

`LeanDecoder` does the arithmetic of the Hugging Face forward as a few tensor functions on the HF
model's own weight tensors (never copied), with a KV cache written in place, grouped-query attention
without repeating K/V, one prefill per distinct prompt and batch buckets that `torch.compile` can
specialise on. It is a drop-in for the HF forward in `TorchEngine`'s decode loop (`rollout.decode: lean`):

    decoder = LeanDecoder.for_model(model, compile=True)   # None, with one log line, when unsupported
    cache, logits = decoder.prefill(prompt_ids, prompt_mask, positions, new_columns=48)   # [N, V]
    logits = decoder.feed(cache, tokens[:, None], window, positions)                      # [A, V]
    cache.batch_select_indices(keep)                        # drop finished rows, as HF's cache does

It reads the model's weights and writes only its own cache. Why, the cache layout, what is supported
(`unsupported_reason`) and the measurements: docs/performance.md, "Lean decode loop".
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from mathrl.model.lora import is_lora

__all__ = ["LeanCache", "LeanDecoder", "bucket", "decoder_forward", "unsupported_reason"]

log = logging.getLogger(__name__)

ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
STATIC_ROPE = ("default", "linear", "llama3", "yarn")
"""Rotary types whose inverse frequencies and attention scaling are computed once when the model is built
(what `model.model.rotary_emb` holds); `dynamic` and `longrope` change them with the sequence length."""
RECOMPILE_LIMIT = 64  # compiled graphs per step function: batch buckets x attention spans
SPAN_MIN = 64  # cache columns are allocated in multiples of it; a compiled step reads the first `span` columns,
# a power of two >= SPAN_MIN (capped at the cache), so that it sees few shapes


def bucket(rows: int) -> int:
    """The batch bucket of `rows` active rows: 1, 2, 4, 8, then the next multiple of 16.

    The decode step runs on exactly this many rows (the others are padding whose outputs are ignored),
    so a compiled step sees one shape per bucket; the largest waste is 15 padding rows."""
    if rows <= 8:
        return 1 << max(0, rows - 1).bit_length()
    return -(-rows // 16) * 16


def cache_columns(columns: int) -> int:
    """The columns a cache allocates for `columns` tokens: rounded up to a multiple of SPAN_MIN, so that
    chunks whose prompts differ by a few tokens share one shape."""
    return -(-columns // SPAN_MIN) * SPAN_MIN


def compiled_span(start: int, columns: int) -> int:
    """The columns a compiled step attends over when `start` columns are written, in a cache of `columns`:
    the next power of two >= start, at least SPAN_MIN, at most the cache (few distinct values)."""
    return min(columns, max(SPAN_MIN, 1 << max(0, start - 1).bit_length()))


def unsupported_reason(model) -> str | None:
    """Why the lean forward cannot stand in for `model`'s Hugging Face forward; None when it can."""
    if is_lora(model):
        return "the model carries LoRA adapters (peft)"
    config = getattr(model, "config", None)
    arch = getattr(config, "model_type", None)
    name = type(model).__name__
    if ARCHITECTURES.get(arch) != name:
        return f"{name} (model_type {arch!r}) is not one of {', '.join(ARCHITECTURES.values())}"
    if getattr(config, "use_sliding_window", False) or any(
            t != "full_attention" for t in (getattr(config, "layer_types", None) or ())):
        return "the model uses sliding-window attention"
    rope_type = getattr(model.model.rotary_emb, "rope_type", None)
    if rope_type not in STATIC_ROPE:
        return f"rotary type {rope_type!r} is not one of {', '.join(STATIC_ROPE)}"
    if getattr(config, "hidden_act", None) != "silu":
        return f"MLP activation {config.hidden_act!r} is not silu"
    for i, layer in enumerate(model.model.layers):
        a, mlp = layer.self_attn, layer.mlp
        for part in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            if type(part) is not torch.nn.Linear:
                return f"layer {i} has a {type(part).__name__} where a plain Linear was expected"
    for name, p in model.named_parameters():
        if "DTensor" in (type(p).__name__, type(p.data).__name__):
            return f"parameter {name} is sharded (a DTensor)"
        if p.device.type == "meta":
            return f"parameter {name} has no data (meta device)"
    return None


@dataclass(frozen=True)
class Spec:
    """The numbers of the architecture that the forward needs (compile-time constants)."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float  # RMSNorm epsilon
    scaling: float  # attention logit scale, head_dim ** -0.5
    rope_scaling: float  # multiplies cos and sin (1.0 but for yarn)

    @classmethod
    def of(cls, model) -> Spec:
        m, a = model.model, model.model.layers[0].self_attn
        heads = model.config.num_attention_heads
        return cls(layers=len(m.layers), heads=heads, kv_heads=heads // a.num_key_value_groups, head_dim=a.head_dim,
                   eps=float(m.norm.variance_epsilon), scaling=float(a.scaling),
                   rope_scaling=float(m.rotary_emb.attention_scaling))


class LayerWeights(NamedTuple):
    """One decoder layer's tensors (the HF modules' own; a bias is None where the module has none)."""

    attn_norm: torch.Tensor
    q: torch.Tensor
    q_bias: torch.Tensor | None
    k: torch.Tensor
    k_bias: torch.Tensor | None
    v: torch.Tensor
    v_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    mlp_norm: torch.Tensor
    gate: torch.Tensor
    gate_bias: torch.Tensor | None
    up: torch.Tensor
    up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None


class Weights(NamedTuple):
    """The whole model's tensors (the HF modules' own)."""

    embed: torch.Tensor  # [V, E]
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor  # [E]
    head: torch.Tensor  # [V, E]; the embedding itself when tied
    head_bias: torch.Tensor | None
    inv_freq: torch.Tensor  # [head_dim / 2], the model's rotary buffer


def weights_of(model) -> Weights:
    """The model's current tensors, by reference. Looked up at every prefill, so that a parameter replaced
    (not only updated in place) since the last generate call is seen too."""
    m = model.model
    layers = []
    for layer in m.layers:
        a, mlp = layer.self_attn, layer.mlp
        layers.append(LayerWeights(
            layer.input_layernorm.weight, a.q_proj.weight, a.q_proj.bias, a.k_proj.weight, a.k_proj.bias,
            a.v_proj.weight, a.v_proj.bias, a.o_proj.weight, a.o_proj.bias, layer.post_attention_layernorm.weight,
            mlp.gate_proj.weight, mlp.gate_proj.bias, mlp.up_proj.weight, mlp.up_proj.bias,
            mlp.down_proj.weight, mlp.down_proj.bias))
    return Weights(m.embed_tokens.weight, tuple(layers), m.norm.weight, model.lm_head.weight, model.lm_head.bias,
                   m.rotary_emb.inv_freq)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as HF's Qwen2RMSNorm / LlamaRMSNorm computes it: in float32, cast back before the weight.
    In float32 torch's fused `rms_norm` computes the same formula in one kernel; in lower precision HF
    rounds before the weight's product, which the fused kernel does not, so that case keeps HF's steps."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotary(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary embedding at `positions` ([B, W] long) -> ([B, W, head_dim] each), computed in
    float32 and cast to `dtype` (HF's `rotary_emb.forward`)."""
    freqs = positions[..., None].float() * inv_freq.float()  # [B, W, head_dim / 2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [B, W, head_dim]
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply the rotary embedding to x [B, W, heads, head_dim] (cos, sin: [B, W, head_dim]); HF's
    `apply_rotary_pos_emb` with `rotate_half`."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, :, None] + rotated * sin[:, :, None]


def attend(q: torch.Tensor, k_old: torch.Tensor, v_old: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
           blocked: torch.Tensor, scaling: float) -> torch.Tensor:
    """Grouped-query attention over cached columns and the new tokens' own keys.

    q: [B, W, H, D]; k_old, v_old: [B, Hkv, S, D] (views of the cache); k_new, v_new: [B, Hkv, W, D];
    blocked: [B, W, S + W] bool, True where a token may not attend (cached columns, then the new tokens)
    -> [B, W, H * D]

    Query head h uses K/V head h // G (G = H / Hkv, HF's `repeat_kv` order). The G query heads of a K/V
    head and the W new tokens are the G * W rows of one product with that head's keys, so K and V are
    never repeated; the softmax runs over the cached and the new columns together, so the cache is only
    read here (the caller writes the new K/V into it afterwards) and is never concatenated. Scores of
    columns a row may not see are set to the dtype's minimum (as HF's masks do) rather than -inf, so a
    row that sees nothing (a padding row) stays finite; the softmax runs in float32 (HF's eager attention).
    """
    b, w, h, d = q.shape
    kv_heads, s = k_old.shape[1], k_old.shape[2]
    g = h // kv_heads
    q = q.view(b, w, kv_heads, g, d).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, g * w, d)  # [B, Hkv, G*W, D]
    if w == 1:  # one new key per row: a product of [G, D] and [D, 1] per head is cheaper as a broadcast sum
        new = (q * k_new).sum(-1, keepdim=True)  # [B, Hkv, G, 1]
    else:
        new = torch.matmul(q, k_new.transpose(-1, -2))  # [B, Hkv, G*W, W]
    scores = torch.cat([torch.matmul(q, k_old.transpose(-1, -2)), new], dim=-1) * scaling  # [B, Hkv, G*W, S+W]
    scores = scores.view(b, kv_heads, g, w, s + w).masked_fill(blocked[:, None, None], torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype).view(b, kv_heads, g * w, s + w)
    out = torch.matmul(probs[..., :s], v_old)  # [B, Hkv, G*W, D]
    out = out + (probs[..., s:] * v_new if w == 1 else torch.matmul(probs[..., s:], v_new))
    return out.view(b, kv_heads, g, w, d).permute(0, 3, 1, 2, 4).reshape(b, w, h * d)


def decoder_forward(weights: Weights, k_cache: torch.Tensor, v_cache: torch.Tensor, tokens: torch.Tensor,
                    positions: torch.Tensor, valid: torch.Tensor, window: torch.Tensor, *, spec: Spec,
                    span: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W new tokens per row through the decoder: the last one's logits and all their keys and values.

    k_cache, v_cache: [L, B, Hkv, C, D], read only: their first `span` columns (at least the columns
                      written so far; eagerly exactly those, compiled a power of two, see `LeanDecoder.feed`)
    tokens, positions: [B, W] long (token ids; rotary positions)
    valid: [B, C] bool, the cached columns each row may attend to
    window: [B, W] bool, the new tokens a row feeds (False on the unused columns of a right-aligned window)
    -> (logits [B, V] of each row's last token (the HF model's `logits_to_keep=1`),
        k_new, v_new [L, B, Hkv, W, D]: what the caller writes into the cache's next W columns)

    A new token attends to the row's valid cached columns and to the row's new tokens up to itself.
    A pure function of its inputs (no cache writes inside), so that `torch.compile` has no mutated input
    to copy back.
    """
    b, width = tokens.shape
    x = F.embedding(tokens, weights.embed)  # [B, W, E]
    cos, sin = rotary(positions, weights.inv_freq, spec.rope_scaling, x.dtype)  # [B, W, D] each
    causal = torch.ones(width, width, dtype=torch.bool, device=tokens.device).tril()  # [W, W]
    blocked = ~torch.cat([valid[:, None, :span].expand(b, width, span), window[:, None, :] & causal[None]],
                         dim=-1)  # [B, W, S+W]
    k_new, v_new = [], []
    for i, lw in enumerate(weights.layers):
        h = rms_norm(x, lw.attn_norm, spec.eps)
        q = F.linear(h, lw.q, lw.q_bias).view(b, width, spec.heads, spec.head_dim)
        k = F.linear(h, lw.k, lw.k_bias).view(b, width, spec.kv_heads, spec.head_dim)
        v = F.linear(h, lw.v, lw.v_bias).view(b, width, spec.kv_heads, spec.head_dim)
        qk = rotate(torch.cat([q, k], dim=2), cos, sin)  # [B, W, H + Hkv, D]: one rotation for both
        q, k = qk[:, :, : spec.heads], qk[:, :, spec.heads :].transpose(1, 2)  # k: [B, Hkv, W, D]
        v = v.transpose(1, 2)  # [B, Hkv, W, D]
        k_new.append(k)
        v_new.append(v)
        a = attend(q, k_cache[i, :, :, :span], v_cache[i, :, :, :span], k, v, blocked, spec.scaling)  # [B, W, H*D]
        x = x + F.linear(a, lw.o, lw.o_bias)
        h = rms_norm(x, lw.mlp_norm, spec.eps)
        x = x + F.linear(F.silu(F.linear(h, lw.gate, lw.gate_bias)) * F.linear(h, lw.up, lw.up_bias),
                         lw.down, lw.down_bias)
    logits = F.linear(rms_norm(x[:, -1], weights.norm, spec.eps), weights.head, weights.head_bias)  # [B, V]
    return logits, torch.stack(k_new), torch.stack(v_new)


@dataclass
class LeanCache:
    """One chunk's KV cache. `rows` = a batch bucket >= the active rows; `slots` [A] the cache row of
    each active row (in the engine's order of active rows); `length` the columns written so far."""


    k: torch.Tensor  # [L, rows, Hkv, C, D]
    v: torch.Tensor  # [L, rows, Hkv, C, D]
    valid: torch.Tensor  # [rows, C] bool
    slots: torch.Tensor  # [A] long
    length: int
    weights: Weights  # the model's tensors, read at the prefill (a chunk's steps all see the same ones)

    @property
    def rows(self) -> int:
        return self.k.shape[1]

    @property
    def columns(self) -> int:
        return self.k.shape[3]

    def batch_select_indices(self, keep: torch.Tensor) -> None:
        """Keep only the active rows `keep` ([A'] indices into the active rows; HF's cache method of the
        same name). The cache moves into a smaller bucket once the rows fit one, else the dropped rows'
        slots just become padding."""
        self.slots = self.slots[keep]
        rows = bucket(max(1, len(self.slots)))
        if rows < self.rows:
            self.k, self.v = _compact(self.k, self.slots, rows), _compact(self.v, self.slots, rows)
            valid = self.valid.new_zeros((rows, self.columns))
            valid[: len(self.slots)] = self.valid[self.slots]
            self.valid = valid
            self.slots = torch.arange(len(self.slots), device=self.slots.device)

    def grow(self, columns: int) -> None:
        """Room for `columns` columns in all (tool observation windows can take more columns than the
        response has tokens: a window is as wide as its longest observation)."""
        extra = columns - self.columns
        self.k = torch.cat([self.k, self.k.new_zeros((*self.k.shape[:3], extra, self.k.shape[4]))], dim=3)
        self.v = torch.cat([self.v, self.v.new_zeros((*self.v.shape[:3], extra, self.v.shape[4]))], dim=3)
        self.valid = torch.cat([self.valid, self.valid.new_zeros((self.rows, extra))], dim=1)


def _compact(cache: torch.Tensor, slots: torch.Tensor, rows: int) -> torch.Tensor:
    """[L, R, ...] -> [L, rows, ...]: the rows `slots` first, zeros after."""
    out = cache.new_empty((cache.shape[0], rows, *cache.shape[2:]))
    torch.index_select(cache, 1, slots, out=out[:, : len(slots)])
    out[:, len(slots) :] = 0
    return out


class LeanDecoder:
    """Prefill and decode steps of a Qwen2 / Llama HF model with `decoder_forward` (see the module doc).

    `compile=True` compiles the one-token step with `torch.compile` (inductor; fixed shapes, one graph
    per batch bucket and attention span); if compilation fails, the step runs eagerly from then on,
    with one log line. Prefill and multi-token (tool observation) steps always run eagerly.
    """

    def __init__(self, model, *, compile: bool = False):
        self.model = model
        self.spec = Spec.of(model)
        self._forward = functools.partial(decoder_forward, spec=self.spec)
        self._compiled = torch.compile(self._forward, dynamic=False, fullgraph=True) if compile else None

    @classmethod
    def for_model(cls, model, *, compile: bool = False) -> LeanDecoder | None:
        """A decoder for `model`, or None with one log line saying why it keeps the HF forward."""
        reason = unsupported_reason(model)
        if reason is not None:
            log.warning("lean decoding is off for this model (%s): generating with the Hugging Face forward", reason)
            return None
        return cls(model, compile=compile)

    @torch.no_grad()
    def prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, positions: torch.Tensor, *,
                new_columns: int) -> tuple[LeanCache, torch.Tensor]:
        """The prompts' forward into a new cache with room for `new_columns` more columns.

        prompt_ids, prompt_mask, positions: [N, P] (left padded; mask 1 on prompt tokens)
        -> (cache, [N, V] logits of each prompt's last token)

        Each distinct prompt (ids and mask) runs once; its K/V are copied to every row that repeats it.
        """
        n, width = prompt_ids.shape
        device = prompt_ids.device
        unique, inverse = torch.unique(torch.cat([prompt_ids, prompt_mask], dim=1), dim=0, return_inverse=True)
        first = torch.full((len(unique),), n, dtype=torch.long, device=device).scatter_reduce(
            0, inverse, torch.arange(n, device=device), reduce="amin")  # [U]: one row of each distinct prompt
        w = weights_of(self.model)
        empty = w.embed.new_zeros((self.spec.layers, len(first), self.spec.kv_heads, 0, self.spec.head_dim))
        logits, k, v = self._forward(w, empty, empty, prompt_ids[first], positions[first],
                                     prompt_mask.new_zeros((len(first), 0), dtype=torch.bool),
                                     prompt_mask[first].bool(), span=0)  # [U, V], [L, U, Hkv, P, D] x 2
        cache = self._empty_cache(w, bucket(n), cache_columns(width + new_columns))
        cache.slots, cache.length = cache.slots[:n], width
        cache.k[:, :n, :, :width] = k[:, inverse]
        cache.v[:, :n, :, :width] = v[:, inverse]
        cache.valid[:n, :width] = prompt_mask.bool()
        return cache, logits[inverse]

    def _empty_cache(self, w: Weights, rows: int, columns: int) -> LeanCache:
        shape = (self.spec.layers, rows, self.spec.kv_heads, columns, self.spec.head_dim)
        return LeanCache(k=w.embed.new_zeros(shape), v=w.embed.new_zeros(shape),
                         valid=torch.zeros((rows, columns), dtype=torch.bool, device=w.embed.device),
                         slots=torch.arange(rows, device=w.embed.device), length=0, weights=w)

    @torch.no_grad()
    def warm_up(self, rows: int, columns: int) -> None:
        """Compile the one-token step now for every shape that chunks of up to `rows` rows and `columns`
        columns (longest prompt + new tokens) reach: each batch bucket, each attention span. Otherwise
        each shape compiles when a chunk first reaches it (tens of seconds each on a CPU). Nothing to do
        without `compile`."""
        if self._compiled is None:
            return
        columns = cache_columns(columns)
        starts = {}  # span -> the first number of written columns that attends over it
        for start in range(columns):
            starts.setdefault(compiled_span(start, columns), start)
        w = weights_of(self.model)
        for rows_ in sorted({bucket(a) for a in range(1, rows + 1)}, reverse=True):
            cache = self._empty_cache(w, rows_, columns)
            for start in starts.values():
                cache.length = start
                tokens, positions = (torch.zeros((rows_, 1), dtype=torch.long, device=w.embed.device) for _ in "tp")
                self.feed(cache, tokens, None, positions)  # two tensors: dynamo guards on inputs being one

    @torch.no_grad()
    def feed(self, cache: LeanCache, tokens: torch.Tensor, window: torch.Tensor | None,
             positions: torch.Tensor) -> torch.Tensor:
        """W more columns for the active rows.

        tokens, window, positions: [A, W] (ids; 1 where the row feeds a token, 0 on unused columns of a
        right-aligned window, None for all 1; rotary positions) -> [A, V] logits of each row's last column
        """
        a, width = tokens.shape
        if window is None:
            window = torch.ones((a, width), dtype=torch.bool, device=tokens.device)
        if cache.length + width > cache.columns:
            cache.grow(cache_columns(max(cache.length + width, cache.columns * 3 // 2)))
        full = a == cache.rows  # no padding rows (then slots are 0..A-1 in order)
        window = window.bool()
        if not full:
            tokens = tokens.new_zeros((cache.rows, width)).index_copy_(0, cache.slots, tokens)
            positions = positions.new_zeros((cache.rows, width)).index_copy_(0, cache.slots, positions)
            window = window.new_zeros((cache.rows, width)).index_copy_(0, cache.slots, window)
        start, end = cache.length, cache.length + width
        args = (cache.weights, cache.k, cache.v, tokens, positions, cache.valid, window)
        out = None
        if self._compiled is not None and width == 1:
            span = compiled_span(start, cache.columns)
            try:
                with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                    out = self._compiled(*args, span=span)
            except Exception as e:  # noqa: BLE001 - any compiler failure: the eager step computes the same
                log.warning("lean decoding: torch.compile failed (%s: %s); decoding eagerly", type(e).__name__,
                            str(e).splitlines()[0] if str(e) else "")
                self._compiled = None
        if out is None:
            out = self._forward(*args, span=start)  # eagerly, the columns written so far
        logits, k, v = out
        cache.k[:, :, :, start:end] = k
        cache.v[:, :, :, start:end] = v
        cache.valid[:, start:end] = window
        cache.length = end
        return logits if full else logits[cache.slots]
