"""TritonAttnBackend on CUDA: bf16/fp16 against TorchNativeAttnBackend, CUDA-graph replay.

Larger shapes than the CPU interpreter test: contexts up to 2k, batches up to 32, head_dim
64 and 128, automatic key splits, causal and bidirectional layers, sliding windows (checked,
replayed in graphs, and timed: at 16k context a windowed layer must beat a full one), the
in-kernel merge (graphs captured at short contexts replayed up to the maximum), a ragged verify
step (compact verify: each request's keys read once for its own number of tokens, one graph per
token bucket replayed for other splits of its tokens). Fresh
random inputs every run (the seed is in every failure message). Run this file in its own
process: under TRITON_INTERPRET=1 (set by the CPU test) the kernels would be interpreted, so
the tests skip.
"""

import os
import sys

import pytest
import torch

from sglang_aux.srt.configs.decoder_config import FULL_CONTEXT, AttentionType
from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch, ForwardMode
from sglang_aux.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang_aux.srt.layers.radix_attention import RadixAttention
from sglang_aux.srt.mem_cache.memory_pool import (
    PADDING_REQ_ROW,
    PADDING_SLOT,
    MHATokenToKVPool,
    ReqToTokenPool,
)
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.kernel_checks import fresh_seed
from sglang_aux.test.ragged_steps import ragged_verify_batch

try:
    import triton

    from sglang_aux.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang_aux.srt.layers.attention.triton_ops.tiling import MIN_SPLIT_KEYS, SinglePassTile
except ImportError:  # no triton: the skip below says why
    triton = None

register_cuda_ci(est_time=420, suite="default")

pytestmark = pytest.mark.skipif(
    triton is None or not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs CUDA and compiled (not interpreted) Triton kernels",
)

DEVICE = "cuda"
# Max |triton - torch_native| over max |torch_native|; both round P, K and V to 16 bits.
REL_ERR_BOUND = 2e-2
DTYPES = [torch.bfloat16, torch.float16]
NUM_LAYERS = 2
LAYER_ID = 1
MAX_CONTEXT = 2048
NUM_REQ_ROWS = 96
# (q heads, kv heads, head_dim): SmolLM2-135M's layout and a Llama-8B-like one
HEAD_CONFIGS = [(9, 3, 64), (32, 8, 128)]
DECODER, ENCODER_ONLY = AttentionType.DECODER, AttentionType.ENCODER_ONLY
# (mode, tokens per request, layer type): DFlash draft layers are bidirectional in the block,
# or causal (sliding_attention layers)
FIXED_MODES = [(ForwardMode.DECODE, 1, DECODER), (ForwardMode.TARGET_VERIFY, 8, DECODER),
               (ForwardMode.DRAFT_BLOCK, 16, ENCODER_ONLY),
               (ForwardMode.DRAFT_BLOCK, 16, DECODER)]
FIXED_MODE_IDS = [f"{mode.name}-{t.name}" for mode, _, t in FIXED_MODES]
WINDOW = 255  # keys left of the query a sliding layer sees (HF sliding_window 256)


def make_pools(num_slots: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
               max_context: int = MAX_CONTEXT):
    req_pool = ReqToTokenPool(NUM_REQ_ROWS, max_context, DEVICE)
    kv_pool = MHATokenToKVPool(num_slots, NUM_LAYERS, num_kv_heads, head_dim, dtype, DEVICE)
    for buf in (*kv_pool.k_buffer, *kv_pool.v_buffer):  # padding slot included
        buf.normal_()
    return req_pool, kv_pool


def place_requests(req_pool: ReqToTokenPool, num_slots: int, lens: list[int]) -> list[int]:
    """Allocates a row per request and maps its positions to scattered, distinct slots."""
    slots = (torch.randperm(num_slots)[: sum(lens)] + 1).to(DEVICE)  # never the padding slot
    rows = [req_pool.alloc() for _ in lens]
    for row, chunk in zip(rows, slots.split(lens), strict=True):
        req_pool.write(row, 0, chunk)
    return rows


def random_lens(bs: int, low: int, high: int = MAX_CONTEXT) -> list[int]:
    """Fresh lengths in [low, high], always including both ends."""
    lens = torch.randint(low, high + 1, (bs,)).tolist()
    lens[0] = high
    if bs > 1:
        lens[-1] = low
    return lens


