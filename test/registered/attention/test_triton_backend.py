"""TritonAttnBackend == TorchNativeAttnBackend in every mode, via Triton's CPU interpreter.

Fresh random K/V every run (the seed is in every failure message), scattered pool slots,
requests of different lengths, GQA, padded graph rows, the split-K merge path (a merge
kernel, or in-kernel: short contexts unsplit, long ones merged by their last split), causal
and bidirectional layers, sliding windows, and keys before a window never read (NaN there).
A ragged verify step (compact verify: one entry per token, `RaggedStepPrologue`) read per
request equals its per-token path, torch_native and the static layout's rows.
"""

import os

# NOTE: must precede any @triton.jit definition, i.e. any import of triton or the backend.
os.environ["TRITON_INTERPRET"] = "1"

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch, ForwardMode  # noqa: E402
from sglang_aux.srt.forward_state.ragged_requests import RaggedRequests  # noqa: E402
from sglang_aux.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend  # noqa: E402
from sglang_aux.srt.layers.attention.triton_backend import (  # noqa: E402
    ExtendMetadata,
    TritonAttnBackend,
)
from sglang_aux.srt.layers.attention.triton_ops.decode_attention import (  # noqa: E402
    MERGE_MODES,
    SplitCounters,
    decode_attention_fwd,
)
from sglang_aux.srt.layers.attention.triton_ops.extend_attention import (  # noqa: E402
    extend_attention_fwd,
)
from sglang_aux.srt.layers.attention.triton_ops.tiling import SinglePassTile  # noqa: E402
from sglang_aux.srt.layers.radix_attention import (  # noqa: E402
    FULL_CONTEXT,
    AttentionType,
    RadixAttention,
)
from sglang_aux.srt.mem_cache.memory_pool import (  # noqa: E402
    PADDING_REQ_ROW,
    PADDING_SLOT,
    MHATokenToKVPool,
    ReqToTokenPool,
)
from sglang_aux.srt.model_executor.model_runner import make_attn_backend  # noqa: E402
from sglang_aux.srt.server_args import ServerArgs  # noqa: E402
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402
from sglang_aux.test.kernel_checks import fresh_seed  # noqa: E402
from sglang_aux.test.ragged_steps import ragged_verify_batch  # noqa: E402

register_cpu_ci(est_time=200, suite="default")

# Max |triton - torch_native| over max |torch_native| (seen: ~3e-7 fp32, ~4e-4 fp16). fp32
# differs only in summation order; in fp16 both round P to fp16, at different points.
REL_ERR_BOUND = {torch.float32: 1e-4, torch.float16: 5e-3}
NUM_LAYERS = 2
LAYER_ID = 1  # not 0, so a backend that ignores layer_id reads the wrong buffer
NUM_SLOTS = 700
MAX_CONTEXT = 256
BLOCK = 4  # tokens per request in TARGET_VERIFY / DRAFT_BLOCK
# (q heads, kv heads, head_dim): GQA with a power-of-two and a non-power-of-two group
HEAD_CONFIGS = [(4, 2, 32), (6, 2, 16)]
# Context lengths long enough that 3 key splits leave one split empty and merge two others.
FIXED_SEQ_LENS = [BLOCK, 37, 130, 200]
DECODER, ENCODER_ONLY = AttentionType.DECODER, AttentionType.ENCODER_ONLY
# (mode, tokens per request, layer type): DFlash draft layers are bidirectional in the block,
# or causal (sliding_attention layers, as SGLang runs them)
FIXED_MODES = [(ForwardMode.DECODE, 1, DECODER), (ForwardMode.TARGET_VERIFY, BLOCK, DECODER),
               (ForwardMode.DRAFT_BLOCK, BLOCK, ENCODER_ONLY),
               (ForwardMode.DRAFT_BLOCK, BLOCK, DECODER)]
FIXED_IDS = [f"{m.name}-{t.name}" for m, _, t in FIXED_MODES]
# keys left of the query a layer sees: all, a window shorter than BLOCK_N and the block (so a
# split starts mid-tile), and a longer one
WINDOWS = [FULL_CONTEXT, 2, 45]


def make_pools(num_kv_heads: int, head_dim: int, dtype: torch.dtype):
    req_pool = ReqToTokenPool(size=8, max_context_len=MAX_CONTEXT, device="cpu")
    kv_pool = MHATokenToKVPool(NUM_SLOTS, NUM_LAYERS, num_kv_heads, head_dim, dtype, "cpu")
    # Random everywhere, the padding slot included: padded rows read it.
    for buf in (*kv_pool.k_buffer, *kv_pool.v_buffer):
        buf.normal_()
    return req_pool, kv_pool


def place_requests(req_pool: ReqToTokenPool, lens: list[int]) -> list[int]:
    """Allocates a row per request and maps its positions to scattered, distinct slots."""
    slots = torch.randperm(NUM_SLOTS)[: sum(lens)] + 1  # never the padding slot
    rows = [req_pool.alloc() for _ in lens]
    for row, chunk in zip(rows, slots.split(lens), strict=True):
        req_pool.write(row, 0, chunk)
    return rows


