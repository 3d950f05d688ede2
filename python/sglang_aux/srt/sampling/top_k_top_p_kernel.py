"""The Triton kernels of `top_k_top_p`: the same searches on the float32 bits, with each row
split into fixed chunks so that a small batch still fills the GPU.

Every launch runs a `[rows, chunks]` grid, one program per chunk of CHUNK elements. A search
settles BITS bits of its cut per launch: each program counts and sums its chunk at the 8
thresholds `lo + j * step` (j = 1..8; the 8th is the current `hi`) into its own partials slot,
and the next launch's programs each reduce their row's partials over the chunks (in a fixed
order, so every program of a row narrows alike) before sweeping again. Chunk 0 of a row writes
the narrowed state; state and partials alternate between two buffers, so a launch never
writes what its own programs read. 23 launches in all (max, exp + first top-k sweep, 9 more
top-k, 10 top-p, ties, write), whatever the batch; rows with top_k >= vocab skip all but the
last top-k sweep (it measures the mass above 0) and rows with top_p >= 1 every top-p sweep.

The partition depends on the vocabulary only, so a row's result does not depend on the batch
it runs in; nothing is atomic and no launch reads scratch the previous ones left unwritten
(a skipped sweep's partials are never narrowed), so the output is bitwise reproducible. The
scratch is allocated per call (inside a graph: in the graph's pool, once, at capture).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_aux.srt.sampling.top_k_top_p import ONE_BITS, SEARCH_STEPS

CHUNK = 4096  # elements of a row per program: at SmolLM2's vocabulary 12 programs per row
BITS = 3  # bits of a cut settled per sweep: 8 thresholds
LANES = 1 << BITS
SWEEPS = SEARCH_STEPS // BITS  # per search (BITS divides SEARCH_STEPS: every step a power of 2)
NUM_WARPS = 8
# per-row state (int32; floats as their bits): the active search's `lo` (after the ties
# launch: the cut), the top-k cut, its ties, the mass above it, the top-p target, the ties kept
# (constexpr: compiled kernels read no other globals)
LO, VK, TIES_K, MASS_GT_K, TARGET, TIES = (tl.constexpr(i) for i in range(6))
NSTATE = 8
# what a `_step_kernel` launch narrows and sweeps
TOPK, TOPP_FIRST, TOPP = (tl.constexpr(i) for i in range(3))


# Helpers are few and called once per program: the CPU interpreter re-patches the language
# on every device-function call, and everything else is written inline.
@triton.jit
def _sweep(bits, p, lo, step, PCount, PMass, slot, LANES: tl.constexpr):
    """This chunk's count and mass of the probabilities at or above `lo + j * step`, j = 1..8:
    `[LANES, BLOCK]` tiles (the chunk the fast axis, as it was loaded) reduced in one pass."""
    lane = tl.arange(0, LANES)
    ge = bits[None, :] >= (lo + (lane + 1) * step)[:, None]
    tl.store(PCount + slot + lane, tl.sum(ge.to(tl.int32), axis=1))
    tl.store(PMass + slot + lane, tl.sum(tl.where(ge, p[None, :], 0.0), axis=1))


@triton.jit
def _narrow(PCount, PMass, row, C, lo, step, bound, BY_MASS: tl.constexpr,
            CB: tl.constexpr, LANES: tl.constexpr):
    """The row's last sweep reduced over its chunks: the largest of its first 7 thresholds
    whose count (or mass) reaches `bound` becomes `lo` (none: `lo` stays), and the count and
    mass at the threshold above (the new `hi`)."""
    chunk = tl.arange(0, CB)[:, None]
    lane = tl.arange(0, LANES)
    offs = (row * C + chunk) * LANES + lane[None, :]
    count = tl.sum(tl.load(PCount + offs, mask=chunk < C, other=0), axis=0)
    mass = tl.sum(tl.load(PMass + offs, mask=chunk < C, other=0.0), axis=0)
    measure = mass if BY_MASS else count.to(tl.float32)
    j = tl.sum(((lane < LANES - 1) & (measure >= bound)).to(tl.int32), axis=0)
    at_hi = lane == j
    return (lo + j * step, tl.sum(tl.where(at_hi, count, 0), axis=0),
            tl.sum(tl.where(at_hi, mass, 0.0), axis=0))


@triton.jit
def _max_kernel(X, Temp, PMax, stride_t, stride_x, n, C, BLOCK: tl.constexpr):
    row, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = c * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + row * stride_x + cols, mask=cols < n, other=float("-inf")).to(tl.float32)
    tl.store(PMax + row * C + c, tl.max(tl.math.div_rn(x, tl.load(Temp + row * stride_t)), axis=0))


@triton.jit
def _exp_kernel(X, Temp, TopK, P, PMax, PCount, PMass, StateOut, stride_t, stride_k,
                stride_x, stride_p, n, C, step, BLOCK: tl.constexpr, CB: tl.constexpr,
                LANES: tl.constexpr, NSTATE: tl.constexpr):
    """p = exp(x - max x) into `P` (unnormalized: the largest is exactly 1.0), and the first
    top-k sweep."""
    row, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    top = tl.max(tl.load(PMax + row * C + tl.arange(0, CB), mask=tl.arange(0, CB) < C,
                         other=float("-inf")), axis=0)
    cols = c * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + row * stride_x + cols, mask=cols < n, other=0.0).to(tl.float32)
    # both kernels divide rounded to nearest, as torch does: `/` compiles to an approximate
    # division whose rounding differed between them, so the largest p came out 1 + 1 ulp
    # and the cut, clamped at 1.0, kept it with a mass of 0 (inf after the division)
    p = tl.minimum(tl.exp(tl.math.div_rn(x, tl.load(Temp + row * stride_t)) - top), 1.0)
    p = tl.where(cols < n, p, -1.0)  # negative bits: never at a threshold
    tl.store(P + row * stride_p + cols, p, mask=cols < n)
    if tl.load(TopK + row * stride_k) < n:
        _sweep(p.to(tl.int32, bitcast=True), p, 0, step, PCount, PMass,
               (row * C + c) * LANES, LANES)
    if c == 0:  # every field: later launches copy them forward
        tl.store(StateOut + row * NSTATE + tl.arange(0, NSTATE), tl.zeros([NSTATE], tl.int32))


@triton.jit
def _step_kernel(TopK, TopP, P, PCountIn, PMassIn, PCountOut, PMassOut, StateIn, StateOut,
                 stride_k, stride_tp, stride_p, n, C, step_in, step, last_top_k,
                 PHASE: tl.constexpr, BLOCK: tl.constexpr, CB: tl.constexpr,
                 LANES: tl.constexpr, NSTATE: tl.constexpr):
    """Narrow with the previous sweep's partials, then sweep again (see the module doc)."""
    row, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    k = tl.minimum(tl.maximum(tl.load(TopK + row * stride_k), 1), n).to(tl.int32)
    top_p = tl.load(TopP + row * stride_tp)
    si, so = StateIn + row * NSTATE, StateOut + row * NSTATE
    lo, vk, ties_k = tl.load(si + LO), tl.load(si + VK), tl.load(si + TIES_K)
    mass_gt_k, target = tl.load(si + MASS_GT_K), tl.load(si + TARGET)
    if PHASE == TOPK:
        search_on = k < n
        if search_on:
            lo, _c, _m = _narrow(PCountIn, PMassIn, row, C, lo, step_in, k.to(tl.float32),
                                 False, CB, LANES)
        sweep_on = search_on | last_top_k  # the last sweep measures the mass above 0 too
    else:
        sweep_on = top_p < 1.0
        if PHASE == TOPP_FIRST:
            # rows without top-k never reach their bound: vk = 0, every token ranks inside
            bound = tl.where(k < n, k, n + 1).to(tl.float32)
            vk, count_gt, mass = _narrow(PCountIn, PMassIn, row, C, lo, step_in, bound,
                                         False, CB, LANES)
            ties_k = k - count_gt  # ranks left for the tokens equal to vk
            mass_k = mass + ties_k.to(tl.float32) * vk.to(tl.float32, bitcast=True)
            target = (top_p * mass_k).to(tl.int32, bitcast=True)
            mass_gt_k = mass.to(tl.int32, bitcast=True)
            lo = tl.zeros([], tl.int32)
        elif sweep_on:
            lo, _c, _m = _narrow(PCountIn, PMassIn, row, C, lo, step_in,
                                 target.to(tl.float32, bitcast=True), True, CB, LANES)
    if sweep_on:
        cols = c * BLOCK + tl.arange(0, BLOCK)
        p = tl.load(P + row * stride_p + cols, mask=cols < n, other=-1.0)
        _sweep(p.to(tl.int32, bitcast=True), p, lo, step, PCountOut, PMassOut,
               (row * C + c) * LANES, LANES)
    if c == 0:
        tl.store(so + LO, lo)
        tl.store(so + VK, vk)
        tl.store(so + TIES_K, ties_k)
        tl.store(so + MASS_GT_K, mass_gt_k)
        tl.store(so + TARGET, target)


