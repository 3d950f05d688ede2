#!/usr/bin/env bash
# FlashInfer for the H200 in one device call (issue 38 item 3). Its wheel is 101 MB (715 MB
# unpacked: kernel sources for every model family) and the device has no network, so here we
# keep what the paged decode/prefill attention needs: every Python file, the header trees it
# compiles against (include, cutlass, cccl, spdlog), and the csrc templates and headers its JIT
# reads for the decode and prefill (fa2, fa3), norm, SiLU-and-mul, RoPE and page (KV append)
# modules, found by generating those modules' JIT specs with an audit hook on file opens (and
# the .cu sources the specs name), 5.7 MB + all Python 10 MB of xz, plus the wheels it
# imports that the device lacks (apache-tvm-ffi for CPython 3.12, nvidia-ml-py, ninja, einops,
# tabulate, click, tqdm): about 20 MB in .carry/flashinfer.
#
# Here:    bash scripts/device/stage_flashinfer.sh            -> .carry/flashinfer
#          bash scripts/device/stage_flashinfer.sh --aot      -> .carry/flashinfer/aot.tar.xz:
#          the three attention modules bench_flashinfer_attention.py runs (decode, prefill fa2
#          and fa3; bf16, head dim 128, int32 indices) and the norm, SiLU-and-mul and RoPE
#          modules of bench_flashinfer_elementwise.py, compiled here for sm_90a with CUDA
#          13.0's nvcc from PyPI (the device's), no GPU needed: ~9 minutes of this machine's
#          two cores instead of minutes of device time
# Device:  run(command="bash scripts/device/stage_flashinfer.sh --install && ...",
#              carry=[".carry/flashinfer"])
#          installs into /tmp/site (PYTHONPATH=/tmp/site:python) with the compiled modules
#          as FlashInfer's AOT modules (flashinfer/data/aot/NAME/NAME.so: loaded, never
#          rebuilt); a module that does not load there is dropped with a line saying why, and
#          its first use JIT-compiles it with the device's nvcc into ~/.cache/flashinfer
#          (minutes, once per machine), as every module not built here.
set -euo pipefail
cd "$(dirname "$0")/../.."
CARRY=.carry/flashinfer
VERSION=${FLASHINFER_VERSION:-0.7.4}
TVM_FFI=${TVM_FFI_VERSION:-0.1.15.post2}

if [ "${1:-}" = "--install" ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$CARRY"/wheels/*.whl
  tar xJf "$CARRY"/flashinfer-slim.tar.xz -C /tmp/site
  if [ -f "$CARRY"/aot.tar.xz ]; then
    tar xJf "$CARRY"/aot.tar.xz -C /tmp/site
    PYTHONPATH=/tmp/site python3 - <<'EOF'
import pathlib
import shutil

import torch  # noqa: F401  (loads the libcudart the modules link)
import tvm_ffi

for so in sorted(pathlib.Path("/tmp/site/flashinfer/data/aot").glob("*/*.so")):
    try:
        tvm_ffi.load_module(str(so))
    except Exception as e:
        shutil.rmtree(so.parent)
        print(f"flashinfer AOT {so.name[:60]}...: does not load here, JIT builds it "
              f"({type(e).__name__}: {e})".splitlines()[0])
EOF
  fi
  FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a} PYTHONPATH=/tmp/site \
    python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__, 'installed')"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ "${1:-}" = "--aot" ]; then
  [ -f "$CARRY"/flashinfer-slim.tar.xz ] || { echo "stage first: $0"; exit 2; }
  # CUDA 13.0 as the device has it (nvcc 13.0; curand's and cuBLASLt's headers: fa3 and the
  # norms include them; of cuBLAS's 420 MB wheel only its headers are unpacked)
  python3 -m pip download -q --no-deps -d "$work/wheels" "nvidia-cuda-nvcc==13.0.88" \
    "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*" "nvidia-cuda-crt==13.0.88" \
    "nvidia-nvvm==13.0.88" "nvidia-curand>=10.4,<10.5" "nvidia-cublas>=13.0,<13.1"
  python3 - "$work/wheels" "$work/tk" <<'EOF'
import pathlib
import sys
import zipfile

for wheel in pathlib.Path(sys.argv[1]).glob("*.whl"):
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist()
                 if not wheel.name.startswith("nvidia_cublas") or "/include/" in n]
        z.extractall(sys.argv[2], names)
