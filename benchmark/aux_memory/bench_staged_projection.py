"""Staged MXFP8 aux projection vs concat-then-quantize: peak memory, bitwise equality, GEMM time.

    python benchmark/aux_memory/bench_staged_projection.py [--out PATH]    # CUDA (H200)
    python benchmark/aux_memory/bench_staged_projection.py --cpu-smoke     # small, no timing

Concat path: all K BF16 slices alive, torch.cat, quantize, MXFP8 GEMM. Staged path: each slice is
produced, quantized into the retained MXFP8 input and deleted before the next one; the K-th
slice runs the same GEMM. Peaks are `max_memory_allocated` after a reset, minus what was
allocated before (the weights); "with weights" adds the MXFP8 weight bytes back.
"""

import argparse
import json
from dataclasses import asdict, dataclass

import torch

from sglang_aux.srt.layers.quantization.mxfp8 import MXFP8_BLOCK, quantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_linear import MXFP8Linear
from sglang_aux.srt.layers.quantization.staged_input import (
    MXFP8InputAccumulator,
    concat_then_project,
)

HBM_BYTES_PER_S = 4.3e12  # H200
BF16_DENSE_FLOPS = 790e12  # H200, dense BF16
DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Shape:
    tokens: int  # T (M of the GEMM)
    hidden: int  # H, one aux slice is [T, H]
    num_slices: int  # K
    out_features: int  # N

    @property
    def width(self) -> int:  # GEMM K dim = K * H
        return self.hidden * self.num_slices


GPU_SHAPES = [Shape(4096, 7168, 6, 7168), Shape(1024, 7168, 6, 7168)]
CPU_SMOKE_SHAPES = [Shape(64, 64, 3, 96)]


def make_slice(shape: Shape, index: int, device: str) -> torch.Tensor:
    """Aux slice `index` [T, H]; seeded so both paths see the same data, made in place."""
    gen = torch.Generator(device=device).manual_seed(1234 + index)
    return torch.empty(shape.tokens, shape.hidden, dtype=DTYPE, device=device).normal_(
        generator=gen)


def run_concat(shape: Shape, linear: MXFP8Linear, device: str) -> torch.Tensor:
    slices = [make_slice(shape, i, device) for i in range(shape.num_slices)]
    out = torch.empty(shape.tokens, shape.out_features, dtype=DTYPE, device=device)
    return concat_then_project(slices, linear, out)


def run_staged(shape: Shape, linear: MXFP8Linear, device: str) -> torch.Tensor:
    out = torch.empty(shape.tokens, shape.out_features, dtype=DTYPE, device=device)
    acc = MXFP8InputAccumulator(linear, out, shape.hidden, shape.num_slices)
    for i in range(shape.num_slices):
        hidden = make_slice(shape, i, device)
        acc.accumulate(hidden)
        del hidden  # as a target model would: the BF16 slice dies once quantized
    return acc.result()


def peak_bytes(fn, *args) -> tuple[torch.Tensor, int | None]:
    """(result, peak bytes allocated above the pre-call level), CUDA only."""
    if not torch.cuda.is_available():
        return fn(*args), None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn(*args)
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() - base


def theory(shape: Shape) -> dict[str, int]:
    t, kh, n = shape.tokens, shape.width, shape.out_features
    retained = t * kh + t * kh // MXFP8_BLOCK  # e4m3 values + E8M0 scales
    out = t * n * 2
    return {
        "staged_floor": retained + out + t * shape.hidden * 2,  # + one live BF16 slice
        "concat_live": 2 * t * kh * 2 + retained + out,  # K slices + cat + quantized + out
        "weights": n * kh + n * kh // MXFP8_BLOCK,
    }


