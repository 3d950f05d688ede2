"""Offline sm_90 builds of the accumulating GEMMs: registers, spills and shared memory per config.

    python benchmark/aux_memory/sm90_register_report.py [--out sm90_builds.json]

Needs no GPU (Triton's bundled ptxas/cuobjdump). Builds every candidate config the way a launch
on real shapes specializes it (16-divisible pointers, sizes and strides), for the accumulate
variant (LOAD_ACC), and reports `cuobjdump -res-usage`. A config with STACK > 0 spills; the
candidate tables in `accumulating_gemm` are meant to hold none.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sglang_aux.srt.layers.quantization import accumulating_gemm as ag

TARGET = GPUTarget("cuda", 90, 32)


def _signature(kernel, pointers: dict[str, str]) -> dict[str, str]:
    return {p.name: "constexpr" if p.is_constexpr else pointers.get(p.name, "i32")
            for p in kernel.params}


def _res_usage(cubin: bytes) -> dict[str, int]:
    tool = os.path.join(os.path.dirname(triton.backends.nvidia.__file__), "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                              check=True).stdout
    return {k.lower(): int(v) for k, v in re.findall(r"(REG|STACK|SHARED):(\d+)", text)}


def build(kernel, pointers: dict[str, str], constexprs: dict, cfg: ag.GemmConfig) -> dict:
    sig = _signature(kernel, pointers)
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(sig.values())
             if t != "constexpr"}
    src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(src, target=TARGET, options={"num_warps": cfg.num_warps,
                                                          "num_stages": cfg.num_stages})
    ttgir = compiled.asm["ttgir"]
    return {**_res_usage(compiled.asm["cubin"]), "dynamic_smem": compiled.metadata.shared,
            "pipelined_copies": ttgir.count("async_copy_global_to_local")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    a = p.parse_args()
    rows = []
    mx_ptrs = {"xq_ptr": "*fp8e4nv", "sx_ptr": "*fp32", "wq_ptr": "*fp8e4nv", "sw_ptr": "*fp32",
               "acc_ptr": "*fp32", "out_ptr": "*bf16"}
    for name, cfg in ag.MXFP8_CANDIDATES.items():
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
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"triton": triton.__version__, "target": "sm_90", "builds": rows}, f,
                      indent=1)
    print(f"triton {triton.__version__}, sm_90")
    print(f"{'kernel':>10} {'config':>14} {'regs':>5} {'stack':>6} {'smem B':>8} {'cp.async':>8}")
    for r in rows:
        print(f"{r['kernel']:>10} {r['config']:>14} {r['reg']:>5} {r['stack']:>6} "
              f"{r['dynamic_smem']:>8} {r['pipelined_copies']:>8}")


if __name__ == "__main__":
    main()
