"""Scoring passes: per-token logprobs (and entropy) of given responses under a causal LM.

Sequences are laid out exactly as the rollout engine produced them, `[left-padded prompt | response]`,
with position ids that skip the padding, so the training model sees the same positions the sampler
did. Logits are never materialised for the whole batch: the final hidden states go through
`algo.entropy.logprobs_and_entropy`, which works in chunks.
"""

from __future__ import annotations

import torch

from mathrl.algo.entropy import logprobs_and_entropy
from mathrl.model.lora import unwrap


def backbone_and_head(model):
    """The decoder stack (returns hidden states) and the output projection of a HF causal LM (inside
    a peft PeftModel: its LoRA layers are in the decoder stack)."""
    model = unwrap(model)
    backbone = getattr(model, model.base_model_prefix)
    head = model.get_output_embeddings()
    return backbone, head


def final_hidden(model, **inputs) -> torch.Tensor:
    """The final (normed) hidden states [B, L, H] of a causal LM for `inputs`.

    Normally the decoder stack alone runs (no logits at all). An FSDP2-sharded model (train/dist.py)
    must run through its root module instead, whose hooks gather the embeddings, final norm and head;
    the root keeps them gathered after its forward, so the caller can still apply the head in chunks
    (and `release_root` reshards them after a no-grad pass). The decoder stack's output is caught by a
    forward hook: asking the root for output_hidden_states would keep every layer's hidden states
    alive (L + 1 tensors of [B, L, H]), and the head runs on one position only (logits_to_keep=1).
    """
    from torch.distributed.fsdp import FSDPModule

    backbone, _ = backbone_and_head(model)
    if not isinstance(model, FSDPModule):
        return backbone(**inputs).last_hidden_state
    caught: list[torch.Tensor] = []

    def keep(_module, _args, output):
        caught.append(output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0])

    handle = backbone.register_forward_hook(keep)
    try:
        model(**inputs, logits_to_keep=1)
    finally:
        handle.remove()
    return caught[0]


def release_root(model) -> None:
    """Reshard an FSDP2 root after a no-grad forward. FSDP2 leaves the root's parameters (embeddings,
    final norm, head) gathered after its forward, expecting a backward to follow; a scoring pass has
    none, so without this a whole unsharded copy of them stays in memory until the next forward."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule) and not torch.is_grad_enabled():
        model.reshard()


def input_device(model) -> torch.device:
    """Where a model's inputs go: its parameters' device, or, for an FSDP2-sharded model, the device
    its mesh computes on (its parameters may live in CPU memory with train.dist.cpu_offload)."""
    param = next(model.parameters())
    mesh = getattr(param, "device_mesh", None)  # a DTensor: FSDP2 computes on its mesh's device type
    if mesh is not None and mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return param.device


def packed_inputs(model, prompt_ids, prompt_mask, response_ids, response_mask):
    """(input_ids, attention_mask, position_ids), each [B, P+T] on the model's device, for the
    `[left-padded prompt | right-padded response]` layout, positions skipping the left padding."""
    device = input_device(model)
    input_ids = torch.cat([prompt_ids, response_ids], dim=1).to(device)
    attention_mask = torch.cat([prompt_mask.long(), response_mask.long()], dim=1).to(device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def response_logprobs(
    model,
    prompt_ids: torch.Tensor,  # [B, P] left-padded
    prompt_mask: torch.Tensor,  # [B, P]
    response_ids: torch.Tensor,  # [B, T] right-padded
    response_mask: torch.Tensor,  # [B, T]
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logprobs [B, T] of the response tokens (and entropy [B, T] of each next-token distribution).

    Differentiable when grad is enabled. Values at masked response positions are meaningless; mask them.
    """
    hidden, head = response_hidden(model, prompt_ids, prompt_mask, response_ids, response_mask)
    out = logprobs_and_entropy(
        hidden,
        head.weight,
        response_ids.to(hidden.device),
        chunk_size=chunk_size,
        temperature=temperature,
        with_entropy=with_entropy,
        lm_head_bias=getattr(head, "bias", None),
    )
    release_root(model)
    return out


