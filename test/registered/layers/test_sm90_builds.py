"""Every Triton launch of a Qwen2.5-1.5B decode, verify and prefill step (the sampler's top-k /
top-p included), and every kernel candidate the device scripts time, builds for the H200
(sm_90) on this machine without a GPU (`sglang_aux.test.sm90_builds`): the interpreter the
other CPU tests use accepts what the compiler rejects (a non-constexpr global, a type that
differs between the branches of an `if`), and a launch past the SM's shared memory fails only
on the device. Shipped paths must not spill registers either; a candidate's spill is reported
(its bench decides)."""

import sys

import pytest
import triton
import triton.language as tl

# turns the interpreter off before this file's kernel is defined
from sglang_aux.test import sm90_builds  # noqa: I001
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=150, suite="default")
pytestmark = pytest.mark.skipif(sm90_builds.unsupported() is not None,
                                reason=str(sm90_builds.unsupported()))


@pytest.fixture(scope="module")
def builds() -> sm90_builds.Builds:
    with sm90_builds.sm90_builds() as recorded:
        sm90_builds.qwen_launches(recorded)
    return recorded


def test_every_launch_builds_and_fits_an_sm(builds):
    kernels = {b.kernel for b in builds.items}
    # each launcher reached the compiler (a launcher that stopped short would hide its kernel)
    assert {"_row_gemv_kernel", "_rope_store_gemv_kernel", "_silu_mul_gemv_kernel",
            "_rms_norm_kernel", "_silu_and_mul_kernel", "_rope_store_kernel",
            "_decode_attention_kernel", "_merge_attn_states_kernel", "_max_kernel",
            "_exp_kernel", "_step_kernel", "_ties_kernel", "_write_kernel",
            "_extend_attention_kernel", "_quantize_kernel", "_markov_argmax_kernel"} <= kernels
    failed = [f"{b.kernel} [{b.case}]: {b.problem}" for b in builds.items
              if b.error or b.shared_bytes > sm90_builds.SM90_SHARED_BYTES]
    assert not failed, "\n".join(failed)


def test_shipped_paths_do_not_spill(builds):
    shipped = [b for b in builds.items if not b.candidate]
    assert any(b.case.startswith("ragged verify") for b in shipped)
    assert not builds.problems(candidates=False), "\n".join(builds.problems(candidates=False))


def test_a_launch_inside_is_built_not_run_and_outside_untouched():
    import torch

    from sglang_aux.srt.layers.triton_ops.rope_store import rope_store

    rows, heads, kv_heads, dim = 2, 4, 2, 64
    k_cache = torch.full((8, kv_heads, dim), 7.0, dtype=torch.bfloat16)
    args = (torch.zeros(rows, dtype=torch.int64), torch.ones(rows, heads * dim),
            torch.ones(rows, kv_heads * dim), torch.ones(16, dim))
    with sm90_builds.sm90_builds() as recorded:
        rope_store(*args, k_cache=k_cache, v=torch.ones(rows, kv_heads * dim),
                   v_cache=torch.zeros_like(k_cache), loc=torch.arange(rows))
    assert [b.kernel for b in recorded.items] == ["_rope_store_kernel"]
    assert recorded.items[0].registers > 0 and not recorded.items[0].problem
    assert (k_cache == 7.0).all()  # built, never run: the in-place KV store did not happen
    if not torch.cuda.is_available():  # after the block, launches need a driver again
        with pytest.raises(RuntimeError):
            rope_store(*args)


@triton.jit
def _rejected_kernel(X, N):
    x = tl.load(X + tl.arange(0, N))  # N is not a constexpr: the compiler refuses the range
    tl.store(X + tl.arange(0, 16), x)


def test_a_build_the_compiler_rejects_is_recorded_with_its_reason():
    import torch

    with sm90_builds.sm90_builds() as recorded:
        _rejected_kernel[(1,)](torch.empty(16), 16)
    [build] = recorded.items
    assert build.kernel == "_rejected_kernel" and "constexpr" in build.error
    assert build.problem == build.error and recorded.problems()


def test_the_pdl_check_is_back_after_the_block_in_modules_imported_inside():
    import importlib

    import torch

    from sglang_aux.srt.layers.triton_ops import grid_dependency

    name = "sglang_aux.srt.layers.triton_ops.paired_row_gemv"
    sys.modules.pop(name, None)  # first imported inside the block
    with sm90_builds.sm90_builds():
        paired = importlib.import_module(name)
        assert paired.resolve_pdl(True, torch.empty(1)) is True  # the H200's answer
    assert paired.resolve_pdl is grid_dependency.resolve_pdl
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="programmatic dependent launch"):
            paired.resolve_pdl(True, torch.empty(1))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
