"""Prefill aux projection into the draft fc: concat vs staged MXFP8 vs streamed, peak memory.

    python benchmark/aux_memory/bench_staged_projection.py --out prefill_projection.json  # H200
    python benchmark/aux_memory/bench_staged_projection.py --cpu-smoke    # small, no peaks
    python benchmark/aux_memory/bench_staged_projection.py --candidate cublas_kc7168 --out p.json

K aux slices [M, H] (bf16) are produced one after another, as a target's layers tap them, and
projected by the draft fc [N, K*H] (bf16 or MXFP8 weights):
- concat: all K slices alive, torch.cat, (quantize,) one GEMM (cuBLAS for bf16 weights);
- staged (MXFP8 only): each slice quantized into the retained MXFP8 [M, K*H] input and freed,
  one GEMM after the last;
- streamed: each slice's W_i a_i added into an fp32 [M, N] accumulator and the slice freed;
  the fc output is the accumulator rounded to bf16.
Peaks are `max_memory_allocated` after a reset, minus what was allocated before (weights);
each path's floor is what it must hold at its peak. `--candidate` names the MXFP8 GEMM of the
mxfp8 paths (default: the production choice; a "cublas_kc..." one adds its scratch to the
peaks). GEMM timings: bench_mxfp8_gemm.py.
"""

import argparse
import json
from dataclasses import asdict, dataclass

import torch

from sglang_aux.srt.layers.quantization.accumulating_gemm import dense_gemm_accumulate
from sglang_aux.srt.layers.quantization.mxfp8_format import MXFP8_BLOCK
from sglang_aux.srt.layers.quantization.mxfp8_linear import MXFP8Linear
from sglang_aux.srt.layers.quantization.staged_input import MXFP8InputAccumulator
from sglang_aux.srt.layers.quantization.streamed_projection import StreamedProjection
from sglang_aux.test.concat_projection import concat_then_project

DTYPE = torch.bfloat16
FP32 = 4


@dataclass(frozen=True)
class Shape:
    tokens: int  # T (M of the GEMM)
    hidden: int  # H, one aux slice is [T, H]
    num_slices: int  # K
    out_features: int  # N

    @property
    def width(self) -> int:  # GEMM K dim = K * H
        return self.hidden * self.num_slices


GPU_SHAPES = [Shape(m, 7168, 6, 7168) for m in (1024, 4096, 16384)]
CPU_SMOKE_SHAPES = [Shape(64, 64, 3, 96)]
RUNS = [("bf16", "concat"), ("bf16", "streamed"), ("mxfp8", "concat"), ("mxfp8", "staged"),
        ("mxfp8", "streamed")]


def make_slice(shape: Shape, index: int, device: str) -> torch.Tensor:
    """Aux slice `index` [T, H]; seeded so every path sees the same data, made in place."""
    gen = torch.Generator(device=device).manual_seed(1234 + index)
    return torch.empty(shape.tokens, shape.hidden, dtype=DTYPE, device=device).normal_(
        generator=gen)


def run_concat(shape: Shape, weight, device: str, candidate: str | None) -> torch.Tensor:
    slices = [make_slice(shape, i, device) for i in range(shape.num_slices)]
    if isinstance(weight, MXFP8Linear):
        out = torch.empty(shape.tokens, shape.out_features, dtype=DTYPE, device=device)
        return concat_then_project(slices, weight, out, candidate)
    return torch.cat(slices, dim=-1) @ weight.T


def run_staged(shape: Shape, weight: MXFP8Linear, device: str, candidate: str | None
               ) -> torch.Tensor:
    out = torch.empty(shape.tokens, shape.out_features, dtype=DTYPE, device=device)
    acc = MXFP8InputAccumulator(weight, out, shape.hidden, shape.num_slices,
                                candidate=candidate)
    for i in range(shape.num_slices):
        hidden = make_slice(shape, i, device)
        acc.accumulate(hidden)
        del hidden  # as a target model would: the BF16 slice dies once consumed
    return acc.result()


def run_streamed(shape: Shape, weight, device: str, candidate: str | None) -> torch.Tensor:
    acc = torch.empty(shape.tokens, shape.out_features, dtype=torch.float32, device=device)
    proj = StreamedProjection(weight, acc, shape.hidden, shape.num_slices, dtype=DTYPE,
                              out_dtype=DTYPE, candidate=candidate)
    for i in range(shape.num_slices):
        hidden = make_slice(shape, i, device)
        proj.accumulate(hidden)
        del hidden
    return proj.result()


PATH_FNS = {"concat": run_concat, "staged": run_staged, "streamed": run_streamed}


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