def make_batch(mode: ForwardMode, req_pool, kv_pool, rows: list[int], seq_lens: list[int],
               positions: torch.Tensor, out_cache_loc: torch.Tensor, backend,
               prefix_lens: list[int] | None = None,
               extend_lens: list[int] | None = None) -> ForwardBatch:
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int64)
    return ForwardBatch(
        forward_mode=mode, batch_size=len(rows),
        input_ids=torch.zeros(positions.numel(), dtype=torch.int64),
        req_pool_indices=torch.tensor(rows, dtype=torch.int64),
        seq_lens=seq_lens_t, seq_lens_cpu=seq_lens_t.clone(),
        out_cache_loc=out_cache_loc, positions=positions,
        req_to_token_pool=req_pool, token_to_kv_pool=kv_pool, attn_backend=backend,
        extend_prefix_lens_cpu=prefix_lens, extend_seq_lens_cpu=extend_lens,
    )


def fixed_layout_batch(mode: ForwardMode, q_len: int, req_pool, kv_pool, backend,
                       lens: list[int] = FIXED_SEQ_LENS) -> ForwardBatch:
    """Live requests of `lens` tokens whose last `q_len` are this forward's, then padded
    rows: one with seq_len 1 at position 0, one as the decode graph runner pads (seq_len q_len,
    positions 0..q_len-1). Both read request row 0 (slot 0) and write slot 0."""
    rows = place_requests(req_pool, lens)
    positions, locs = [], []
    for row, n in zip(rows, lens, strict=True):
        positions.append(torch.arange(n - q_len, n))
        locs.append(req_pool.req_to_token[row, n - q_len : n].long())
    seq_lens = list(lens)
    for pad_len, pad_pos in ((1, torch.zeros(q_len, dtype=torch.int64)),
                             (q_len, torch.arange(q_len))):
        rows.append(PADDING_REQ_ROW)
        seq_lens.append(pad_len)
        positions.append(pad_pos)
        locs.append(torch.full((q_len,), PADDING_SLOT, dtype=torch.int64))
    return make_batch(mode, req_pool, kv_pool, rows, seq_lens, torch.cat(positions),
                      torch.cat(locs), backend)


def random_qkv(num_tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
    q = torch.randn(num_tokens, heads * head_dim).to(dtype)
    k = torch.randn(num_tokens, kv_heads * head_dim).to(dtype)
    v = torch.randn(num_tokens, kv_heads * head_dim).to(dtype)
    return q, k, v


def run_both(fb: ForwardBatch, triton_backend, layer, q, k, v) -> tuple[torch.Tensor, ...]:
    """Triton writes the new K/V and attends; torch_native then attends over the same pool."""
    triton_backend.init_forward_metadata(fb)
    out = triton_backend.forward(q, k, v, layer, fb, save_kv_cache=True)
    reference = TorchNativeAttnBackend()
    reference.init_forward_metadata(fb)
    ref = reference.forward(q, k, v, layer, fb, save_kv_cache=False)
    return out, ref


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, seed: int) -> None:
    assert out.dtype == ref.dtype == dtype, (out.dtype, ref.dtype)
    assert torch.isfinite(out).all(), f"non-finite triton output (seed {seed})"
    assert torch.isfinite(ref).all(), f"non-finite reference output (seed {seed})"
    err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    assert err < REL_ERR_BOUND[dtype], f"rel err {err:.2e} (seed {seed})"


def extend_batch(req_pool, kv_pool, backend, prefix_lens: list[int],
                 extend_lens: list[int]) -> ForwardBatch:
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    rows = place_requests(req_pool, seq_lens)
    locs = torch.cat([req_pool.req_to_token[r, p:n].long()
                      for r, p, n in zip(rows, prefix_lens, seq_lens, strict=True)])
    positions = torch.cat([torch.arange(p, n) for p, n in zip(prefix_lens, seq_lens,
                                                              strict=True)])
    return make_batch(ForwardMode.EXTEND, req_pool, kv_pool, rows, seq_lens, positions, locs,
                      backend, prefix_lens, extend_lens)