def fixed_layout_tensors(req_pool: ReqToTokenPool, rows: list[int], lens: list[int],
                         q_len: int, num_padded: int) -> dict[str, torch.Tensor]:
    """Request-major tensors for live requests (last `q_len` tokens new), then padded rows."""
    positions, locs = [], []
    for row, n in zip(rows, lens, strict=True):
        positions.append(torch.arange(n - q_len, n, device=DEVICE))
        locs.append(req_pool.req_to_token[row, n - q_len : n].long())
    pad = num_padded * q_len
    seq_lens = torch.tensor(lens + [1] * num_padded, device=DEVICE)
    return dict(
        req_pool_indices=torch.tensor(rows + [PADDING_REQ_ROW] * num_padded, device=DEVICE),
        seq_lens=seq_lens, seq_lens_cpu=seq_lens.cpu(),
        positions=torch.cat([*positions, torch.zeros(pad, dtype=torch.int64, device=DEVICE)]),
        out_cache_loc=torch.cat(
            [*locs, torch.full((pad,), PADDING_SLOT, dtype=torch.int64, device=DEVICE)]),
    )


def make_batch(mode: ForwardMode, req_pool, kv_pool, backend, tensors: dict[str, torch.Tensor],
               prefix_lens: list[int] | None = None,
               extend_lens: list[int] | None = None) -> ForwardBatch:
    num_tokens = tensors["positions"].numel()
    return ForwardBatch(
        forward_mode=mode, batch_size=tensors["req_pool_indices"].numel(),
        input_ids=torch.zeros(num_tokens, dtype=torch.int64, device=DEVICE),
        req_to_token_pool=req_pool, token_to_kv_pool=kv_pool, attn_backend=backend,
        extend_prefix_lens_cpu=prefix_lens, extend_seq_lens_cpu=extend_lens, **tensors,
    )