EOF
  cuda=$work/tk/nvidia/cu13
  chmod +x "$cuda"/bin/* "$cuda"/nvvm/bin/*
  ln -s libcudart.so.13 "$cuda/lib/libcudart.so"
  ln -s lib "$cuda/lib64"
  # -lcuda at link time; the modules need none of its symbols (readelf: libcudart only)
  echo > "$work/empty.c" && gcc -shared -Wl,-soname,libcuda.so.1 -o "$cuda/lib/libcuda.so" \
    "$work/empty.c"
  python3 -m pip install -q --no-deps --target "$work/site" "apache-tvm-ffi==$TVM_FFI" \
    nvidia-ml-py einops tabulate ninja
  tar xJf "$CARRY"/flashinfer-slim.tar.xz -C "$work/site"
  PATH=$cuda/bin:$work/site/bin:$PATH CUDA_HOME=$cuda FLASHINFER_CUDA_ARCH_LIST=9.0a \
    FLASHINFER_WORKSPACE_BASE="$work/jit" FLASHINFER_EXTRA_LDFLAGS="-L$cuda/lib" \
    MAX_JOBS=${MAX_JOBS:-2} PYTHONPATH="$work/site" python3 - "$work/aot" <<'EOF'
import pathlib
import shutil
import sys
import time

import torch
from flashinfer.jit.activation import gen_act_and_mul_module
from flashinfer.jit.attention import gen_batch_decode_module, gen_batch_prefill_module
from flashinfer.jit.norm import gen_norm_module
from flashinfer.jit.rope import gen_rope_module

# bench_flashinfer_attention.py's modules: bf16 Q/KV/O, int32 indices, head dim 128, no
# position encoding, sliding window or soft cap (decode; prefill and tensor-core decode);
# bench_flashinfer_elementwise.py's: the norms, SiLU-and-mul, RoPE
b, i32 = torch.bfloat16, torch.int32
specs = [gen_norm_module(), gen_act_and_mul_module("silu"), gen_rope_module(),
         gen_batch_decode_module(b, b, b, i32, 128, 128, 0, False, False)]
specs += [gen_batch_prefill_module(backend, b, b, b, i32, 128, 128, 0, False, False, False)
          for backend in ("fa2", "fa3")]
for spec in specs:
    t0 = time.time()
    spec.build()
    dest = pathlib.Path(sys.argv[1], "flashinfer", "data", "aot", spec.name)
    dest.mkdir(parents=True)
    shutil.copy(spec.jit_library_path, dest / f"{spec.name}.so")
    print(f"{spec.name[:60]}...: {time.time() - t0:.0f} s", file=sys.stderr)
EOF
  tar cf - -C "$work/aot" flashinfer | xz -T2 -6 > "$CARRY/aot.tar.xz"
  du -sh "$CARRY/aot.tar.xz"
  exit 0
fi
mkdir -p "$CARRY/wheels" "$work/site"
py312=(--python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64
       --platform manylinux_2_17_x86_64 --only-binary=:all:)
python3 -m pip download -q --no-deps "${py312[@]}" -d "$work" "flashinfer-python==$VERSION"
python3 -m pip download -q --no-deps "${py312[@]}" -d "$CARRY/wheels" \
  "apache-tvm-ffi==$TVM_FFI" nvidia-ml-py ninja einops tabulate click tqdm
# the file list comes from this machine's Python, whose tvm-ffi build differs: its own wheel
python3 -m pip install -q --no-deps --target "$work/site" "$work"/flashinfer_python-*.whl \
  "apache-tvm-ffi==$TVM_FFI" nvidia-ml-py einops tabulate
FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE="$work/jit" PYTHONPATH="$work/site" \
  python3 - "$work/site" "$work/files.txt" <<'EOF'
import os
import sys

site, listing = sys.argv[1], sys.argv[2]
opened = set()
sys.addaudithook(lambda ev, args: ev == "open" and isinstance(args[0], (str, os.PathLike))
                 and opened.add(os.fsdecode(args[0])))
import torch  # noqa: E402

import flashinfer.decode  # noqa: E402,F401
import flashinfer.prefill  # noqa: E402,F401
from flashinfer.jit import attention as jit  # noqa: E402
from flashinfer.jit.activation import gen_act_and_mul_module  # noqa: E402
from flashinfer.jit.norm import gen_norm_module  # noqa: E402
from flashinfer.jit.page import gen_page_module  # noqa: E402
from flashinfer.jit.rope import gen_rope_module  # noqa: E402

b, i32 = torch.bfloat16, torch.int32
for head_dim in (64, 128):
    jit.gen_batch_decode_module(b, b, b, i32, head_dim, head_dim, 0, False, False)
    for backend in ("fa2", "fa3"):
        jit.gen_batch_prefill_module(backend, b, b, b, i32, head_dim, head_dim, 0, False, False,
                                     False)
modules = [gen_norm_module(), gen_act_and_mul_module("silu"), gen_rope_module(),
           gen_page_module()]
root = os.path.join(site, "flashinfer")
keep = {f for f in opened if f.startswith(root) and os.path.isfile(f)}
# their .cu sources are compiled, not opened, when a spec is made (norm.cu and its binding)
keep |= {os.fspath(src) for spec in modules for src in spec.sources
         if os.fspath(src).startswith(root)}
for top, _, names in os.walk(root):
    data = os.path.relpath(top, root).split(os.sep)
    for name in names:
        if "__pycache__" in top:
            continue
        if data[0] != "data" and name.endswith((".py", ".json", ".typed")):
            keep.add(os.path.join(top, name))
        elif data[:2] in (["data", "include"], ["data", "cutlass"], ["data", "cccl"],
                          ["data", "spdlog"]):
            keep.add(os.path.join(top, name))
        elif data == ["data", "csrc"] and name.endswith((".h", ".cuh", ".inc", ".jinja")):
            keep.add(os.path.join(top, name))
with open(listing, "w") as f:
    f.write("\n".join(sorted(os.path.relpath(p, site) for p in keep)) + "\n")
print(f"{len(keep)} files kept", file=sys.stderr)
EOF
tar cf - -C "$work/site" -T "$work/files.txt" | xz -T2 -6 > "$CARRY/flashinfer-slim.tar.xz"
du -sh "$CARRY"
