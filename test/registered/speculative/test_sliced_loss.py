"""`loss_in_slices`: a loss computed slice by slice has the whole loss's value, every input
row gets exactly its slice's gradient, parameters read inside get theirs during the call, and
without autograd nothing is back-propagated."""

import sys

import pytest
import torch

from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.tools.dflash_training.sliced_loss import loss_in_slices

register_cpu_ci(est_time=5, suite="default")


def _setup():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 3, 4, generator=g, requires_grad=True)  # 7 blocks of 3 rows
    y = torch.randn(7, 3, generator=g)
    w = torch.nn.Parameter(torch.randn(4, 5, generator=g))
    return x, y, w


def _slice_loss(w):
    def f(x, y):
        z = (x @ w).tanh().sum(-1)
        return ((z - y) ** 2).sum(), {"err": (z - y).detach(), "n": torch.ones(len(x))}
    return f


def _whole(x, y, w):
    z = (x @ w).tanh().sum(-1)
    return ((z - y) ** 2).sum(), (z - y).detach()


@pytest.mark.parametrize("blocks", [1, 3, 7, 100])
def test_slices_give_the_whole_loss_and_gradients(blocks):
    x, y, w = _setup()
    whole, err = _whole(x, y, w)
    gx, gw = torch.autograd.grad(whole, [x, w])
    h = x * 2  # a graph above the sliced inputs: the gradient must reach x through it
    h.retain_grad()
    w.grad = None
    loss, stats = loss_in_slices(_slice_loss(w), [h / 2], [y], blocks)
    assert w.grad is not None  # handed over during the call
    torch.testing.assert_close(w.grad, gw)
    torch.testing.assert_close(loss, whole)
    torch.testing.assert_close(stats["err"], err)
    assert stats["n"].shape == (7,)
    loss.backward()
    # each row: its own slice's ops, nothing summed across slices; so equal up to the BLAS's
    # rounding, which on some CPUs depends on the GEMM's row count (bitwise equal on CI's)
    torch.testing.assert_close(x.grad, gx, rtol=1e-6, atol=1e-7)


def test_without_autograd_nothing_is_back_propagated():
    x, y, w = _setup()
    with torch.no_grad():
        loss, _ = loss_in_slices(_slice_loss(w), [x], [y], 2)
    assert w.grad is None and x.grad is None and not loss.requires_grad
    torch.testing.assert_close(loss, _whole(x, y, w)[0].detach())


def test_slice_size_must_be_positive():
    x, y, w = _setup()
    with pytest.raises(ValueError, match="blocks_per_slice must be >= 1, got 0"):
        loss_in_slices(_slice_loss(w), [x], [y], 0)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