@triton.jit
def _ties_kernel(TopP, P, PCountIn, PMassIn, StateIn, StateOut, PTies, stride_tp, stride_p,
                 n, C, ONE: tl.constexpr, BLOCK: tl.constexpr, CB: tl.constexpr,
                 LANES: tl.constexpr, NSTATE: tl.constexpr):
    """The cut `v` and how many tokens equal to it stay (`top_k_top_p`'s rule), and each
    chunk's count of those ties."""
    row, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    top_p = tl.load(TopP + row * stride_tp)
    si = StateIn + row * NSTATE
    vk, ties_k = tl.load(si + VK), tl.load(si + TIES_K)
    mass_gt = tl.load(si + MASS_GT_K).to(tl.float32, bitcast=True)
    target = tl.load(si + TARGET).to(tl.float32, bitcast=True)
    v = vk
    if top_p < 1.0:
        v, _c, mass = _narrow(PCountIn, PMassIn, row, C, tl.load(si + LO), 1, target, True,
                              CB, LANES)
        v = tl.minimum(tl.maximum(v, vk), ONE)
        mass_gt = tl.where(v == vk, mass_gt, mass)
    v_float = v.to(tl.float32, bitcast=True)
    room = tl.math.ceil((target - mass_gt) / tl.where(v_float > 0, v_float, 1.0))
    room = tl.minimum(room, n.to(tl.float32))
    ties = tl.where((top_p < 1.0) & (v_float > 0), room, n.to(tl.float32)).to(tl.int32)
    ties = tl.maximum(tl.where(v == vk, tl.minimum(ties, ties_k), ties), 1)
    cols = c * BLOCK + tl.arange(0, BLOCK)
    p = tl.load(P + row * stride_p + cols, mask=cols < n, other=-1.0)
    tl.store(PTies + row * C + c, tl.sum((p.to(tl.int32, bitcast=True) == v).to(tl.int32), 0))
    if c == 0:
        so = StateOut + row * NSTATE
        tl.store(so + LO, v)
        tl.store(so + TIES, ties)
        tl.store(so + MASS_GT_K, mass_gt.to(tl.int32, bitcast=True))


