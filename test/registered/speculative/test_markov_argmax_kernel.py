"""DSpark's greedy Markov loop as n + 1 Triton launches (`markov_argmax_kernel`), under the
Triton interpreter: with fp32 weights its tokens equal the torch loop's exactly (every batch,
vocabulary and rank shape, chunk edges included); ties go to the smallest index as
`torch.argmax`'s do; `propose_block` takes it when its switch is on and gives the loop's
tokens and confidences; bad shapes are refused naming them. (bf16 weights: the interpreter's
bf16 `tl.dot` is not the GPU's, so `test_markov_argmax_kernel_cuda.py` checks them.)"""

import os
import sys
from types import SimpleNamespace

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest
import torch
from test_dspark_proposal import inputs, make_draft

from sglang_aux.srt.layers.triton_ops.dispatch import ENV_VAR, MARKOV_ARGMAX_ENV_VAR
from sglang_aux.srt.speculative import dspark_proposal, markov_argmax_kernel
from sglang_aux.srt.speculative.dspark_proposal import propose_block
from sglang_aux.srt.speculative.markov_argmax_kernel import (
    MAX_CHUNKS,
    MAX_ROWS,
    PARTIALS_BLOCK,
    ROWS,
    SUB,
    WIDE_TILE,
    MarkovTile,
    chunk_rows,
    markov_greedy_tokens,
    markov_tile,
    supports,
)
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="default")


def torch_loop(base, anchor, w1, w2):
    tokens = torch.empty(base.shape[:2], dtype=torch.int64)
    prev = anchor
    for k in range(base.shape[1]):
        step = base[:, k] + torch.nn.functional.linear(w1[prev], w2).to(base.dtype)
        prev = step.argmax(-1)
        tokens[:, k] = prev
    return tokens


def head(vocab, rank, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(vocab, rank, generator=g).to(dtype),
            (torch.randn(vocab, rank, generator=g) / rank ** 0.5).to(dtype))


# a vocabulary whose chunks are two tiles, and more of them than one partials block
TWO_TILES = MAX_CHUNKS * SUB + 1
# (bs, n, vocab, rank): one request; the larger row block, part full (ROWS + 1); two of them,
# the second with one request (MAX_ROWS + 1); a vocabulary that ends one past a tile; several
# rank blocks; chunks of two tiles
SHAPES = [(1, 2, SUB + 1, 32), (5, 3, 300, 16), (ROWS + 1, 4, 1000, 48), (3, 7, 4 * SUB, 64),
          (2, 2, TWO_TILES, 16), (MAX_ROWS + 1, 2, 300, 16)]


