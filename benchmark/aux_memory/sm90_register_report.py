"""Offline sm_90 builds of the accumulating GEMMs: registers, spills and shared memory per config.

    python benchmark/aux_memory/sm90_register_report.py [--out sm90_builds.json]

Needs no GPU (Triton's bundled ptxas/cuobjdump; run it with the H200's triton, 3.6, for its
numbers). Builds every candidate config the way a launch on real shapes specializes it
(16-divisible pointers, sizes and strides; TMA descriptors where the config asks for them) and
reports `cuobjdump -res-usage`, the shared memory, and how many CTAs fit an SM. FP8-dot and
dense: the accumulate variant (LOAD_ACC); BF16-dot: both (the concat / staged call starts from
zeros, a streamed slice from the accumulator, which costs registers). STACK > 0 spills.
"""

from __future__ import annotations

import argparse
import json

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sglang_aux.srt.layers.quantization import accumulating_gemm as ag
from sglang_aux.srt.layers.quantization import dequant_gemm as dg
from sglang_aux.test.sm90_builds import resource_usage

TARGET = GPUTarget("cuda", 90, 32)
SM90_REGISTERS, SM90_SMEM = 65536, 232448  # per SM; smem: the opt-in maximum per block


def _signature(kernel, pointers: dict[str, str]) -> dict[str, str]:
    return {p.name: "constexpr" if p.is_constexpr else pointers.get(p.name, "i32")
            for p in kernel.params}


def build(kernel, pointers: dict[str, str], constexprs: dict,
          cfg: ag.GemmConfig | dg.DequantConfig) -> dict:
    sig = _signature(kernel, pointers)
    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, t) in enumerate(sig.items())
             if t != "constexpr" and not t.startswith("tensordesc") and name != "num_programs"}
    src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(src, target=TARGET, options={"num_warps": cfg.num_warps,
                                                          "num_stages": cfg.num_stages})
    ttgir = compiled.asm["ttgir"]
    usage = resource_usage(compiled.asm["cubin"])
    smem = compiled.metadata.shared
    return {**usage, "dynamic_smem": smem,
            "pipelined_copies": ttgir.count("async_copy_global_to_local"),
            "ctas_per_sm": min(SM90_REGISTERS // (max(usage["reg"], 1) * 32 * cfg.num_warps),
                               SM90_SMEM // max(smem, 1))}


def bf16_dot_rows() -> list[dict]:
    rows = []
    configs = {**dg.BF16_DOT_CANDIDATES, **dg.WEIGHT_CHUNK_CANDIDATES}
    for name, cfg in configs.items():
        for w_mxfp8 in (False, True):
            if cfg.weight_chunk and w_mxfp8:
                continue  # the chunked GEMM runs the bf16-weight loop
            wt = "fp8e4nv" if w_mxfp8 else "bf16"
            ptrs = {"xs_ptr": "*u8", "ws_ptr": "*u8", "acc_ptr": "*fp32", "out_ptr": "*bf16",
                    "x_src": "*fp8e4nv", "w_src": f"*{wt}"}
            if cfg.tma:
                ptrs["x_src"] = f"tensordesc<fp8e4nv[{cfg.block_m}, {cfg.block_k}]>"
                ptrs["w_src"] = f"tensordesc<{wt}[{cfg.block_n}, {cfg.block_k}]>"
            for load_acc in (False, True):
                ce = {"LOAD_ACC": load_acc, "W_MXFP8": w_mxfp8, "TMA": cfg.tma,
                      "OPERAND": tl.bfloat16, "PRECISION": "ieee", "GROUP": 32,
                      "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                      "GROUP_M": cfg.group_m}
                rows.append({"kernel": f"bf16dot/{'mxfp8' if w_mxfp8 else 'bf16'}w",
                             "config": name + (" +acc" if load_acc else ""),
                             **build(dg._dequant_dot_kernel, ptrs, ce, cfg)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    a = p.parse_args()
    rows = []
    mx_ptrs = {"xq_ptr": "*fp8e4nv", "sx_ptr": "*fp32", "wq_ptr": "*fp8e4nv", "sw_ptr": "*fp32",
               "acc_ptr": "*fp32", "out_ptr": "*bf16"}
    for name, cfg in ag.FP8_DOT_CANDIDATES.items():
        ce = {"LOAD_ACC": True, "OPERAND": tl.float8e4nv, "GROUP": 32, "BLOCK_M": cfg.block_m,
              "BLOCK_N": cfg.block_n, "GROUP_M": cfg.group_m}
        rows.append({"kernel": "mxfp8", "config": name, **build(ag._mxfp8_kernel, mx_ptrs, ce,
                                                               cfg)})
    dense_ptrs = {"x_ptr": "*bf16", "w_ptr": "*bf16", "acc_ptr": "*fp32", "out_ptr": "*fp32"}
    for name, cfg in ag.DENSE_CANDIDATES.items():
        ce = {"LOAD_ACC": True, "PRECISION": "tf32", "OPERAND": tl.bfloat16,
              "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": ag.DENSE_BLOCK_K,
              "GROUP_M": cfg.group_m}
        rows.append({"kernel": "dense_bf16", "config": name,
                     **build(ag._dense_kernel, dense_ptrs, ce, cfg)})
    rows += bf16_dot_rows()
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"triton": triton.__version__, "target": "sm_90", "builds": rows}, f,
                      indent=1)
    print(f"triton {triton.__version__}, sm_90")
    print(f"{'kernel':>13} {'config':>36} {'regs':>5} {'stack':>6} {'smem B':>8} "
          f"{'cp.async':>8} {'CTA/SM':>6}")
    for r in rows:
        print(f"{r['kernel']:>13} {r['config']:>36} {r['reg']:>5} {r['stack']:>6} "
              f"{r['dynamic_smem']:>8} {r['pipelined_copies']:>8} {r['ctas_per_sm']:>6}")


if __name__ == "__main__":
    main()