@triton.jit
def _write_kernel(P, StateIn, PTies, stride_p, n, C, BLOCK: tl.constexpr, CB: tl.constexpr,
                  NSTATE: tl.constexpr):
    """Keep the tokens above the cut and the first `ties` equal to it (vocabulary order, the
    earlier chunks' ties first), renormalized, in place."""
    row, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    si = StateIn + row * NSTATE
    v, ties = tl.load(si + LO), tl.load(si + TIES)
    chunk = tl.arange(0, CB)
    tied_per_chunk = tl.load(PTies + row * C + chunk, mask=chunk < C, other=0)
    before = tl.sum(tl.where(chunk < c, tied_per_chunk, 0), axis=0)
    kept_ties = tl.minimum(tl.sum(tied_per_chunk, axis=0), ties)
    mass_gt = tl.load(si + MASS_GT_K).to(tl.float32, bitcast=True)
    total = mass_gt + kept_ties.to(tl.float32) * v.to(tl.float32, bitcast=True)
    cols = c * BLOCK + tl.arange(0, BLOCK)
    p = tl.load(P + row * stride_p + cols, mask=cols < n, other=0.0)
    bits = p.to(tl.int32, bitcast=True)
    tied = bits == v
    rank = before + tl.cumsum(tied.to(tl.int32), axis=0)
    keep = (bits > v) | (tied & (rank <= ties))
    tl.store(P + row * stride_p + cols, tl.where(keep, p / total, 0.0), mask=cols < n)


