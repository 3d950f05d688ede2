"""Triton kernels built for the H200 (sm_90) on a machine without a GPU.

Inside `sm90_builds()`, a launch of any compiled (not interpreted) `@triton.jit` kernel is
specialized as Triton specializes a real launch (argument dtypes, 16-divisibility, constexprs,
warps, stages, PDL), built for sm_90 by Triton's compiler and its bundled ptxas, and recorded
with its resource usage instead of running: its outputs stay unwritten. What this catches that
the interpreter the CPU tests run under does not: code the compiler rejects, more shared memory
than an SM has (a launch would fail), and registers spilled to local memory (slow).

`qwen_launches()` drives every Triton launcher of the decode, verify and prefill steps at the
Qwen2.5-1.5B shapes the H200 runs (bf16; the candidates of docs/kernels.md with them):

    python -m sglang_aux.test.sm90_builds [--out builds.json]   # the table; exit status 1
                                                                # when a shipped path has a problem

Run it in a process that imports no kernel module before it (the module turns the interpreter
off at import, and `@triton.jit` decides interpreted or compiled when a kernel is defined).
"""

from __future__ import annotations

import os

os.environ.pop("TRITON_INTERPRET", None)  # NOTE: before any @triton.jit definition is imported

import argparse  # noqa: E402
import contextlib  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver as triton_driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from sglang_aux.srt.configs.presets import PRESETS  # noqa: E402

H200 = GPUTarget("cuda", 90, 32)
SM90_SHARED_BYTES = 232448  # the opt-in maximum of one block (227 KiB)
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                         "cuobjdump")


# `JITFunction._do_compile`'s parameters in the Triton versions this hooks (3.6 to 3.9)
HOOKED_PARAMETERS = ["self", "key", "signature", "device", "constexprs", "options", "attrs",
                     "warmup"]


def unsupported() -> str | None:
    """Why this machine cannot build offline (no bundled cuobjdump, or a Triton whose JIT
    internals differ from the ones hooked), None when it can."""
    if not os.path.exists(CUOBJDUMP):
        return f"no bundled CUDA tools ({CUOBJDUMP})"
    params = list(inspect.signature(JITFunction._do_compile).parameters)
    if params != HOOKED_PARAMETERS:
        return (f"triton {triton.__version__}'s JITFunction._do_compile{tuple(params[1:])} is "
                f"not the hooked {tuple(HOOKED_PARAMETERS[1:])}")
    return None