def random_qkv(num_tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
    return tuple(torch.randn(num_tokens, n * head_dim, device=DEVICE, dtype=dtype)
                 for n in (heads, kv_heads, kv_heads))


def reference(fb: ForwardBatch, layer, q, k, v) -> torch.Tensor:
    """torch_native over the pool as it stands (the Triton call already wrote the new K/V)."""
    backend = TorchNativeAttnBackend()
    backend.init_forward_metadata(fb)
    return backend.forward(q, k, v, layer, fb, save_kv_cache=False)


def assert_close(out: torch.Tensor, ref: torch.Tensor, seed: int, what: str) -> None:
    assert out.dtype == ref.dtype, (out.dtype, ref.dtype)
    assert torch.isfinite(out).all(), f"{what}: non-finite triton output (seed {seed})"
    assert torch.isfinite(ref).all(), f"{what}: non-finite reference output (seed {seed})"
    err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    assert err < REL_ERR_BOUND, f"{what}: rel err {err:.2e} (seed {seed})"


def assert_kv_written(kv_pool, fb: ForwardBatch, k: torch.Tensor, seed: int) -> None:
    live = fb.out_cache_loc != PADDING_SLOT
    stored = kv_pool.k_buffer[LAYER_ID][fb.out_cache_loc[live]]  # [live tokens, KVH, D]
    expected = k.view(-1, *stored.shape[1:])[live]
    assert torch.equal(stored, expected), f"new K not at out_cache_loc (seed {seed})"


# (prefix, new tokens) per request: mixed long prefills (one key split at most), and arrivals
# after a long cached prefix (few query tiles: the key range is split and merged)
EXTEND_SHAPES = {"mixed": ([0, 1500, 37, 700, 1024, 5, 300, 1],
                           [513, 1, 200, 64, 1024, 77, 129, 16]),
                 "cached": ([700, 1500, 650], [80, 9, 100])}


@pytest.mark.parametrize("window,attn_type", [(FULL_CONTEXT, DECODER), (WINDOW, DECODER),
                                               (WINDOW, ENCODER_ONLY)])
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("heads,kv_heads,head_dim", HEAD_CONFIGS)
@pytest.mark.parametrize("shape", EXTEND_SHAPES)
def test_extend_matches_torch_native(shape, heads, kv_heads, head_dim, dtype, window,
                                     attn_type):
    seed = fresh_seed()
    prefix_lens, extend_lens = EXTEND_SHAPES[shape]
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    num_slots = sum(seq_lens) + 64
    req_pool, kv_pool = make_pools(num_slots, kv_heads, head_dim, dtype)
    rows = place_requests(req_pool, num_slots, seq_lens)
    locs = torch.cat([req_pool.req_to_token[r, p:n].long()
                      for r, p, n in zip(rows, prefix_lens, seq_lens, strict=True)])
    seq_lens_t = torch.tensor(seq_lens, device=DEVICE)
    tensors = dict(
        req_pool_indices=torch.tensor(rows, device=DEVICE), seq_lens=seq_lens_t,
        seq_lens_cpu=seq_lens_t.cpu(), out_cache_loc=locs,
        positions=torch.cat([torch.arange(p, n, device=DEVICE)
                             for p, n in zip(prefix_lens, seq_lens, strict=True)]),
    )
    backend = TritonAttnBackend()
    fb = make_batch(ForwardMode.EXTEND, req_pool, kv_pool, backend, tensors, prefix_lens,
                    extend_lens)
    q, k, v = random_qkv(locs.numel(), heads, kv_heads, head_dim, dtype)
    kv_pool.k_buffer[LAYER_ID][locs] = float("nan")  # attending before writing would read NaN
    kv_pool.v_buffer[LAYER_ID][locs] = float("nan")
    layer = RadixAttention(heads, head_dim, head_dim**-0.5, kv_heads, LAYER_ID, window,
                           attn_type)
    backend.init_forward_metadata(fb)
    out = backend.forward(q, k, v, layer, fb, save_kv_cache=True)
    assert_kv_written(kv_pool, fb, k, seed)
    assert_close(out, reference(fb, layer, q, k, v), seed, f"EXTEND window {window}")


# (bs, key splits, window): every batch shape with full layers; windows on a split and an
# unsplit shape (each window is another compiled kernel, so not the whole grid again)
FIXED_SHAPES = [(bs, splits, FULL_CONTEXT) for bs in (1, 7, 32) for splits in (None, 1)] + [
    (7, None, WINDOW), (32, 1, WINDOW)]


@pytest.mark.parametrize("bs,num_kv_splits,window", FIXED_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("heads,kv_heads,head_dim", HEAD_CONFIGS)
@pytest.mark.parametrize("mode,q_len,attn_type", FIXED_MODES, ids=FIXED_MODE_IDS)
def test_fixed_layout_matches_torch_native(mode, q_len, attn_type, heads, kv_heads, head_dim,
                                           dtype, bs, num_kv_splits, window):
    seed = fresh_seed()
    num_live = max(bs - 1, 1)  # the last row is padding whenever there is room for it
    lens = random_lens(num_live, q_len)
    num_slots = sum(lens) + 64
    req_pool, kv_pool = make_pools(num_slots, kv_heads, head_dim, dtype)
    rows = place_requests(req_pool, num_slots, lens)
    backend = TritonAttnBackend(num_kv_splits=num_kv_splits)
    tensors = fixed_layout_tensors(req_pool, rows, lens, q_len, bs - num_live)
    fb = make_batch(mode, req_pool, kv_pool, backend, tensors)
    q, k, v = random_qkv(fb.num_tokens, heads, kv_heads, head_dim, dtype)
    layer = RadixAttention(heads, head_dim, head_dim**-0.5, kv_heads, LAYER_ID, window,
                           attn_type)
    backend.init_forward_metadata(fb)
    out = backend.forward(q, k, v, layer, fb, save_kv_cache=True)
    assert_kv_written(kv_pool, fb, k, seed)
    assert_close(out, reference(fb, layer, q, k, v), seed, f"{mode.name} window {window}")


# None: today's split + merge; a single-pass candidate's tile (block_n, warps, stages;
# bench-only, docs/kernels.md)
SINGLE_PASS = [None, (128, 8, 2)]


@pytest.mark.parametrize("single_pass", SINGLE_PASS, ids=["split", "single128"])
@pytest.mark.parametrize("window", [FULL_CONTEXT, WINDOW])
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("mode,q_len,attn_type", FIXED_MODES, ids=FIXED_MODE_IDS)
def test_cuda_graph_replay_matches_torch_native(mode, q_len, attn_type, dtype, window,
                                                single_pass):
    """Capture once over static batch tensors; refresh them in place; every replay matches."""
    seed = fresh_seed()
    heads, kv_heads, head_dim = HEAD_CONFIGS[1]
    bs, num_slots = 8, 8 * MAX_CONTEXT * 4
    req_pool, kv_pool = make_pools(num_slots, kv_heads, head_dim, dtype)
    backend = TritonAttnBackend(single_pass=single_pass and SinglePassTile(*single_pass))
    backend.init_cuda_graph_state(max_bs=bs, max_num_tokens=bs * q_len)
    lens = random_lens(bs - 1, q_len)
    static = fixed_layout_tensors(req_pool, place_requests(req_pool, num_slots, lens), lens,
                                  q_len, num_padded=1)
    fb = make_batch(mode, req_pool, kv_pool, backend, static)
    q, k, v = random_qkv(fb.num_tokens, heads, kv_heads, head_dim, dtype)
    layer = RadixAttention(heads, head_dim, head_dim**-0.5, kv_heads, LAYER_ID, window,
                           attn_type)

    graph, out = capture_forward(backend, fb, layer, q, k, v)
    for num_live in (bs - 1, 3, 1):  # new requests, rows and lengths; the rest padded
        lens = random_lens(num_live, q_len)
        rows = place_requests(req_pool, num_slots, lens)
        for name, t in fixed_layout_tensors(req_pool, rows, lens, q_len,
                                            bs - num_live).items():
            static[name].copy_(t)
        for t, fresh in zip((q, k, v), random_qkv(fb.num_tokens, heads, kv_heads, head_dim,
                                                  dtype), strict=True):
            t.copy_(fresh)
        backend.init_forward_metadata_replay_cuda_graph(fb)
        out.fill_(float("nan"))  # poison: a replay that skips the kernel leaves NaN
        graph.replay()
        torch.cuda.synchronize()
        assert_kv_written(kv_pool, fb, k, seed)
        assert_close(out.clone(), reference(fb, layer, q, k, v), seed,
                     f"{mode.name} window {window} replay with {num_live} live")
        for row in rows:
            req_pool.free(row)


def capture_forward(backend, fb: ForwardBatch, layer, q, k, v):
    """A graph of one forward over static tensors (warm-ups first, as the graph runner does:
    they compile the kernels and size the in-kernel merge's counters) and its static output."""
    backend.init_forward_metadata_capture_cuda_graph(fb)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            backend.forward(q, k, v, layer, fb, save_kv_cache=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(q, k, v, layer, fb, save_kv_cache=True)
    return graph, out


QWEN_HEADS = (12, 2, 128)  # Qwen2.5-1.5B: GQA ratio 6
MERGE_BATCH_SIZES = (1, 8, 32)
MERGE_MODES_IDS = ["DECODE", "TARGET_VERIFY-16"]
MERGE_FIXED_MODES = [FIXED_MODES[0], (ForwardMode.TARGET_VERIFY, 16, DECODER)]


def merge_base_lens() -> list[int]:
    """Lengths every in-kernel merge check covers: one key tile, the split threshold (one
    split) and one key past it (two), the issue's 900-token context, the pool's maximum."""
    return [64, MIN_SPLIT_KEYS, MIN_SPLIT_KEYS + 1, 900, MAX_CONTEXT]


def merge_lens(num_live: int, q_len: int, shift: int = 0) -> list[int]:
    """merge_base_lens() rotated by `shift` (so one request replays each in turn), then fresh
    random lengths, each at least q_len."""
    base = merge_base_lens()
    base = base[shift:] + base[:shift]
    extra = torch.randint(1, MAX_CONTEXT + 1, (max(num_live - len(base), 0),)).tolist()
    return [max(n, q_len) for n in (base + extra)[:num_live]]


@pytest.mark.parametrize("window", [FULL_CONTEXT, WINDOW])
@pytest.mark.parametrize("bs", MERGE_BATCH_SIZES)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [QWEN_HEADS, HEAD_CONFIGS[0]])
@pytest.mark.parametrize("mode,q_len,attn_type", FIXED_MODES, ids=FIXED_MODE_IDS)
def test_in_kernel_merge_matches_torch_native(mode, q_len, attn_type, heads, kv_heads,
                                              head_dim, bs, window):
    """One launch (short contexts unsplit, long ones merged by their last split) equals
    torch_native and the split + merge-kernel path, a padded row included; each of
    merge_base_lens() is the first request's once."""
    seed = fresh_seed()
    num_live = max(bs - 1, 1)
    num_slots = num_live * MAX_CONTEXT + 64
    req_pool, kv_pool = make_pools(num_slots, kv_heads, head_dim, torch.bfloat16)
    backend, launch = TritonAttnBackend(decode_merge="in_kernel"), TritonAttnBackend()
    layer = RadixAttention(heads, head_dim, head_dim**-0.5, kv_heads, LAYER_ID, window,
                           attn_type)
    for shift in range(len(merge_base_lens())):
        lens = merge_lens(num_live, q_len, shift)
        rows = place_requests(req_pool, num_slots, lens)
        fb = make_batch(mode, req_pool, kv_pool, backend,
                        fixed_layout_tensors(req_pool, rows, lens, q_len, bs - num_live))
        q, k, v = random_qkv(fb.num_tokens, heads, kv_heads, head_dim, torch.bfloat16)
        backend.init_forward_metadata(fb)
        out = backend.forward(q, k, v, layer, fb, save_kv_cache=True)
        what = f"in-kernel {mode.name} bs {bs} window {window} lens {lens[:5]}"
        assert_close(out, reference(fb, layer, q, k, v), seed, what)
        assert_close(out, launch.forward(q, k, v, layer, fb, save_kv_cache=False), seed,
                     what + " vs merge kernel")
        for row in rows:
            req_pool.free(row)


@pytest.mark.parametrize("mode,q_len,attn_type", MERGE_FIXED_MODES, ids=MERGE_MODES_IDS)
def test_in_kernel_merge_graph_replay_equals_eager(mode, q_len, attn_type):
    """Graphs captured at every size with short contexts only (smallest first, so the split
    counters grow between captures), then each replayed full and padded at lengths up to the
    pool's maximum: bitwise equal to the eager forward of the same inputs (same grid, same
    merge order) and close to torch_native."""
    seed = fresh_seed()
    heads, kv_heads, head_dim = QWEN_HEADS
    dtype = torch.bfloat16
    num_slots = max(MERGE_BATCH_SIZES) * MAX_CONTEXT + 64
    req_pool, kv_pool = make_pools(num_slots, kv_heads, head_dim, dtype)
    backend = TritonAttnBackend(decode_merge="in_kernel")
    backend.init_cuda_graph_state(max_bs=max(MERGE_BATCH_SIZES),
                                  max_num_tokens=max(MERGE_BATCH_SIZES) * q_len)
    layer = RadixAttention(heads, head_dim, head_dim**-0.5, kv_heads, LAYER_ID, FULL_CONTEXT,
                           attn_type)
    captured = []
    for bs in MERGE_BATCH_SIZES:
        lens = [q_len + 3] * bs
        rows = place_requests(req_pool, num_slots, lens)
        static = fixed_layout_tensors(req_pool, rows, lens, q_len, num_padded=0)
        fb = make_batch(mode, req_pool, kv_pool, backend, static)
        qkv = random_qkv(fb.num_tokens, heads, kv_heads, head_dim, dtype)
        captured.append((bs, static, fb, qkv, *capture_forward(backend, fb, layer, *qkv)))
        for row in rows:
            req_pool.free(row)

    for bs, static, fb, (q, k, v), graph, out in captured:
        for num_live in sorted({bs, max(bs - 3, 1)}, reverse=True):
            for shift in range(len(merge_base_lens())):
                lens = merge_lens(num_live, q_len, shift)
                rows = place_requests(req_pool, num_slots, lens)
                for name, t in fixed_layout_tensors(req_pool, rows, lens, q_len,
                                                    bs - num_live).items():
                    static[name].copy_(t)
                for t, fresh in zip((q, k, v), random_qkv(fb.num_tokens, heads, kv_heads,
                                                          head_dim, dtype), strict=True):
                    t.copy_(fresh)
                backend.init_forward_metadata_replay_cuda_graph(fb)
                out.fill_(float("nan"))
                graph.replay()
                torch.cuda.synchronize()
                replayed = out.clone()
                what = f"{mode.name} graph bs {bs}, {num_live} live, lens {lens[:5]}"
                eager = backend.forward(q, k, v, layer, fb, save_kv_cache=False)
                assert torch.equal(replayed, eager), f"{what}: replay != eager (seed {seed})"
                assert_close(replayed, reference(fb, layer, q, k, v), seed, what)
                for row in rows:
                    req_pool.free(row)


def test_decode_faster_than_torch_native():
    """Reasonable speed: bs 32 at 2k context, the decode shape that matters most."""
    seed = fresh_seed()
    heads, kv_heads, head_dim = HEAD_CONFIGS[1]
    bs, dtype = 32, torch.bfloat16
    lens = [MAX_CONTEXT] * bs
    num_slots = sum(lens) + 64
    req_pool, kv_pool = make_pools(num_slots, kv_heads, head_dim, dtype)
    rows = place_requests(req_pool, num_slots, lens)
    backend = TritonAttnBackend()
    fb = make_batch(ForwardMode.DECODE, req_pool, kv_pool, backend,
                    fixed_layout_tensors(req_pool, rows, lens, 1, num_padded=0))
    q, k, v = random_qkv(bs, heads, kv_heads, head_dim, dtype)
    layer = RadixAttention(heads, head_dim, head_dim**-0.5, kv_heads, LAYER_ID)
    native = TorchNativeAttnBackend()
    triton_ms = triton.testing.do_bench(
        lambda: backend.forward(q, k, v, layer, fb, save_kv_cache=False), return_mode="median")
    native_ms = triton.testing.do_bench(
        lambda: native.forward(q, k, v, layer, fb, save_kv_cache=False), return_mode="median")
    kv_bytes = 2 * bs * MAX_CONTEXT * kv_heads * head_dim * dtype.itemsize
    print(f"\ndecode bs={bs} ctx={MAX_CONTEXT}: triton {triton_ms * 1e3:.1f} us, torch_native "
          f"{native_ms * 1e3:.1f} us, K/V roofline {kv_bytes / 4.3e12 * 1e6:.1f} us")
    assert triton_ms < native_ms, f"triton {triton_ms:.3f} ms >= native {native_ms:.3f} ms"
    assert_close(backend.forward(q, k, v, layer, fb, save_kv_cache=False),
                 native.forward(q, k, v, layer, fb, save_kv_cache=False), seed, "bench")


LONG_CONTEXT = 16384
LONG_WINDOW = 1023
# A windowed layer reads LONG_WINDOW + 1 of LONG_CONTEXT keys per query (decode) or about that
# many per prefill query instead of half the context; these bounds leave room for launch costs.
MIN_DECODE_SPEEDUP = 3.0
MIN_EXTEND_SPEEDUP = 2.0


def test_sliding_window_skips_keys_at_long_context():
    """Keys before the window are skipped, not only masked: at 16k context a layer with a
    1k window decodes (bs 32) and prefills (one 8k prompt) clearly faster than a full one,
    and still equals torch_native."""
    seed = fresh_seed()
    heads, kv_heads, head_dim = HEAD_CONFIGS[1]
    bs, dtype = 32, torch.bfloat16
    lens = [LONG_CONTEXT] * bs
    num_slots = sum(lens) + 64
    req_pool, kv_pool = make_pools(num_slots, kv_heads, head_dim, dtype, LONG_CONTEXT)
    rows = place_requests(req_pool, num_slots, lens)
    backend = TritonAttnBackend()
    decode = make_batch(ForwardMode.DECODE, req_pool, kv_pool, backend,
                        fixed_layout_tensors(req_pool, rows, lens, 1, num_padded=0))
    prompt = LONG_CONTEXT // 2
    locs = req_pool.req_to_token[rows[0], :prompt].long()
    positions = torch.arange(prompt, device=DEVICE)
    seq = torch.tensor([prompt], device=DEVICE)
    extend = make_batch(ForwardMode.EXTEND, req_pool, kv_pool, backend, dict(
        req_pool_indices=torch.tensor(rows[:1], device=DEVICE), seq_lens=seq,
        seq_lens_cpu=seq.cpu(), out_cache_loc=locs, positions=positions), [0], [prompt])
    full = RadixAttention(heads, head_dim, head_dim**-0.5, kv_heads, LAYER_ID)
    windowed = RadixAttention(heads, head_dim, head_dim**-0.5, kv_heads, LAYER_ID, LONG_WINDOW)
    report = []
    for fb, min_speedup in ((decode, MIN_DECODE_SPEEDUP), (extend, MIN_EXTEND_SPEEDUP)):
        q, k, v = random_qkv(fb.num_tokens, heads, kv_heads, head_dim, dtype)
        backend.init_forward_metadata(fb)
        ms = {layer.sliding_window_size: _median_ms(backend, fb, layer, q, k, v)
              for layer in (full, windowed)}
        report.append(f"{fb.forward_mode.name}: full {ms[FULL_CONTEXT] * 1e3:.0f} us, window "
                      f"{LONG_WINDOW + 1}: {ms[LONG_WINDOW] * 1e3:.0f} us")
        assert ms[LONG_WINDOW] * min_speedup < ms[FULL_CONTEXT], report[-1]
        assert_close(backend.forward(q, k, v, windowed, fb, save_kv_cache=False),
                     reference(fb, windowed, q, k, v), seed, f"{fb.forward_mode.name} window")
    print(f"\nctx {LONG_CONTEXT}, bs {bs} decode / one {prompt}-token prefill: "
          + "; ".join(report))


def _median_ms(backend, fb: ForwardBatch, layer, q, k, v) -> float:
    return triton.testing.do_bench(
        lambda: backend.forward(q, k, v, layer, fb, save_kv_cache=False), return_mode="median")


RAGGED_WIDTH = 16  # Qwen2.5-1.5B's draft block: the verify width


def ragged_lens(num_reqs: int, num_tokens: int) -> list[int]:
    """Fresh verify lengths in [1, RAGGED_WIDTH] summing to at most `num_tokens`: the first
    request verifies the whole width, the last (of several) 1 token."""
    lens = torch.randint(1, RAGGED_WIDTH + 1, (num_reqs,)).tolist()
    lens[0] = RAGGED_WIDTH
    if num_reqs > 1:
        lens[-1] = 1
    while sum(lens) > num_tokens:
        i = max(range(num_reqs), key=lambda j: lens[j])
        lens[i] -= 1
    return lens


@pytest.mark.parametrize("decode_merge", ["launch", "in_kernel"])
@pytest.mark.parametrize("window", [FULL_CONTEXT, WINDOW])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [QWEN_HEADS, *HEAD_CONFIGS])
def test_ragged_verify_graph_matches_torch_native(heads, kv_heads, head_dim, window,
                                                  decode_merge):
    """One graph per token bucket: captured over a ragged step of 32 requests, replayed for
    32, 8 and 1 requests of fresh verify lengths (0-token slots and padding tokens after
    them) at contexts up to the maximum; each replay equals torch_native, and rows of no
    request come out 0."""
    seed = fresh_seed()
    dtype = torch.bfloat16
    num_tokens, num_slots = 32 * RAGGED_WIDTH // 2, 32 * MAX_CONTEXT + 1
    req_pool, kv_pool = make_pools(num_slots, kv_heads, head_dim, dtype)
    backend = TritonAttnBackend(decode_merge=decode_merge)
    layer = RadixAttention(heads, head_dim, head_dim**-0.5, kv_heads, LAYER_ID, window)

    def batch(num_reqs: int) -> ForwardBatch:
        prefix = [n - RAGGED_WIDTH for n in random_lens(num_reqs, RAGGED_WIDTH + 1)]
        rows = place_requests(req_pool, num_slots, [p + RAGGED_WIDTH for p in prefix])
        return ragged_verify_batch(req_pool, kv_pool, backend, rows, prefix,
                                   ragged_lens(num_reqs, num_tokens), num_tokens,
                                   RAGGED_WIDTH)

    fb = batch(32)
    q, k, v = random_qkv(num_tokens, heads, kv_heads, head_dim, dtype)
    graph, out = capture_forward(backend, fb, layer, q, k, v)
    for num_reqs in (32, 8, 1):
        for row in fb.ragged.request_rows[fb.ragged.lens > 0].tolist():
            req_pool.free(row)
        fresh = batch(num_reqs)
        for name in ("req_pool_indices", "seq_lens", "positions", "out_cache_loc"):
            getattr(fb, name).copy_(getattr(fresh, name))
        fb.seq_lens_cpu.copy_(fresh.seq_lens_cpu)
        for field in ("request_rows", "lens", "prefix_lens", "q_start"):
            getattr(fb.ragged, field).copy_(getattr(fresh.ragged, field))
        for t, new in zip((q, k, v), random_qkv(num_tokens, heads, kv_heads, head_dim, dtype),
                          strict=True):
            t.copy_(new)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        live = int(fb.ragged.lens.sum())
        what = f"ragged {num_reqs} requests, {decode_merge}, window {window}"
        assert torch.equal(out[live:], torch.zeros_like(out[live:])), f"{what} (seed {seed})"
        assert_close(out[:live].clone(), reference(fb, layer, q, k, v)[:live], seed, what)

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
