"""algo.fused_logprobs: the hand-written backward against autograd through the full logits, in the
branches the chunked tests of test_entropy_kl.py do not reach (only the logprobs carry a gradient;
entropy not computed; float32 inputs).

    python -m pytest tests/algo/test_fused_logprobs.py -q
"""

import pytest
import torch
from torch.testing import assert_close

from mathrl.algo.fused_logprobs import fused_logprobs_entropy


def reference(hidden, weight, bias, targets, temperature):
    logits = (hidden @ weight.T + (0 if bias is None else bias)) / temperature  # [N, V]
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, targets[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("with_entropy", [True, False])  # True: entropy computed but its gradient is None
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_logprob_only_gradient_matches_autograd(with_entropy, dtype, tol):
    gen = torch.Generator().manual_seed(1)
    n, width, vocab, temperature = 7, 5, 11, 0.6
    hidden = torch.randn(n, width, generator=gen, dtype=dtype)
    weight = torch.randn(vocab, width, generator=gen, dtype=dtype)
    bias = torch.randn(vocab, generator=gen, dtype=dtype)
    targets = torch.randint(0, vocab, (n,), generator=gen)
    coeff = torch.randn(n, generator=gen, dtype=dtype)
    grads = []
    for fused in (False, True):
        leaves = [t.clone().requires_grad_(True) for t in (hidden, weight, bias)]
        if fused:
            lp, ent = fused_logprobs_entropy(*leaves, targets, temperature=temperature, chunk_size=3,
                                             with_entropy=with_entropy)
            assert (ent is not None) == with_entropy
        else:
            lp, _ = reference(*leaves, targets, temperature)
        (coeff * lp).sum().backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        assert_close(a, b, rtol=tol, atol=tol)


def test_entropy_only_gradient_matches_autograd():
    # why: an entropy bonus alone (no policy term) reaches the backward with grad_logprobs None
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 6, (4,), generator=gen)
    _, ent = fused_logprobs_entropy(hidden, weight, None, targets, temperature=1.0, chunk_size=2, with_entropy=True)
    ent.sum().backward()
    h2, w2 = hidden.detach().clone().requires_grad_(True), weight.detach().clone().requires_grad_(True)
    reference(h2, w2, None, targets, 1.0)[1].sum().backward()
    assert_close(hidden.grad, h2.grad)
    assert_close(weight.grad, w2.grad)