def test_the_chunks_and_row_blocks():
    assert chunk_rows(SUB + 1) == SUB and chunk_rows(TWO_TILES) == 2 * SUB
    assert [markov_tile(b) for b in (1, ROWS, ROWS + 1, 64)] == \
        [MarkovTile(ROWS, 4, False)] * 2 + [MarkovTile(MAX_ROWS, 8, True, 3, 128)] * 2
    assert markov_tile(64, torch.float16) == WIDE_TILE
    assert markov_tile(64, torch.float32) == MarkovTile()  # its stages would not fit an SM
    for bad in (dict(rows=64), dict(num_warps=2), dict(num_stages=5), dict(max_registers=96)):
        with pytest.raises(ValueError, match="takes 16 or 32 rows on 4 or 8 warps"):
            MarkovTile(**bad)
    assert -(-TWO_TILES // chunk_rows(TWO_TILES)) > PARTIALS_BLOCK
    assert chunk_rows(49_152) == 256 and chunk_rows(151_936) == 640


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tokens_equal_the_torch_loop(shape):
    bs, n, vocab, rank = shape
    g = torch.Generator().manual_seed(bs)
    base = 3 * torch.randn(bs, n, vocab, generator=g)
    w1, w2 = head(vocab, rank, seed=bs)
    anchor = torch.randint(0, vocab, (bs,), generator=g)
    out = torch.full((bs, n), -1, dtype=torch.int64)
    markov_greedy_tokens(base, anchor, w1, w2, out)
    assert torch.equal(out, torch_loop(base, anchor, w1, w2))


@pytest.mark.parametrize("tile", [MarkovTile(), MarkovTile(MAX_ROWS, 8),
                                  MarkovTile(MAX_ROWS, 8, True, 3, 128),
                                  MarkovTile(pipelined=True, num_stages=2)], ids=str)
def test_every_tile_gives_the_same_tokens(tile):
    bs, n, vocab, rank = MAX_ROWS + 1, 3, 2 * SUB + 5, 32
    g = torch.Generator().manual_seed(7)
    base = 3 * torch.randn(bs, n, vocab, generator=g)
    w1, w2 = head(vocab, rank, seed=7)
    anchor = torch.randint(0, vocab, (bs,), generator=g)
    out = torch.full((bs, n), -1, dtype=torch.int64)
    markov_greedy_tokens(base, anchor, w1, w2, out, tile)
    assert torch.equal(out, torch_loop(base, anchor, w1, w2))


@pytest.mark.parametrize("tile", [None, WIDE_TILE], ids=str)
def test_ties_go_to_the_smallest_index(tile):
    """Equal maxima inside a tile, across a chunk's tiles, across chunks, across partials
    blocks and across row blocks: the first wins."""
    bs, vocab = MAX_ROWS + 2, TWO_TILES
    chunk = chunk_rows(vocab)
    base = torch.zeros(bs, 2, vocab)
    w1, w2 = torch.ones(vocab, 16), torch.zeros(vocab, 16)  # no bias
    firsts = [5, SUB - 1, chunk - 1, PARTIALS_BLOCK * chunk - 1, 2 * chunk + 3] * bs
    for r in range(bs):
        first = firsts[r]
        base[r, :, first] = base[r, :, vocab - 1] = base[r, :, first + 1] = 2.0
    out = torch.empty(bs, 2, dtype=torch.int64)
    markov_greedy_tokens(base, torch.zeros(bs, dtype=torch.int64), w1, w2, out, tile)
    assert out[:, 0].tolist() == out[:, 1].tolist() == firsts[:bs]
    assert torch.equal(out, torch_loop(base, torch.zeros(bs, dtype=torch.int64), w1, w2))


def test_propose_block_takes_it_when_switched_on(monkeypatch):
    draft = make_draft(2)
    base, hidden, anchors, positions = inputs(draft, seed=2)
    with torch.no_grad():
        loop = propose_block(draft, base, anchors, positions, None, all_greedy=True,
                             hidden=hidden)
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return markov_greedy_tokens(*args, **kwargs)

    monkeypatch.setattr(markov_argmax_kernel, "markov_greedy_tokens", spy)
    monkeypatch.setenv(ENV_VAR, "force")
    monkeypatch.setenv(MARKOV_ARGMAX_ENV_VAR, "1")
    with torch.no_grad():
        fused = propose_block(draft, base, anchors, positions, None, all_greedy=True,
                              hidden=hidden)
        no_conf = propose_block(draft, base, anchors, positions, None, all_greedy=True)
    assert calls == [base.shape, base.shape]
    assert torch.equal(fused.tokens, loop.tokens) and torch.equal(no_conf.tokens, loop.tokens)
    torch.testing.assert_close(fused.confidence, loop.confidence)
    assert fused.probs is None and no_conf.confidence is None
    # over a draft vocabulary: the kernel with its ids, the loop's tokens
    ids = torch.randperm(base.shape[-1], generator=torch.Generator().manual_seed(3))[:100]
    draft.set_target_modules(torch.nn.Embedding(base.shape[-1], hidden.shape[-1]),
                             torch.randn(100, hidden.shape[-1]), ids)
    hot = base[..., ids].contiguous()
    with torch.no_grad():
        mapped = propose_block(draft, hot, anchors, positions, None, all_greedy=True)
        monkeypatch.setenv(MARKOV_ARGMAX_ENV_VAR, "0")  # off: the loop, the kernel not called
        mapped_loop = propose_block(draft, hot, anchors, positions, None, all_greedy=True)
    assert calls == [base.shape, base.shape, hot.shape]
    assert torch.equal(mapped.tokens, mapped_loop.tokens) and torch.isin(mapped.tokens, ids).all()


def test_the_switch_and_the_rank_gate_it(monkeypatch):
    base = torch.zeros(1, 2, 64)
    monkeypatch.setenv(ENV_VAR, "force")
    monkeypatch.setenv(MARKOV_ARGMAX_ENV_VAR, "1")
    for rank, taken in ((16, True), (48, True), (8, False), (24, False)):
        markov = SimpleNamespace(markov_w1=torch.nn.Embedding(64, rank))
        assert supports(rank) == taken == (dspark_proposal._greedy_kernel(base, markov)
                                           is not None)
    monkeypatch.setenv(MARKOV_ARGMAX_ENV_VAR, "2")
    with pytest.raises(ValueError, match="SGLANG_AUX_MARKOV_ARGMAX='2'; choose from 1, 0"):
        dspark_proposal._greedy_kernel(base, markov)


@pytest.mark.parametrize("tile", [MarkovTile(), WIDE_TILE], ids=str)
def test_a_draft_vocabulary_is_the_torch_loop_with_the_rest_masked(tile):
    """`token_ids`: the kernel sweeps the H columns and markov_w2's rows of them, maps each
    argmax column to its token, which indexes markov_w1 for the next proposal: the torch
    loop's tokens with every other token's base logit at -inf (ids in shuffled order; more
    requests than one row block)."""
    bs, n, vocab, rank = MAX_ROWS + 1, 4, 3 * SUB + 7, 32
    g = torch.Generator().manual_seed(9)
    ids = torch.randperm(vocab, generator=g)[:SUB + 33]
    base = 3 * torch.randn(bs, n, vocab, generator=g)
    masked = torch.full_like(base, -float("inf"))
    masked[..., ids] = base[..., ids]
    w1, w2 = head(vocab, rank, seed=9)
    anchor = torch.randint(0, vocab, (bs,), generator=g)
    out = torch.full((bs, n), -1, dtype=torch.int64)
    markov_greedy_tokens(base[..., ids].contiguous(), anchor, w1, w2[ids].contiguous(), out,
                         tile, token_ids=ids)
    assert torch.equal(out, torch_loop(masked, anchor, w1, w2))
    assert torch.isin(out, ids).all()
    hot = base[..., ids].contiguous()
    with pytest.raises(ValueError, match=r"token_ids torch.int32 \(161,\) must be contiguous "
                                         r"int64 \(161,\)"):
        markov_greedy_tokens(hot, anchor, w1, w2[ids].contiguous(), out, token_ids=ids.int())
    with pytest.raises(ValueError, match=r"markov_w2 torch.float32 \(391, 32\) must both .*"
                                         r"markov_w2: the draft vocabulary's"):
        markov_greedy_tokens(hot, anchor, w1, w2, out, token_ids=ids)
    with pytest.raises(ValueError, match="certified top-K candidates do not take a draft"):
        markov_greedy_tokens(hot, anchor, w1, w2[ids].contiguous(), out,
                             certified=(out, out), token_ids=ids)


def test_bad_shapes_are_refused():
    base = torch.zeros(2, 3, 100)
    w1, w2 = head(100, 16)
    out = torch.empty(2, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"markov_w1 torch.float32 \(100, 16\) and markov_w2 "
                                         r"torch.float32 \(99, 16\)"):
        markov_greedy_tokens(base, torch.zeros(2, dtype=torch.int64), w1, w2[:99], out)
    with pytest.raises(ValueError, match=r"markov_w2 torch.bfloat16 \(100, 16\).*one dtype"):
        markov_greedy_tokens(base, torch.zeros(2, dtype=torch.int64), w1, w2.bfloat16(), out)
    with pytest.raises(ValueError, match=r"anchor_tokens \(3,\) one token per request"):
        markov_greedy_tokens(base, torch.zeros(3, dtype=torch.int64), w1, w2, out)
    with pytest.raises(ValueError, match=r"tokens_out must be int64 \(2, 3\).*torch.int32"):
        markov_greedy_tokens(base, torch.zeros(2, dtype=torch.int64), w1, w2,
                             out.to(torch.int32))
    w1_8, w2_8 = head(100, 8)
    with pytest.raises(ValueError, match="r a multiple of 16"):
        markov_greedy_tokens(base, torch.zeros(2, dtype=torch.int64), w1_8, w2_8, out)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