def time_gemms(shape: Shape, linear: MXFP8Linear, device: str) -> dict[str, float]:
    from triton.testing import do_bench

    t, kh, n = shape.tokens, shape.width, shape.out_features
    x = torch.randn(t, kh, dtype=DTYPE, device=device)
    xq, xs = quantize_mxfp8(x)
    out = torch.empty(t, n, dtype=DTYPE, device=device)
    mxfp8_ms = do_bench(lambda: linear.forward_quantized(xq, xs, out), return_mode="median")
    w = torch.randn(n, kh, dtype=DTYPE, device=device)
    cublas_ms = do_bench(lambda: torch.mm(x, w.t(), out=out), return_mode="median")
    quant_ms = do_bench(lambda: quantize_mxfp8(x, out=(xq, xs)), return_mode="median")
    flops = 2 * t * n * kh
    mxfp8_bytes = t * kh * (1 + 1 / MXFP8_BLOCK) + n * kh * (1 + 1 / MXFP8_BLOCK) + t * n * 2
    bf16_bytes = 2 * (t * kh + n * kh + t * n)
    flop_floor_ms = flops / BF16_DENSE_FLOPS * 1e3
    return {
        "mxfp8_gemm_ms": mxfp8_ms,
        "cublas_bf16_ms": cublas_ms,
        "mxfp8_over_cublas": mxfp8_ms / cublas_ms,
        "mxfp8_tflops": flops / mxfp8_ms / 1e9,
        "cublas_tflops": flops / cublas_ms / 1e9,
        "roofline_mxfp8_ms": max(mxfp8_bytes / HBM_BYTES_PER_S * 1e3, flop_floor_ms),
        "roofline_bf16_ms": max(bf16_bytes / HBM_BYTES_PER_S * 1e3, flop_floor_ms),
        "quantize_full_input_ms": quant_ms,
        "quantize_bytes_roofline_ms": (2 * t * kh + t * kh * (1 + 1 / MXFP8_BLOCK))
        / HBM_BYTES_PER_S * 1e3,
    }


def bench_shape(shape: Shape, device: str, timing: bool) -> dict:
    gen = torch.Generator(device=device).manual_seed(7)
    weight = torch.randn(shape.out_features, shape.width, dtype=DTYPE, device=device,
                         generator=gen) * 0.02
    linear = MXFP8Linear.from_float(weight)
    del weight
    run_concat(shape, linear, device)  # warm-up: compile, autotune (do_bench buffers) first
    run_staged(shape, linear, device)
    concat_out, concat_peak = peak_bytes(run_concat, shape, linear, device)
    staged_out, staged_peak = peak_bytes(run_staged, shape, linear, device)
    bitwise = torch.equal(concat_out.view(torch.int16), staged_out.view(torch.int16))
    del concat_out, staged_out
    floors = theory(shape)
    row = {"shape": asdict(shape), "bitwise_equal": bitwise, "theory_bytes": floors}
    if concat_peak is not None:
        w = floors["weights"]
        row["peak_bytes"] = {
            "concat": concat_peak, "staged": staged_peak,
            "concat_with_weights": concat_peak + w, "staged_with_weights": staged_peak + w,
        }
        row["reduction_pct"] = 100 * (1 - staged_peak / concat_peak)
        row["reduction_pct_with_weights"] = 100 * (1 - (staged_peak + w) / (concat_peak + w))
        row["staged_over_floor"] = staged_peak / floors["staged_floor"]
    if timing:
        row["timing"] = time_gemms(shape, linear, device)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="JSON path for the full numbers")
    parser.add_argument("--cpu-smoke", action="store_true", help="small shapes on CPU, no timing")
    args = parser.parse_args()
    if args.cpu_smoke:
        device, shapes, timing = "cpu", CPU_SMOKE_SHAPES, False
        out_path = args.out or "benchmark/aux_memory/staged_projection_cpu_smoke.json"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("needs CUDA; use --cpu-smoke on CPU")
        device, shapes, timing = "cuda", GPU_SHAPES, True
        out_path = args.out or "benchmark/aux_memory/staged_projection.json"
    rows = [bench_shape(shape, device, timing) for shape in shapes]
    report = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "torch": torch.__version__, "results": rows}
    with open(out_path, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {out_path}")
    print(f"{'M':>6} {'concat B':>14} {'staged B':>14} {'floor B':>14} {'red.%':>7} "
          f"{'+w red.%':>8} {'bitwise':>7} {'mxfp8 ms':>9} {'cuBLAS ms':>9} {'roof ms':>8}")
    for r in rows:
        p, tm = r.get("peak_bytes", {}), r.get("timing", {})
        print(f"{r['shape']['tokens']:>6} {p.get('concat', 'n/a'):>14} "
              f"{p.get('staged', 'n/a'):>14} {r['theory_bytes']['staged_floor']:>14} "
              f"{r.get('reduction_pct', float('nan')):>7.2f} "
              f"{r.get('reduction_pct_with_weights', float('nan')):>8.2f} "
              f"{str(r['bitwise_equal']):>7} {tm.get('mxfp8_gemm_ms', float('nan')):>9.3f} "
              f"{tm.get('cublas_bf16_ms', float('nan')):>9.3f} "
              f"{tm.get('roofline_mxfp8_ms', float('nan')):>8.3f}")
    if not all(r["bitwise_equal"] for r in rows):
        raise SystemExit("staged and concat outputs differ")


if __name__ == "__main__":
    main()