def _step_of(sweep: int) -> int:
    return 1 << (SEARCH_STEPS - BITS * (sweep + 1))


def _check_args(logits: torch.Tensor, out: torch.Tensor, **per_row: torch.Tensor) -> None:
    if logits.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError(f"top_k_top_p_kernel needs contiguous rows, got logits strides "
                         f"{logits.stride()} and out strides {out.stride()}")
    for name, t in per_row.items():
        if t.shape != logits.shape[:1]:
            raise ValueError(f"{name} must have one entry per row {tuple(logits.shape[:1])}, "
                             f"got {tuple(t.shape)}")


def top_k_top_p_kernel(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                       top_p: torch.Tensor, out: torch.Tensor,
                       chunk: int = CHUNK) -> torch.Tensor:
    """`top_k_top_p_probs` in 23 launches: same arguments (the per-row ones `[rows]`, any
    stride); `logits` and `out` need a contiguous last dim. `chunk` (a power of two) sets
    the partition, hence the float32 sums; tests shrink it to cover many chunks."""
    _check_args(logits, out, temperature=temperature, top_k=top_k, top_p=top_p)
    rows, n = logits.shape
    if rows == 0:
        return out
    block = min(chunk, triton.next_power_of_2(n))
    c = triton.cdiv(n, block)
    dev, grid = logits.device, (rows, c)
    pmax = torch.empty((rows, c), dtype=torch.float32, device=dev)
    counts = torch.empty((2, rows, c, LANES), dtype=torch.int32, device=dev)
    masses = torch.empty((2, rows, c, LANES), dtype=torch.float32, device=dev)
    state = torch.empty((2, rows, NSTATE), dtype=torch.int32, device=dev)
    ties = torch.empty((rows, c), dtype=torch.int32, device=dev)
    sizes = dict(BLOCK=block, CB=triton.next_power_of_2(c), num_warps=NUM_WARPS)
    _max_kernel[grid](logits, temperature, pmax, temperature.stride(0), logits.stride(0), n, c,
                      BLOCK=block, num_warps=NUM_WARPS)
    _exp_kernel[grid](logits, temperature, top_k, out, pmax, counts[0], masses[0], state[0],
                      temperature.stride(0), top_k.stride(0), logits.stride(0), out.stride(0),
                      n, c, _step_of(0), LANES=LANES, NSTATE=NSTATE, **sizes)
    for launch in range(1, 2 * SWEEPS):  # sweeps 1..9 of top-k, then 0..9 of top-p
        sweep, i = launch % SWEEPS, (launch - 1) % 2
        phase = (TOPK if launch < SWEEPS else TOPP_FIRST if sweep == 0 else TOPP).value
        _step_kernel[grid](top_k, top_p, out, counts[i], masses[i], counts[1 - i],
                           masses[1 - i], state[i], state[1 - i], top_k.stride(0),
                           top_p.stride(0), out.stride(0), n, c, _step_of((sweep - 1) % SWEEPS),
                           _step_of(sweep), launch == SWEEPS - 1, PHASE=phase, LANES=LANES,
                           NSTATE=NSTATE, **sizes)
    _ties_kernel[grid](top_p, out, counts[1], masses[1], state[1], state[0], ties,
                       top_p.stride(0), out.stride(0), n, c, ONE=ONE_BITS, LANES=LANES,
                       NSTATE=NSTATE, **sizes)
    _write_kernel[grid](out, state[0], ties, out.stride(0), n, c, NSTATE=NSTATE, **sizes)
    return out