def resource_usage(cubin: bytes) -> dict[str, int]:
    """`cuobjdump --dump-resource-usage` of a cubin: REG, STACK, SHARED, LOCAL (lower-case
    keys; STACK or LOCAL > 0: registers spilled)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name],
                              capture_output=True, text=True, check=True).stdout
    return {k.lower(): int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", text)}


@dataclass(frozen=True)
class Build:
    kernel: str
    case: str  # the launch that asked for it (`qwen_launches`' label)
    candidate: bool  # a bench-only candidate (docs/kernels.md), not a shipped path
    constexprs: dict[str, object]
    num_warps: int
    num_stages: int
    registers: int = 0
    spill_bytes: int = 0  # STACK + LOCAL
    shared_bytes: int = 0  # dynamic (Triton's) + static
    error: str | None = None

    @property
    def problem(self) -> str | None:
        """Why this build would fail or crawl on the H200, None when it would not."""
        if self.error:
            return self.error
        if self.shared_bytes > SM90_SHARED_BYTES:
            return f"{self.shared_bytes} bytes of shared memory > {SM90_SHARED_BYTES}"
        if self.spill_bytes:
            return f"{self.spill_bytes} bytes of registers spilled"
        return None


@dataclass
class Builds:
    """What `sm90_builds` recorded, one entry per distinct specialization."""

    items: list[Build] = field(default_factory=list)
    case: str = ""  # the label of the launches that follow
    candidate: bool = False  # whether they are candidates
    _seen: set = field(default_factory=set)

    def problems(self, candidates: bool = True) -> list[str]:
        """Each build's problem; `candidates=False`: the shipped paths' only."""
        return [f"{b.kernel} [{b.case}] {b.constexprs}: {b.problem}"
                for b in self.items if b.problem and (candidates or not b.candidate)]

    def label(self, case: str, candidate: bool = False) -> None:
        self.case, self.candidate = case, candidate


class _SM90Driver:
    """What `JITFunction.run` asks of the active driver, answered as an H200 would."""

    def get_current_target(self) -> GPUTarget:
        return H200

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def _constexpr_repr(value: object) -> object:
    return value if isinstance(value, int | float | str | bool | None) else repr(value)


@contextlib.contextmanager
def sm90_builds() -> Iterator[Builds]:
    """Compiled-Triton launches inside build for sm_90 and are recorded, never run (module
    docstring). Launchers' PDL check (a CUDA sm_90 device) is answered yes."""
    from sglang_aux.srt.layers.triton_ops import grid_dependency

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("sm90_builds needs compiled Triton: unset TRITON_INTERPRET before "
                           "the kernels are imported")
    if why := unsupported():
        raise RuntimeError(f"sm90_builds: {why}")
    builds, touched = Builds(), []
    real_compile = JITFunction._do_compile

    def do_compile(fn, key, signature, device, constexprs, options, attrs, warmup):
        touched.append(fn)
        if (fn, key) in builds._seen:
            return None
        builds._seen.add((fn, key))
        named = {fn.arg_names[path[0]]: _constexpr_repr(v) for path, v in constexprs.items()
                 if len(path) == 1}
        record = dict(kernel=fn.__name__, case=builds.case, candidate=builds.candidate,
                      constexprs=named,
                      num_warps=options.num_warps, num_stages=options.num_stages)
        try:
            compiled = fn.compile(fn.ASTSource(fn, signature, constexprs, attrs), target=H200,
                                  options=options.__dict__)
            usage = resource_usage(compiled.asm["cubin"])
            record |= dict(registers=usage.get("reg", 0),
                           spill_bytes=usage.get("stack", 0) + usage.get("local", 0),
                           shared_bytes=compiled.metadata.shared + usage.get("shared", 0))
        except Exception as e:  # the compiler's rejection is the finding
            record["error"] = f"{type(e).__name__}: {e}".strip().splitlines()[-1][:300]
        builds.items.append(Build(**record))
        return None  # `run` returns before the launch

    def resolve_pdl(pdl: bool | None, _x: torch.Tensor) -> bool:
        if pdl is not None:
            return bool(pdl)
        return os.environ.get(grid_dependency.ENV_VAR, "auto") != "0"  # auto: the H200 has it

    def rebind(old, new) -> None:
        """Every loaded module's `resolve_pdl` that is `old` becomes `new` (launchers bind it
        at import; one imported inside the block binds the stand-in)."""
        for m in list(sys.modules.values()):
            if getattr(m, "resolve_pdl", None) is old:
                m.resolve_pdl = new

    real_resolve_pdl = grid_dependency.resolve_pdl
    previous = triton_driver._active  # None until a driver was asked for: no GPU driver here
    triton_driver.set_active(_SM90Driver())
    JITFunction._do_compile = do_compile
    rebind(real_resolve_pdl, resolve_pdl)
    try:
        yield builds
    finally:
        JITFunction._do_compile = real_compile
        rebind(resolve_pdl, real_resolve_pdl)
        triton_driver._active = previous
        for fn in touched:  # their binders were made for the H200 target
            fn.device_caches.clear()


# --- the launches of a Qwen2.5-1.5B decode, verify and prefill step -----------------------