def floors(shape: Shape) -> dict[str, int]:
    """Bytes each path must hold at its peak (the fc weights excluded)."""
    t, h, k, n = shape.tokens, shape.hidden, shape.num_slices, shape.out_features
    slice_, out, acc = t * h * 2, t * n * 2, t * n * FP32
    mx = 1 + 1 / MXFP8_BLOCK  # e4m3 byte + its share of a scale byte, per element
    return {
        "bf16/concat": 2 * k * slice_ + out,  # K slices + their cat + output
        "bf16/streamed": acc + max(slice_, out),  # accumulator + one slice (or the output)
        "mxfp8/concat": 2 * k * slice_ + int(t * k * h * mx) + out,
        "mxfp8/staged": int(t * k * h * mx) + out + slice_,
        "mxfp8/streamed": acc + max(slice_ + int(t * h * mx), out),  # + the slice's MXFP8
    }


def bench_shape(shape: Shape, device: str, candidate: str | None) -> dict:
    gen = torch.Generator(device=device).manual_seed(7)
    w = torch.randn(shape.out_features, shape.width, dtype=DTYPE, device=device,
                    generator=gen) * 0.02
    weights = {"bf16": w, "mxfp8": MXFP8Linear.from_float(w)}
    weight_bytes = {"bf16": w.numel() * 2,
                    "mxfp8": int(w.numel() * (1 + 1 / MXFP8_BLOCK))}
    floor = floors(shape)
    rows, outs = [], {}
    for wname, path in RUNS:
        fn, weight = PATH_FNS[path], weights[wname]
        fn(shape, weight, device, candidate)  # warm-up: Triton compiles outside the measurement
        out, peak = peak_bytes(fn, shape, weight, device, candidate)
        outs[f"{wname}/{path}"] = out
        row = {"weights": wname, "path": path, "peak_bytes": peak,
               "floor_bytes": floor[f"{wname}/{path}"], "weight_bytes": weight_bytes[wname]}
        if peak is not None:
            row["peak_over_floor"] = peak / row["floor_bytes"]
        rows.append(row)
    # Same kernel over the concat: the streamed bf16 chain must equal it bit for bit.
    concat_kernel = torch.empty(shape.tokens, shape.out_features, dtype=torch.float32,
                                device=device)
    if device == "cuda":
        x = torch.cat([make_slice(shape, i, device) for i in range(shape.num_slices)], -1)
        dense_gemm_accumulate(x, w, concat_kernel)
        del x
    ref = outs["bf16/concat"].float()
    checks = {
        "mxfp8_staged_vs_concat_bitwise": torch.equal(outs["mxfp8/concat"],
                                                      outs["mxfp8/staged"]),
        # One FP8-dot kernel on CUDA; on CPU each slice is its own fp32 matmul (close only).
        "mxfp8_streamed_vs_concat_bitwise": torch.equal(outs["mxfp8/concat"],
                                                        outs["mxfp8/streamed"]),
        "bf16_streamed_vs_cublas_concat_max_rel": (
            (outs["bf16/streamed"].float() - ref).abs().max() / ref.abs().max()).item(),
        "bf16_streamed_vs_same_kernel_concat_bitwise": None if device != "cuda" else
        torch.equal(outs["bf16/streamed"], concat_kernel.to(DTYPE)),
    }
    return {"shape": asdict(shape), "runs": rows, "checks": checks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="JSON path for the full numbers")
    parser.add_argument("--cpu-smoke", action="store_true", help="small shapes on CPU")
    parser.add_argument("--candidate", default=None,
                        help="MXFP8 GEMM candidate of mxfp8_gemm_choice (default: production)")
    args = parser.parse_args()
    if args.cpu_smoke:
        device, shapes = "cpu", CPU_SMOKE_SHAPES
        out_path = args.out or "benchmark/aux_memory/prefill_projection_cpu_smoke.json"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("needs CUDA; use --cpu-smoke on CPU")
        device, shapes = "cuda", GPU_SHAPES
        out_path = args.out or "benchmark/aux_memory/prefill_projection.json"
    results = [bench_shape(shape, device, args.candidate) for shape in shapes]
    report = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "torch": torch.__version__, "candidate": args.candidate, "results": results}
    with open(out_path, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {out_path}")
    print(f"{'M':>6} {'weights':>7} {'path':>9} {'peak B':>14} {'floor B':>14} {'/floor':>7} "
          f"{'/staged':>8}")
    for r in results:
        staged = next(x["peak_bytes"] for x in r["runs"] if x["path"] == "staged")
        for x in r["runs"]:
            peak = x["peak_bytes"]
            vs = f"{peak / staged:8.3f}" if peak and staged else f"{'n/a':>8}"
            print(f"{r['shape']['tokens']:>6} {x['weights']:>7} {x['path']:>9} "
                  f"{peak if peak is not None else 'n/a':>14} {x['floor_bytes']:>14} "
                  f"{x.get('peak_over_floor', float('nan')):>7.3f} {vs}")
        print(f"       checks: {r['checks']}")
    must = ["mxfp8_staged_vs_concat_bitwise"]
    if device == "cuda":
        must += ["mxfp8_streamed_vs_concat_bitwise", "bf16_streamed_vs_same_kernel_concat_bitwise"]
    failed = [m for r in results for m in must if not r["checks"][m]]
    if failed:
        raise SystemExit(f"bitwise checks failed: {failed}")


if __name__ == "__main__":
    main()