def response_hidden(model, prompt_ids, prompt_mask, response_ids, response_mask) -> tuple[torch.Tensor, torch.nn.Module]:
    """(hidden [B, T, H], the output head): the final hidden state before each response token, the one that
    predicts it, in the `[left-padded prompt | response]` layout of `response_logprobs`."""
    input_ids, attention_mask, position_ids = packed_inputs(model, prompt_ids, prompt_mask, response_ids, response_mask)
    _, head = backbone_and_head(model)
    hidden = final_hidden(model, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    p, t = prompt_ids.shape[1], response_ids.shape[1]
    return hidden[:, p - 1 : p + t - 1], head  # [B, T, H]


@torch.no_grad()
def response_sum_pi_squared(
    model,
    prompt_ids: torch.Tensor,  # [B, P] left-padded
    prompt_mask: torch.Tensor,  # [B, P]
    response_ids: torch.Tensor,  # [B, T] right-padded
    response_mask: torch.Tensor,  # [B, T]
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """[B, T] sum_v pi_v^2 of the (tempered) next-token distribution before each response token, no grad:
    exp(logsumexp(2 log pi)), chunk_size positions at a time (the optimal token baseline's ||s||^2 term)."""
    hidden, head = response_hidden(model, prompt_ids, prompt_mask, response_ids, response_mask)  # [B, T, H]
    flat = hidden.reshape(-1, hidden.shape[-1])  # [B*T, H]
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
    for s in range(0, flat.shape[0], chunk_size):
        z = torch.nn.functional.linear(flat[s : s + chunk_size], head.weight, getattr(head, "bias", None)).float()
        logp = torch.log_softmax(z / temperature, dim=-1)  # [C, V]
        out[s : s + chunk_size] = torch.logsumexp(2.0 * logp, dim=-1).exp()
    release_root(model)
    return out.view(response_ids.shape[0], response_ids.shape[1])


def tempered_logprobs(hidden: torch.Tensor, head, temperature: float) -> torch.Tensor:
    """[B, T, V] float32 log-softmax of the head's logits / temperature: the whole vocabulary, for the
    distillation losses that compare distributions (a micro-batch's worth of [B, T, V] in memory)."""
    logits = head(hidden).float() / temperature  # [B, T, V]
    return torch.log_softmax(logits, dim=-1)


def response_logprobs_at(model, prompt_ids, prompt_mask, response_ids, response_mask, ids: torch.Tensor, *,
                         temperature: float = 1.0, chunk_size: int = 1024,
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`response_logprobs` (logprobs [B, T] and entropy [B, T]) and, from the same forward, the logprobs
    [B, T, K] of the token ids `ids` [B, T, K] at each position (the teacher's top-k; differentiable)."""
    hidden, head = response_hidden(model, prompt_ids, prompt_mask, response_ids, response_mask)
    logprobs, entropy = logprobs_and_entropy(hidden, head.weight, response_ids.to(hidden.device), chunk_size=chunk_size,
                                             temperature=temperature, lm_head_bias=getattr(head, "bias", None))
    at = tempered_logprobs(hidden, head, temperature).gather(-1, ids.to(hidden.device))  # [B, T, K]
    release_root(model)
    return logprobs, entropy, at


@torch.no_grad()
def response_topk(model, prompt_ids, prompt_mask, response_ids, response_mask, *, temperature: float = 1.0,
                  k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A teacher's view of given responses, no grad: (logprobs [B, T] of the response tokens, is_argmax [B, T]
    1.0 where the token is the model's most likely one, topk_ids [B, T, K] long and topk_logprobs [B, T, K] of
    its k most likely tokens, k capped at the vocabulary), all of the tempered distribution."""
    hidden, head = response_hidden(model, prompt_ids, prompt_mask, response_ids, response_mask)
    logp = tempered_logprobs(hidden, head, temperature)  # [B, T, V]
    tokens = response_ids.to(hidden.device)[..., None]  # [B, T, 1]
    logprobs = logp.gather(-1, tokens)[..., 0]
    top_lp, top_ids = logp.topk(min(k, logp.shape[-1]), dim=-1)  # [B, T, K]
    is_argmax = (top_ids[..., :1] == tokens)[..., 0].float()
    release_root(model)
    return logprobs, is_argmax, top_ids, top_lp


def next_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, chunk_size: int = 1024) -> torch.Tensor:
    """[B, L-1] logprob of each token given the ones before it (right-padded text; for PTX-style losses)."""
    device = input_device(model)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    _, head = backbone_and_head(model)
    hidden = final_hidden(model, input_ids=input_ids, attention_mask=attention_mask)[:, :-1]
    logprobs, _ = logprobs_and_entropy(
        hidden, head.weight, input_ids[:, 1:], chunk_size=chunk_size, with_entropy=False,
        lm_head_bias=getattr(head, "bias", None),
    )
    release_root(model)
    return logprobs