QWEN, DRAFT = PRESETS["qwen2.5-1.5b-shaped"], PRESETS["qwen2.5-1.5b-shaped-dflash"]
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = (QWEN[k] for k in (
    "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "vocab_size"))
QKV = (HEADS + 2 * KV_HEADS) * HEAD_DIM
AUX_LAYERS = len(DRAFT["dflash_config"]["target_layer_ids"])
# weight [N, K] per projection: the target's, the LM head, and the DFlash draft's fc (over
# its aux hidden states) and MLP (its own width)
PROJECTIONS = {"qkv": (QKV, HIDDEN), "o": (HIDDEN, HIDDEN), "gate_up": (2 * INTER, HIDDEN),
               "down": (HIDDEN, INTER), "lm_head": (VOCAB, HIDDEN),
               "fc": (HIDDEN, AUX_LAYERS * HIDDEN),
               "draft_gate_up": (2 * DRAFT["intermediate_size"], HIDDEN),
               "draft_down": (HIDDEN, DRAFT["intermediate_size"])}
SLOTS, MAX_CONTEXT = 8192, 4352
DTYPE = torch.bfloat16


def _t(*shape: int, dtype: torch.dtype = DTYPE) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def _gemv_launches(builds: Builds) -> None:
    from sglang_aux.srt.layers.triton_ops.paired_row_gemv import (
        row_gemv_rope_store,
        row_gemv_silu_mul,
    )
    from sglang_aux.srt.layers.triton_ops.row_gemv import RowGemvConfig, row_gemv

    norm = _t(HIDDEN)
    for name, (n, k) in PROJECTIONS.items():
        w, bias = _t(n, k), _t(n) if name == "qkv" else None
        fused = dict(norm_weight=norm, eps=1e-6, residual=_t(1, k)) if k == HIDDEN else {}
        for pdl in (False, True):
            builds.label(f"row_gemv {name} pdl={pdl}")
            row_gemv(_t(1, k), w, bias, pdl=pdl)
            if fused:
                row_gemv(_t(1, k), w, bias, pdl=pdl, **fused)
        builds.label(f"row_gemv {name} tiles", candidate=True)
        for spec in GEMV_TILE_CANDIDATES:
            cfg = RowGemvConfig(*map(int, spec.split(":")))
            row_gemv(_t(1, k), w, bias, pdl=True, config=cfg)
            if fused:
                row_gemv(_t(1, k), w, bias, pdl=True, config=cfg, **fused)
    positions, loc = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    cos_sin = _t(MAX_CONTEXT, HEAD_DIM, dtype=torch.float32)
    k_cache, v_cache = _t(SLOTS, KV_HEADS, HEAD_DIM), _t(SLOTS, KV_HEADS, HEAD_DIM)
    for pdl in (False, True):
        builds.label(f"paired qkv+rope+store pdl={pdl}")
        row_gemv_rope_store(_t(1, HIDDEN), _t(QKV, HIDDEN), _t(QKV), positions, cos_sin,
                            k_cache, v_cache, loc, HEADS, norm_weight=norm, eps=1e-6,
                            residual=_t(1, HIDDEN), pdl=pdl)
        builds.label(f"paired gate_up+silu pdl={pdl}")
        row_gemv_silu_mul(_t(1, HIDDEN), _t(2 * INTER, HIDDEN), norm_weight=norm, eps=1e-6,
                          residual=_t(1, HIDDEN), pdl=pdl)


def _elementwise_launches(builds: Builds) -> None:
    from sglang_aux.srt.layers.triton_ops.rms_norm import rms_norm
    from sglang_aux.srt.layers.triton_ops.rope_store import rope_store
    from sglang_aux.srt.layers.triton_ops.silu_and_mul import silu_and_mul

    for rows in (1, 32, 512):
        for pdl in (False, True):
            # PDL is the default at one token only (grid_dependency.resolve_pdl)
            builds.label(f"elementwise rows={rows} pdl={pdl}", candidate=pdl and rows > 1)
            rms_norm(_t(rows, HIDDEN), _t(HIDDEN), 1e-6, pdl=pdl)
            rms_norm(_t(rows, HIDDEN), _t(HIDDEN), 1e-6, residual=_t(rows, HIDDEN), pdl=pdl)
            silu_and_mul(_t(rows, 2 * INTER), pdl=pdl)
            rope_store(torch.zeros(rows, dtype=torch.int64), _t(rows, HEADS * HEAD_DIM),
                       _t(rows, KV_HEADS * HEAD_DIM),
                       _t(MAX_CONTEXT, HEAD_DIM, dtype=torch.float32),
                       v=_t(rows, KV_HEADS * HEAD_DIM), k_cache=_t(SLOTS, KV_HEADS, HEAD_DIM),
                       v_cache=_t(SLOTS, KV_HEADS, HEAD_DIM),
                       loc=torch.zeros(rows, dtype=torch.int64), pdl=pdl)


def _attention_launches(builds: Builds) -> None:
    from sglang_aux.srt.forward_state.ragged_requests import RaggedRequests
    from sglang_aux.srt.layers.attention.triton_ops import tiling
    from sglang_aux.srt.layers.attention.triton_ops.decode_attention import (
        SplitCounters,
        decode_attention_fwd,
    )

    k_buf, v_buf = _t(SLOTS, KV_HEADS, HEAD_DIM), _t(SLOTS, KV_HEADS, HEAD_DIM)
    scale = HEAD_DIM**-0.5
    for bs in (1, 8, 32):
        req_to_token = torch.zeros(bs, MAX_CONTEXT, dtype=torch.int32)
        rows, seq_lens = torch.arange(bs), torch.full((bs,), 900, dtype=torch.int32)
        for q_len in (1, 16):
            t = bs * q_len
            q, out, positions = _t(t, HEADS, HEAD_DIM), _t(t, HEADS, HEAD_DIM), torch.zeros(
                t, dtype=torch.int64)
            args = (q, k_buf, v_buf, out, req_to_token, rows, seq_lens, positions, scale,
                    q_len > 1)
            builds.label(f"decode_attention bs={bs} q_len={q_len}")
            for splits in (1, 4, 16):
                decode_attention_fwd(*args, num_kv_splits=splits)
                decode_attention_fwd(*args, num_kv_splits=splits, merge="in_kernel",
                                     counters=SplitCounters())
                if q_len > 1:  # the draft's block sees all of itself
                    decode_attention_fwd(*args[:-1], False, num_kv_splits=splits)
            builds.label(f"one-head merge bs={bs} q_len={q_len}", candidate=True)
            decode_attention_fwd(*args, num_kv_splits=4, merge_heads=1)
            builds.label(f"single-pass attention bs={bs} q_len={q_len}", candidate=True)
            for block_n, warps, stages in SINGLE_PASS_CANDIDATES:
                decode_attention_fwd(*args, single_pass=tiling.SinglePassTile(block_n, warps,
                                                                              stages))
            if q_len > 1:
                builds.label(f"ragged verify bs={bs} tokens={t}")
                zeros = torch.zeros(bs, dtype=torch.int32)
                ragged = RaggedRequests(rows, zeros + q_len, seq_lens, zeros, q_len)
                for splits in (1, 4, 16):
                    decode_attention_fwd(*args, num_kv_splits=splits, ragged=ragged)


def _prefill_launches(builds: Builds) -> None:
    from sglang_aux.srt.layers.attention.triton_ops.extend_attention import extend_attention_fwd
    from sglang_aux.srt.layers.quantization.mxfp8_kernels import quantize_mxfp8_triton

    k_buf, v_buf = _t(SLOTS, KV_HEADS, HEAD_DIM), _t(SLOTS, KV_HEADS, HEAD_DIM)
    for bs, extend, prefix in ((1, 4096, 0), (8, 256, 512)):  # a chunk; a mixed batch's arrivals
        builds.label(f"extend_attention bs={bs} extend={extend} prefix={prefix}")
        t = bs * extend
        lens = torch.full((bs,), extend, dtype=torch.int32)
        for splits, pack in ((None, True), (1, True), (4, True), (None, False)):
            extend_attention_fwd(_t(t, HEADS, HEAD_DIM), k_buf, v_buf, _t(t, HEADS, HEAD_DIM),
                                 torch.zeros(bs, MAX_CONTEXT, dtype=torch.int32),
                                 torch.arange(bs), torch.arange(0, t, extend, dtype=torch.int32),
                                 torch.full((bs,), prefix, dtype=torch.int32), lens, extend,
                                 HEAD_DIM**-0.5, num_kv_splits=splits, pack_gqa=pack)
    builds.label("mxfp8 quantize (staged aux states)")
    for rows in (16, 4096):
        quantize_mxfp8_triton(_t(rows, HIDDEN), _t(rows, HIDDEN, dtype=torch.float8_e4m3fn),
                              _t(rows, HIDDEN // 32, dtype=torch.uint8))


# kernel_candidates.sh's single-pass tiles: block_n, num_warps, num_stages
SINGLE_PASS_CANDIDATES = [(64, 4, 2), (128, 4, 2), (128, 8, 2), (256, 8, 1)]
# the row GEMV tiles `fusion_candidates.sh` times under PDL (BLOCK_N:BLOCK_K:warps:stages)
GEMV_TILE_CANDIDATES = ["2:1024:4:1", "8:1024:8:1", "4:512:4:3", "2:2048:4:1", "4:2048:4:1",
                        "4:2048:8:1", "8:2048:8:1"]


def _sampling_launches(builds: Builds) -> None:
    from sglang_aux.srt.sampling.top_k_top_p_kernel import top_k_top_p_kernel

    for rows, vocab in ((1, VOCAB), (32, VOCAB), (4, 512)):  # 512: one chunk
        builds.label(f"top_k_top_p rows={rows} vocab={vocab}")
        per_row = torch.empty(rows, dtype=torch.float32)
        top_k_top_p_kernel(_t(rows, vocab), per_row, torch.empty(rows, dtype=torch.int64),
                           per_row, _t(rows, vocab, dtype=torch.float32))


def _markov_launches(builds: Builds) -> None:
    """DSpark's Markov loop kernel (the default since 2026-12-06) at the DSpark recipes'
    shapes: SmolLM2's 7 proposals over 49,152 tokens, Qwen2.5's 15 over VOCAB, rank 256, in
    its tile, and the candidate tiles (32 requests a program, a pipelined loop)."""
    from sglang_aux.srt.speculative.markov_argmax_kernel import (
        MAX_ROWS,
        MarkovTile,
        markov_greedy_tokens,
    )
    from sglang_aux.srt.speculative.markov_topk_kernel import _markov_topk_kernel

    for n, vocab in ((7, 49_152), (15, VOCAB)):
        w1, w2 = _t(vocab, 256), _t(vocab, 256)
        for bs in (1, 32):
            builds.label(f"markov_argmax n={n} vocab={vocab} bs={bs}")
            markov_greedy_tokens(_t(bs, n, vocab), torch.zeros(bs, dtype=torch.int64), w1, w2,
                                 torch.empty(bs, n, dtype=torch.int64))
        builds.label(f"markov_argmax n={n} vocab={vocab} tiles", candidate=True)
        for tile in (MarkovTile(pipelined=True), MarkovTile(MAX_ROWS, 8),
                     MarkovTile(MAX_ROWS, 8, pipelined=True)):
            markov_greedy_tokens(_t(32, n, vocab), torch.zeros(32, dtype=torch.int64), w1, w2,
                                 torch.empty(32, n, dtype=torch.int64), tile)
        builds.label(f"markov_argmax n={n} over a draft vocabulary of 32,768", candidate=True)
        for bs in (1, 32):  # `--speculative-token-map`: markov_w2's rows of the map's ids
            markov_greedy_tokens(_t(bs, n, 32768), torch.zeros(bs, dtype=torch.int64), w1,
                                 _t(32768, 256), torch.empty(bs, n, dtype=torch.int64),
                                 token_ids=torch.zeros(32768, dtype=torch.int64))
        builds.label(f"markov top-k n={n} vocab={vocab}", candidate=True)
        for k in (64, 256):
            _markov_topk_kernel[(32,)](_t(32, n, k), torch.zeros(32, n, k, dtype=torch.int64),
                                       n * k, k, w1, w2, torch.zeros(32, dtype=torch.int64),
                                       torch.empty(32, n, dtype=torch.int64),
                                       torch.empty(32, n, dtype=torch.int32), n,
                                       torch.zeros((), dtype=torch.float32),
                                       torch.zeros(256, dtype=torch.float32), n, RANK=256,
                                       R_BLOCK=64, K=k, num_warps=4)
        for bs in (1, 16):  # the exact kernel's launches after it, as the switch runs them
            markov_greedy_tokens(_t(bs, n, vocab), torch.zeros(bs, dtype=torch.int64), w1, w2,
                                 torch.empty(bs, n, dtype=torch.int64),
                                 certified=(torch.empty(bs, n, dtype=torch.int64),
                                            torch.empty(bs, n, dtype=torch.int32)))


def qwen_launches(builds: Builds) -> None:
    """Every Triton launcher of the decode, verify and prefill steps (and the kernel
    candidates) at Qwen2.5-1.5B's shapes, inside `sm90_builds()`."""
    _gemv_launches(builds)
    _elementwise_launches(builds)
    _attention_launches(builds)
    _prefill_launches(builds)
    _sampling_launches(builds)
    _markov_launches(builds)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="the builds as JSON")
    args = p.parse_args()
    with sm90_builds() as builds:
        qwen_launches(builds)
    print(f"{'kernel':<28} {'case':<44} {'warps':>5} {'stages':>6} {'regs':>4} {'spill':>5} "
          f"{'smem':>7}  problem")
    for b in builds.items:
        case = f"{b.case}{' (candidate)' if b.candidate else ''}"
        print(f"{b.kernel:<28} {case:<44} {b.num_warps:>5} {b.num_stages:>6} "
              f"{b.registers:>4} {b.spill_bytes:>5} {b.shared_bytes:>7}  {b.problem or ''}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"triton": triton.__version__, "target": "sm_90",
                       "builds": [asdict(b) for b in builds.items]}, f, indent=1)
    print(f"{len(builds.items)} builds: {len(builds.problems())} with a problem, "
          f"{len(builds.problems(candidates=False))} of them on a shipped path")
    return 1 if builds.problems(candidates=False) else 0


if __name__ == "__main__":
    sys.exit(main())
