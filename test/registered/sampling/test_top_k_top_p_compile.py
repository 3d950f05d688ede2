"""The split top-k / top-p kernels compile for the H200 (sm_90) on a machine without a GPU: the
interpreter the other CPU tests use accepts what the compiler rejects (a non-constexpr global,
a type that differs between the branches of an `if`), and a kernel that spills registers to
local memory would be slow. Triton's bundled ptxas builds the cubin; cuobjdump reads its
resource usage."""

import os
import subprocess
import sys
import tempfile

import pytest

os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels: must precede any @triton.jit

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sglang_aux.srt.sampling import top_k_top_p_kernel as kernels  # noqa: E402
from sglang_aux.srt.sampling.top_k_top_p import ONE_BITS  # noqa: E402
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time=40, suite="default")

H200 = GPUTarget("cuda", 90, 32)
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                         "cuobjdump")
POINTERS = {"X": "*bf16", "TopK": "*i64", "PTies": "*i32", "StateIn": "*i32",
            "StateOut": "*i32", "PCount": "*i32", "PCountIn": "*i32", "PCountOut": "*i32"}
pytestmark = pytest.mark.skipif(not os.path.exists(CUOBJDUMP), reason="no bundled CUDA tools")


def _signature(fn, constexprs: dict) -> dict[str, str]:
    """Argument types as the launcher passes them: capitalized names but `C` (the chunk count)
    are pointers (float32 but where POINTERS says), `last_top_k` a bool, other scalars int32."""
    def kind(name: str) -> str:
        if name in constexprs:
            return "constexpr"
        if name[0].isupper() and name != "C":
            return POINTERS.get(name, "*fp32")
        return "i1" if name == "last_top_k" else "i32"
    return {name: kind(name) for name in fn.arg_names}


def _launches(block: int, chunks: int) -> list[tuple[object, dict]]:
    sizes = dict(BLOCK=block, CB=triton.next_power_of_2(chunks))
    state = dict(LANES=kernels.LANES, NSTATE=kernels.NSTATE, **sizes)
    return [(kernels._max_kernel, dict(BLOCK=block)), (kernels._exp_kernel, state),
            *[(kernels._step_kernel, dict(PHASE=phase.value, **state))
              for phase in (kernels.TOPK, kernels.TOPP_FIRST, kernels.TOPP)],
            (kernels._ties_kernel, dict(ONE=ONE_BITS, **state)),
            (kernels._write_kernel, dict(NSTATE=kernels.NSTATE, **sizes))]


@pytest.mark.parametrize("block, chunks", [(kernels.CHUNK, 12), (512, 1)])  # SmolLM2; tiny
def test_kernels_compile_for_sm90_without_spills(block, chunks):
    for fn, constexprs in _launches(block, chunks):
        compiled = triton.compile(ASTSource(fn, _signature(fn, constexprs), constexprs),
                                  target=H200, options={"num_warps": kernels.NUM_WARPS})
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(compiled.asm["cubin"])
            cubin.flush()
            usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", cubin.name],
                                   capture_output=True, text=True, check=True).stdout
        line = next(x for x in usage.splitlines() if "REG:" in x)
        assert "LOCAL:0" in line and "STACK:0" in line, f"{fn.__name__} {constexprs}: {line}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
