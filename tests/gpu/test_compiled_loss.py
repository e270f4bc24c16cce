"""xmlm_masked_lm's compiled loss (the model's --compile on a GPU) computes fairseq's cross-entropy: the same sum and
the same gradient for bf16 and fp16 logits, with padding targets and a Sep Emb softmax's -inf logits."""
import pytest
import torch
from fairseq import modules

from fairseq_xmlm.criterions.xmlm_masked_lm import compiled_summed_cross_entropy

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_compiled_loss_and_gradient_are_fairseqs(dtype):
    torch.manual_seed(0)
    pad = 1
    for rows in (37, 512, 3001):  # another number of masked positions each time: one dynamic compilation
        logits = (torch.randn(rows, 5000, device="cuda") * 4).to(dtype)
        logits[: rows // 2, 4000:] = float("-inf")  # half the rows restricted to their own vocabulary
        targets = torch.randint(0, 4000, (rows,), device="cuda")
        targets[::7] = pad
        grads = []
        for loss_fn in (lambda x, t: modules.cross_entropy(x, t, reduction="sum", ignore_index=pad),
                        lambda x, t: compiled_summed_cross_entropy()(x, t, pad)):
            x = logits.clone().requires_grad_()
            loss = loss_fn(x, targets)
            loss.backward()
            grads.append((loss.detach(), x.grad))
        (stock_loss, stock_grad), (loss, grad) = grads
        assert loss.dtype == torch.float32 and grad.dtype == dtype
        torch.testing.assert_close(loss, stock_loss, rtol=1e-5, atol=1e-3)
        # both round the same fp32 gradient to the logits' precision: at most one unit in the last place apart
        torch.testing.assert_close(grad.float(), stock_grad.float(), rtol=1e-2, atol=1e-6)
        assert torch.equal(grad[: rows // 2, 4000:], torch.zeros_like(grad[: rows // 2, 4000:]))