# the last request's 70 new tokens span two query tiles
EXTEND_PREFIX_LENS, EXTEND_LENS = [0, 5, 23, 40], [9, 1, 17, 70]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("num_kv_splits", [None, 3])
@pytest.mark.parametrize("attn_type", [DECODER, ENCODER_ONLY], ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("heads,kv_heads,head_dim", HEAD_CONFIGS)
def test_extend_matches_torch_native_and_writes_kv(heads, kv_heads, head_dim, dtype, attn_type,
                                                   num_kv_splits, window):
    seed = fresh_seed()
    req_pool, kv_pool = make_pools(kv_heads, head_dim, dtype)
    backend = TritonAttnBackend(num_kv_splits=num_kv_splits)
    fb = extend_batch(req_pool, kv_pool, backend, EXTEND_PREFIX_LENS, EXTEND_LENS)
    locs = fb.out_cache_loc
    q, k, v = random_qkv(locs.numel(), heads, kv_heads, head_dim, dtype)
    # Poison the new slots: a backend that attends before (or without) writing reads NaN.
    kv_pool.k_buffer[LAYER_ID][locs] = float("nan")
    kv_pool.v_buffer[LAYER_ID][locs] = float("nan")
    layer = RadixAttention(heads, head_dim, head_dim**-0.5, kv_heads, LAYER_ID, window,
                           attn_type)
    out, ref = run_both(fb, backend, layer, q, k, v)
    torch.testing.assert_close(kv_pool.k_buffer[LAYER_ID][locs],
                               k.view(-1, kv_heads, head_dim), rtol=0, atol=0)
    torch.testing.assert_close(kv_pool.v_buffer[LAYER_ID][locs],
                               v.view(-1, kv_heads, head_dim), rtol=0, atol=0)
    assert_close(out, ref, dtype, seed)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("num_kv_splits", [None, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("heads,kv_heads,head_dim", HEAD_CONFIGS)
@pytest.mark.parametrize("mode,q_len,attn_type", FIXED_MODES, ids=FIXED_IDS)
def test_fixed_layout_matches_torch_native(mode, q_len, attn_type, heads, kv_heads, head_dim,
                                           dtype, num_kv_splits, window):
    seed = fresh_seed()
    req_pool, kv_pool = make_pools(kv_heads, head_dim, dtype)
    backend = TritonAttnBackend(num_kv_splits=num_kv_splits)
    fb = fixed_layout_batch(mode, q_len, req_pool, kv_pool, backend)
    q, k, v = random_qkv(fb.num_tokens, heads, kv_heads, head_dim, dtype)
    layer = RadixAttention(heads, head_dim, 0.3, kv_heads, LAYER_ID, window, attn_type)
    out, ref = run_both(fb, backend, layer, q, k, v)
    live = fb.out_cache_loc != PADDING_SLOT
    assert torch.equal(kv_pool.k_buffer[LAYER_ID][fb.out_cache_loc[live]],
                       k.view(-1, kv_heads, head_dim)[live]), f"new K not written (seed {seed})"
    assert_close(out, ref, dtype, seed)


# In-kernel merge: contexts of 1 key, a short one, exactly one key tile (= MERGE_MIN_KEYS: one
# split), one key past it (two), three chunks of MERGE_MIN_KEYS and a long one whose chunks
# grow past it (MERGE_SPLITS splits at most).
MERGE_CONTEXTS = [1, 9, 64, 65, 129, 250]
MERGE_MIN_KEYS = 64
MERGE_SPLITS = 3
# (q heads, kv heads, head_dim): GQA ratios 1, 4 and 6 (Qwen2.5-1.5B's 12 over 2)
MERGE_HEAD_CONFIGS = [(2, 2, 32), (8, 2, 16), (12, 2, 16)]
# A window of 100 keys still splits a long context in two.
MERGE_WINDOWS = [FULL_CONTEXT, 100]


@pytest.mark.parametrize("window", MERGE_WINDOWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("heads,kv_heads,head_dim", MERGE_HEAD_CONFIGS)
@pytest.mark.parametrize("mode,q_len,attn_type", FIXED_MODES, ids=FIXED_IDS)
def test_in_kernel_merge_matches_torch_native(mode, q_len, attn_type, heads, kv_heads,
                                              head_dim, dtype, window):
    """One launch: short contexts unsplit, longer ones split and merged by their last split;
    equal to torch_native and to the split + merge-kernel path, padded rows included."""
    backend = TritonAttnBackend(num_kv_splits=MERGE_SPLITS, decode_merge="in_kernel",
                                min_split_keys=MERGE_MIN_KEYS)
    _assert_equal_to_native_and_split(backend, mode, q_len, attn_type, (heads, kv_heads, head_dim),
                               dtype, window)


def _assert_equal_to_native_and_split(backend, mode, q_len, attn_type, head_config, dtype, window):
    """`backend` over the MERGE_CONTEXTS batch == torch_native and == the split + merge-kernel
    path, padded rows included."""
    seed = fresh_seed()
    heads, kv_heads, head_dim = head_config
    req_pool, kv_pool = make_pools(kv_heads, head_dim, dtype)
    lens = [max(n, q_len) for n in MERGE_CONTEXTS]  # a request holds its q_len tokens
    fb = fixed_layout_batch(mode, q_len, req_pool, kv_pool, backend, lens)
    q, k, v = random_qkv(fb.num_tokens, heads, kv_heads, head_dim, dtype)
    layer = RadixAttention(heads, head_dim, 0.3, kv_heads, LAYER_ID, window, attn_type)
    out, ref = run_both(fb, backend, layer, q, k, v)
    assert_close(out, ref, dtype, seed)
    launch = TritonAttnBackend(num_kv_splits=MERGE_SPLITS)
    launch.init_forward_metadata(fb)
    assert_close(out, launch.forward(q, None, None, layer, fb, save_kv_cache=False), dtype,
                 seed)


# Single pass (a bench-only candidate): key tiles of 16 (16 steps over the 250-key context)
# and 64 with another warp count and pipeline depth.
SINGLE_PASS_TILES = [SinglePassTile(16, 2, 1), SinglePassTile(64, 8, 3)]


@pytest.mark.parametrize("tile", SINGLE_PASS_TILES, ids=lambda t: f"{t.block_n}")
@pytest.mark.parametrize("window", MERGE_WINDOWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("mode,q_len,attn_type", FIXED_MODES, ids=FIXED_IDS)
def test_single_pass_matches_torch_native_and_split(mode, q_len, attn_type, dtype, window,
                                                    tile):
    _assert_equal_to_native_and_split(TritonAttnBackend(single_pass=tile), mode, q_len, attn_type,
                               MERGE_HEAD_CONFIGS[2], dtype, window)


def test_single_pass_rejects_splits_and_bad_tiles():
    with pytest.raises(ValueError, match="power of two >= 16, got 48"):
        SinglePassTile(48)
    req_pool, kv_pool = make_pools(2, 32, torch.float32)
    backend = TritonAttnBackend(num_kv_splits=2, single_pass=SinglePassTile())
    fb = fixed_layout_batch(ForwardMode.DECODE, 1, req_pool, kv_pool, backend)
    layer = RadixAttention(4, 32, 1.0, 2, LAYER_ID)
    with pytest.raises(ValueError, match="single-pass tile takes no key split"):
        backend.forward(torch.randn(fb.num_tokens, 4 * 32), None, None, layer, fb,
                        save_kv_cache=False)


@pytest.mark.parametrize("merge", MERGE_MODES)
def test_decode_kernel_writes_every_row_and_repeats(merge):
    """Straight at the kernel with NaN-poisoned outputs, three times in a row: every row is
    written (the tile's merging split or its only split) and the arrival counters are back to
    zero after each launch (a stale count would skip or misplace the merge)."""
    seed = fresh_seed()
    heads, kv_heads, head_dim = MERGE_HEAD_CONFIGS[2]
    req_pool, kv_pool = make_pools(kv_heads, head_dim, torch.float32)
    fb = fixed_layout_batch(ForwardMode.TARGET_VERIFY, BLOCK, req_pool, kv_pool, None,
                            [max(n, BLOCK) for n in MERGE_CONTEXTS])
    q = torch.randn(fb.num_tokens, heads, head_dim)
    counters = SplitCounters()
    outs = []
    for _ in range(3):
        out = torch.full_like(q, float("nan"))
        decode_attention_fwd(q, kv_pool.k_buffer[LAYER_ID], kv_pool.v_buffer[LAYER_ID], out,
                             req_pool.req_to_token, fb.req_pool_indices, fb.seq_lens,
                             fb.positions, 0.3, True, MERGE_SPLITS, merge=merge,
                             counters=counters, min_split_keys=MERGE_MIN_KEYS)
        assert torch.isfinite(out).all(), f"rows left unwritten (seed {seed})"
        outs.append(out)
    for out in outs[1:]:
        assert torch.equal(out, outs[0]), f"a repeated launch differs (seed {seed})"


def test_in_kernel_merge_rejects_bad_settings():
    with pytest.raises(ValueError, match="decode_merge must be one of"):
        TritonAttnBackend(decode_merge="twice")
    req_pool, kv_pool = make_pools(2, 32, torch.float32)
    backend = TritonAttnBackend(num_kv_splits=2, decode_merge="in_kernel", min_split_keys=100)
    fb = fixed_layout_batch(ForwardMode.DECODE, 1, req_pool, kv_pool, backend)
    q = torch.randn(fb.num_tokens, 4 * 32)
    layer = RadixAttention(4, 32, 1.0, 2, LAYER_ID)
    with pytest.raises(ValueError, match="min_split_keys 100 is not a multiple of the 64"):
        backend.forward(q, None, None, layer, fb, save_kv_cache=False)


def test_decode_merge_flag_reaches_the_backend():
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser, serving=False)
    args = ServerArgs.from_cli_args(parser.parse_args(["--triton-attention-decode-merge",
                                                       "in_kernel"]))
    assert args.triton_attention_decode_merge == "in_kernel"
    assert ServerArgs().triton_attention_decode_merge == "launch"
    backend = make_attn_backend("triton", args.triton_attention_decode_merge)
    assert isinstance(backend, TritonAttnBackend) and backend.decode_merge == "in_kernel"
    with pytest.raises(ValueError, match="--triton-attention-decode-merge must be one of"):
        ServerArgs(triton_attention_decode_merge="fused")


@pytest.mark.parametrize("num_kv_splits,decode_merge", [(None, "launch"), (3, "launch"),
                                                        (3, "in_kernel")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("heads,kv_heads,head_dim", HEAD_CONFIGS)
def test_mixed_matches_torch_native(heads, kv_heads, head_dim, dtype, num_kv_splits,
                                    decode_merge):
    """A MIXED batch: three step requests of BLOCK tokens (a decode graph's padded row among
    them) through the fixed-layout kernel, then two arrivals and a padded one through the
    extend kernel at a row offset."""
    seed = fresh_seed()
    req_pool, kv_pool = make_pools(kv_heads, head_dim, dtype)
    backend = TritonAttnBackend(num_kv_splits=num_kv_splits, decode_merge=decode_merge,
                                min_split_keys=MERGE_MIN_KEYS)
    step_lens, arr_prefix, arr_ext = [10 + BLOCK, 130 + BLOCK], [0, 23], [9, 70]
    arr_lens = [p + e for p, e in zip(arr_prefix, arr_ext, strict=True)]
    rows = place_requests(req_pool, step_lens + arr_lens)
    step_rows, arr_rows = rows[:2] + [PADDING_REQ_ROW], rows[2:] + [PADDING_REQ_ROW]
    prefix = [n - BLOCK for n in step_lens] + [0] + arr_prefix + [0]
    ext = [BLOCK] * 3 + arr_ext + [0]
    seq_lens = [p + e for p, e in zip(prefix, ext, strict=True)]
    seq_lens[-1] = 1
    positions = torch.cat([torch.arange(p, p + e) for p, e in zip(prefix, ext, strict=True)])
    req_rows = step_rows + arr_rows
    locs = torch.cat([req_pool.req_to_token[r, p:p + e].long()
                      for r, p, e in zip(req_rows, prefix, ext, strict=True)])
    fb = make_batch(ForwardMode.MIXED, req_pool, kv_pool, req_rows, seq_lens, positions, locs,
                    backend, extend_lens=ext)
    ints = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    starts = [0]
    for e in ext[:-1]:
        starts.append(starts[-1] + e)
    fb.extend_prefix_lens, fb.extend_seq_lens = ints(prefix), ints(ext)
    fb.extend_start_loc = ints(starts)
    fb.mixed_step_bs, fb.mixed_step_width = 3, BLOCK
    q, k, v = random_qkv(fb.num_tokens, heads, kv_heads, head_dim, dtype)
    layer = RadixAttention(heads, head_dim, 0.3, kv_heads, LAYER_ID, FULL_CONTEXT, DECODER)
    out, ref = run_both(fb, backend, layer, q, k, v)
    assert_close(out, ref, dtype, seed)


@pytest.mark.parametrize("mode,q_len,attn_type", [*FIXED_MODES, (ForwardMode.EXTEND, 0, DECODER)],
                         ids=[*FIXED_IDS, "EXTEND"])
def test_keys_before_the_window_are_never_read(mode, q_len, attn_type):
    """K/V before every query's window are NaN: a kernel that loads them (and only masks
    them) turns NaN; one that starts its key loop at the window equals the reference computed
    before the poisoning."""
    seed = fresh_seed()
    heads, kv_heads, head_dim = HEAD_CONFIGS[0]
    window = 45
    req_pool, kv_pool = make_pools(kv_heads, head_dim, torch.float32)
    backend = TritonAttnBackend(num_kv_splits=3)
    if mode.is_extend():
        fb = extend_batch(req_pool, kv_pool, backend, [60, 100, 130], [1, 17, 70])
        first_pos = torch.tensor([60, 100, 130])
    else:
        fb = fixed_layout_batch(mode, q_len, req_pool, kv_pool, backend)
        first_pos = fb.positions.view(fb.batch_size, q_len)[:, 0]
    q, k, v = random_qkv(fb.num_tokens, heads, kv_heads, head_dim, torch.float32)
    layer = RadixAttention(heads, head_dim, 0.3, kv_heads, LAYER_ID, window, attn_type)
    fb.token_to_kv_pool.set_kv(LAYER_ID, fb.out_cache_loc, k.view(-1, kv_heads, head_dim),
                               v.view(-1, kv_heads, head_dim))
    reference = TorchNativeAttnBackend()
    reference.init_forward_metadata(fb)
    ref = reference.forward(q, None, None, layer, fb, save_kv_cache=False)
    for row, start in zip(fb.req_pool_indices.tolist(), first_pos.tolist(), strict=True):
        if row != PADDING_REQ_ROW and start > window:
            stale = req_pool.req_to_token[row, : start - window].long()
            kv_pool.k_buffer[LAYER_ID][stale] = float("nan")
            kv_pool.v_buffer[LAYER_ID][stale] = float("nan")
    backend.init_forward_metadata(fb)
    out = backend.forward(q, None, None, layer, fb, save_kv_cache=False)
    assert_close(out, ref, torch.float32, seed)


@pytest.mark.parametrize("decode_merge", MERGE_MODES)
def test_replay_reads_batch_tensors_in_place(decode_merge):
    """Graph-style reuse: the same ForwardBatch tensors, refreshed in place, give new results."""
    seed = fresh_seed()
    heads, kv_heads, head_dim = HEAD_CONFIGS[0]
    req_pool, kv_pool = make_pools(kv_heads, head_dim, torch.float32)
    backend = TritonAttnBackend(num_kv_splits=2, decode_merge=decode_merge,
                                min_split_keys=MERGE_MIN_KEYS)
    backend.init_cuda_graph_state(max_bs=len(FIXED_SEQ_LENS) + 2, max_num_tokens=64)
    fb = fixed_layout_batch(ForwardMode.TARGET_VERIFY, BLOCK, req_pool, kv_pool, backend)
    backend.init_forward_metadata_capture_cuda_graph(fb)
    layer = RadixAttention(heads, head_dim, 0.25, kv_heads, LAYER_ID)
    q, k, v = random_qkv(fb.num_tokens, heads, kv_heads, head_dim, torch.float32)
    first = backend.forward(q, k, v, layer, fb, save_kv_cache=False)
    # Shrink every live request by 3 tokens and move to fresh rows, as a new batch would.
    new_lens = [n - 3 for n in FIXED_SEQ_LENS[1:]]
    new_rows = place_requests(req_pool, new_lens)
    live = slice(1, len(FIXED_SEQ_LENS))
    fb.req_pool_indices[live] = torch.tensor(new_rows)
    fb.seq_lens[live] = torch.tensor(new_lens)
    fb.seq_lens_cpu.copy_(fb.seq_lens)
    fb.positions.view(-1, BLOCK)[live] = fb.seq_lens[live, None] - BLOCK + torch.arange(BLOCK)
    backend.init_forward_metadata_replay_cuda_graph(fb)
    second = backend.forward(q, k, v, layer, fb, save_kv_cache=False)
    assert not torch.allclose(first, second), "replay ignored the refreshed batch tensors"
    reference = TorchNativeAttnBackend()
    reference.init_forward_metadata(fb)
    assert_close(second, reference.forward(q, k, v, layer, fb, save_kv_cache=False),
                 torch.float32, seed)


@pytest.mark.parametrize("head_dim", [8, 48, 512])
def test_rejects_unsupported_head_dim(head_dim):
    req_pool, kv_pool = make_pools(1, 16, torch.float32)
    backend = TritonAttnBackend()
    fb = fixed_layout_batch(ForwardMode.DECODE, 1, req_pool, kv_pool, backend)
    q = torch.randn(fb.num_tokens, head_dim)
    layer = RadixAttention(1, head_dim, 1.0, 1, LAYER_ID)
    with pytest.raises(ValueError, match="power of two"):
        backend.forward(q, q, q, layer, fb, save_kv_cache=False)


def test_extend_split_leaves_padding_rows_zero():
    """A graph's EXTEND batch has query rows past every request (its token bucket): they come
    out 0 (finite) whether the key range is split (nobody writes their partial results; they
    merge to 0) or not, and the live rows of the split kernel equal the unsplit kernel's."""
    seed = fresh_seed()
    heads, kv_heads, head_dim = HEAD_CONFIGS[0]
    req_pool, kv_pool = make_pools(kv_heads, head_dim, torch.float32)
    backend = TritonAttnBackend()
    fb = extend_batch(req_pool, kv_pool, backend, [90, 40], [5, 3])
    meta = ExtendMetadata.build(fb)
    pad = 8  # a 16-token bucket holding 8 live rows
    q = torch.randn(fb.num_tokens + pad, heads, head_dim)
    k_buf, v_buf = kv_pool.k_buffer[LAYER_ID], kv_pool.v_buffer[LAYER_ID]
    outs = []
    for splits in (1, 3):
        out = torch.full_like(q, float("nan"))
        extend_attention_fwd(q, k_buf, v_buf, out, req_pool.req_to_token, fb.req_pool_indices,
                             meta.q_start, meta.prefix_lens, meta.extend_lens, 16, 0.3,
                             num_kv_splits=splits)
        outs.append(out)
    live = fb.num_tokens
    torch.testing.assert_close(outs[1][:live], outs[0][:live], rtol=1e-5, atol=1e-6,
                               msg=f"seed {seed}")
    for out in outs:
        assert torch.equal(out[live:], torch.zeros_like(q[live:])), f"seed {seed}"


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads,kv_heads,head_dim", HEAD_CONFIGS + [(6, 1, 16)])
def test_extend_packed_gqa_equals_per_head(heads, kv_heads, head_dim, causal, splits, window):
    """`pack_gqa`: a program per kv head whose tiles hold (token, query head) rows gives
    every live row of the per-head kernel (fp32: summation order alone may differ), its
    tiles ending mid-token and mid-window; padding rows stay 0."""
    seed = fresh_seed()
    req_pool, kv_pool = make_pools(kv_heads, head_dim, torch.float32)
    fb = extend_batch(req_pool, kv_pool, TritonAttnBackend(), EXTEND_PREFIX_LENS, EXTEND_LENS)
    meta = ExtendMetadata.build(fb)
    pad = 7
    q = torch.randn(fb.num_tokens + pad, heads, head_dim)
    k_buf, v_buf = kv_pool.k_buffer[LAYER_ID], kv_pool.v_buffer[LAYER_ID]
    outs = []
    for pack in (False, True):
        out = torch.full_like(q, float("nan"))
        extend_attention_fwd(q, k_buf, v_buf, out, req_pool.req_to_token, fb.req_pool_indices,
                             meta.q_start, meta.prefix_lens, meta.extend_lens,
                             meta.max_extend_len, 0.3, causal, window, num_kv_splits=splits,
                             pack_gqa=pack)
        outs.append(out)
    live = fb.num_tokens
    torch.testing.assert_close(outs[1][:live], outs[0][:live], rtol=1e-5, atol=1e-6,
                               msg=f"seed {seed}")
    assert torch.equal(outs[1][live:], torch.zeros_like(q[live:])), f"seed {seed}"


# A ragged step over a bucket of RAGGED_TOKENS tokens: a request verifying all BLOCK tokens,
# one verifying 1, two in between (contexts before the step short, long and past several
# key splits), then request slots of 0 tokens and three padding tokens.
RAGGED_PREFIX, RAGGED_LENS = [33, 126, 0, 196], [BLOCK, 1, 3, 2]
RAGGED_TOKENS = sum(RAGGED_LENS) + 3


def ragged_batch(req_pool, kv_pool, backend, prefix: list[int], lens: list[int],
                 num_tokens: int, max_requests: int = 0) -> ForwardBatch:
    """Rows of BLOCK tokens after `prefix` (so a static verify step of the same requests
    reads the same keys) verifying `lens` of them, token-major over `num_tokens` entries."""
    rows = place_requests(req_pool, [p + BLOCK for p in prefix])
    return ragged_verify_batch(req_pool, kv_pool, backend, rows, prefix, lens, num_tokens,
                               BLOCK, max_requests)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("num_kv_splits,decode_merge", [(None, "launch"), (3, "launch"),
                                                        (3, "in_kernel")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("heads,kv_heads,head_dim", HEAD_CONFIGS + MERGE_HEAD_CONFIGS[2:])
def test_ragged_verify_reads_each_request_once(heads, kv_heads, head_dim, dtype, num_kv_splits,
                                               decode_merge, window):
    """A ragged step through the request layout equals the same step per token (today's
    path without `fb.ragged`), torch_native, and the static layout's rows of the same
    requests; rows of no request come out 0, and 0-token slots write nothing."""
    seed = fresh_seed()
    req_pool, kv_pool = make_pools(kv_heads, head_dim, dtype)
    backend = TritonAttnBackend(num_kv_splits=num_kv_splits, decode_merge=decode_merge,
                                min_split_keys=MERGE_MIN_KEYS)
    fb = ragged_batch(req_pool, kv_pool, backend, RAGGED_PREFIX, RAGGED_LENS, RAGGED_TOKENS)
    live = sum(RAGGED_LENS)
    assert fb.ragged.lens.tolist() == RAGGED_LENS + [0] * (RAGGED_TOKENS - 4)
    static = fixed_layout_batch(ForwardMode.TARGET_VERIFY, BLOCK, req_pool, kv_pool, backend,
                                [p + BLOCK for p in RAGGED_PREFIX])
    static.req_pool_indices[:4] = fb.ragged.request_rows[:4]
    q_static, k, v = random_qkv(static.num_tokens, heads, kv_heads, head_dim, dtype)
    # the static rows of each request's verified tokens, in the ragged step's order
    picked = torch.cat([torch.arange(r * BLOCK, r * BLOCK + n) for r, n in enumerate(RAGGED_LENS)])
    q = torch.cat([q_static[picked], torch.randn(RAGGED_TOKENS - live, q_static.shape[1])
                   .to(dtype)])
    layer = RadixAttention(heads, head_dim, 0.3, kv_heads, LAYER_ID, window, DECODER)
    backend.init_forward_metadata(fb)
    out = backend.forward(q, None, None, layer, fb, save_kv_cache=False)
    assert torch.equal(out[live:], torch.zeros_like(out[live:])), f"padding rows (seed {seed})"
    out = out[:live]
    per_token = TritonAttnBackend(num_kv_splits=num_kv_splits)
    fb_per_token = dataclasses.replace(fb, ragged=None)
    per_token.init_forward_metadata(fb_per_token)
    assert_close(out, per_token.forward(q, None, None, layer, fb_per_token,
                                        save_kv_cache=False)[:live], dtype, seed)
    reference = TorchNativeAttnBackend()
    reference.init_forward_metadata(fb)
    assert_close(out, reference.forward(q, None, None, layer, fb, save_kv_cache=False)[:live],
                 dtype, seed)
    backend.init_forward_metadata(static)
    want = backend.forward(q_static, None, None, layer, static, save_kv_cache=False)
    assert_close(out, want[picked], dtype, seed)


@pytest.mark.parametrize("num_kv_splits,decode_merge", [(None, "launch"), (3, "launch"),
                                                        (3, "in_kernel")])
def test_ragged_slots_bounded_to_the_most_requests_change_nothing(num_kv_splits, decode_merge):
    """Request slots for no more requests than a step holds (`max_requests`: the programs of
    slots no request can take are not launched) give the same output, bit for bit."""
    heads, kv_heads, head_dim = MERGE_HEAD_CONFIGS[2]
    seed = fresh_seed()
    req_pool, kv_pool = make_pools(kv_heads, head_dim, torch.float32)
    backend = TritonAttnBackend(num_kv_splits=num_kv_splits, decode_merge=decode_merge,
                                min_split_keys=MERGE_MIN_KEYS)
    fb = ragged_batch(req_pool, kv_pool, backend, RAGGED_PREFIX, RAGGED_LENS, RAGGED_TOKENS)
    r = len(RAGGED_LENS)
    # the prologue's bounded slots are the leading slots of the unbounded ones
    bounded = ragged_batch(*make_pools(kv_heads, head_dim, torch.float32), backend,
                           RAGGED_PREFIX, RAGGED_LENS, RAGGED_TOKENS, max_requests=r).ragged
    assert bounded.lens.shape[0] == r and bounded.width == fb.ragged.width
    for name in ("lens", "prefix_lens", "q_start"):
        assert torch.equal(getattr(bounded, name), getattr(fb.ragged, name)[:r]), name
    q = torch.randn(RAGGED_TOKENS, heads * head_dim)
    layer = RadixAttention(heads, head_dim, 0.3, kv_heads, LAYER_ID, -1, DECODER)
    outs = []
    for slots in (RAGGED_TOKENS, r):
        batch = dataclasses.replace(fb, ragged=RaggedRequests(
            **{name: getattr(fb.ragged, name)[:slots]
               for name in ("request_rows", "lens", "prefix_lens", "q_start")},
            width=fb.ragged.width))
        backend.init_forward_metadata(batch)
        outs.append(backend.forward(q, None, None, layer, batch, save_kv_cache=False))
    assert torch.equal(outs[0], outs[1]), f"seed {seed}"
    assert outs[1][: sum(RAGGED_LENS)].abs().sum() > 0


def test_ragged_slots_of_no_tokens_store_nothing():
    """Straight at the kernel: with every slot at 0 tokens the NaN-poisoned output is only
    zeroed (a memset, no program stores), and one live request writes its rows alone."""
    heads, kv_heads, head_dim = MERGE_HEAD_CONFIGS[2]
    req_pool, kv_pool = make_pools(kv_heads, head_dim, torch.float32)
    fb = ragged_batch(req_pool, kv_pool, None, [70], [3], 8)
    q = torch.randn(8, heads, head_dim)
    args = (kv_pool.k_buffer[LAYER_ID], kv_pool.v_buffer[LAYER_ID])
    for merge in MERGE_MODES:
        out = torch.full_like(q, float("nan"))
        decode_attention_fwd(q, *args, out, req_pool.req_to_token, fb.ragged.request_rows,
                             fb.seq_lens, fb.positions, 0.3, True, 2, merge=merge,
                             counters=SplitCounters(), min_split_keys=MERGE_MIN_KEYS,
                             ragged=fb.ragged)
        assert torch.isfinite(out).all() and out[:3].abs().sum() > 0, merge
        assert torch.equal(out[3:], torch.zeros_like(out[3:])), merge
    fb.ragged.lens.zero_()
    out = torch.full_like(q, float("nan"))
    decode_attention_fwd(q, *args, out, req_pool.req_to_token, fb.ragged.request_rows,
                         fb.seq_lens, fb.positions, 0.3, True, 1, ragged=fb.ragged)
    assert torch.equal(out, torch.zeros_like(out))


def test_extend_cannot_be_captured():
    req_pool, kv_pool = make_pools(2, 16, torch.float32)
    backend = TritonAttnBackend()
    fb = fixed_layout_batch(ForwardMode.DECODE, 1, req_pool, kv_pool, backend)
    fb.forward_mode = ForwardMode.EXTEND
    with pytest.raises(ValueError, match="captured"):
        backend.init_forward_metadata_capture_cuda_graph(fb)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
