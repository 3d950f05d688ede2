"""Streamed draft-fc projection (issue 14): the sink's contract, the target feeding it as it taps
its aux states, and DFlash output unchanged with streamed prefills (K3 and Llama targets, dense
and MXFP8 fc). fp32 on CPU; test_streamed_projection_cuda.py runs the same on the H200."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.layers.aux_hidden_states import ProjectedAuxCapture, finish_aux_hidden_states
from sglang_aux.srt.layers.quantization.mxfp8_linear import MXFP8Linear
from sglang_aux.srt.layers.quantization.streamed_projection import StreamedProjection
from sglang_aux.srt.models.dflash import DFlashDraftModel
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import (
    eager_forward,
    extend_batch,
    make_runner,
    pipeline_stage,
    release,
    tiny_checkpoint,
)

register_cpu_ci(est_time=60, suite="default")

PROMPTS = ["Natalia sold clips to 48 of her friends in April, and then she sold half as many",
           "The quick brown fox", "12 + 30 ="]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
TOKENS, HIDDEN, SLICES, N = 24, 64, 3, 40


@pytest.fixture
def device():
    """The device under test; test_streamed_projection_cuda.py overrides it."""
    return "cpu"


def make_projection(device: str, mxfp8: bool, dtype=torch.float32):
    gen = torch.Generator(device=device).manual_seed(3)
    w = torch.randn(N, SLICES * HIDDEN, generator=gen, device=device).to(dtype) * 0.05
    weight = MXFP8Linear.from_float(w, out_dtype=dtype) if mxfp8 else w
    acc = torch.full((TOKENS, N), float("nan"), device=device)
    return StreamedProjection(weight, acc, HIDDEN, SLICES, dtype=dtype, out_dtype=dtype), w


def new_slices(device: str, seed: int, dtype=torch.float32) -> list[torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(TOKENS, HIDDEN, generator=gen, device=device).to(dtype) * (i + 1)
            for i in range(SLICES)]


def stream(proj: StreamedProjection, slices: list[torch.Tensor]) -> torch.Tensor:
    proj.reset()
    for s in slices:
        proj.accumulate(s)
    return proj.result()


@pytest.mark.parametrize("mxfp8", [False, True])
def test_streamed_equals_the_fc_of_the_concat(device, mxfp8: bool) -> None:
    proj, w = make_projection(device, mxfp8)
    for seed in range(2):  # a second forward after reset() reuses the accumulator
        slices = new_slices(device, seed)
        out = stream(proj, slices)
        concat = torch.cat(slices, dim=-1)
        ref = proj.weight(concat) if mxfp8 else concat @ w.T
        # Slice i meets W_i: each slice's share, in arrival order.
        if not mxfp8:
            by_slice = sum(s @ w[:, i * HIDDEN:(i + 1) * HIDDEN].T for i, s in enumerate(slices))
            torch.testing.assert_close(out, by_slice)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(stream(proj, slices[::-1]), ref)  # order matters


def test_sink_contract(device) -> None:
    proj, _ = make_projection(device, mxfp8=False)
    good = new_slices(device, seed=0)
    with pytest.raises(ValueError, match=r"\(24, 64\), got \(24, 32\)"):
        proj.accumulate(good[0][:, :32])
    with pytest.raises(ValueError, match=r"\(24, 64\), got \(5, 64\)"):
        proj.accumulate(good[0][:5])
    with pytest.raises(ValueError, match="dtype"):
        proj.accumulate(good[0].double())
    proj.accumulate(good[0])
    with pytest.raises(RuntimeError, match="only 1 of 3"):
        proj.result()
    for s in good[1:]:
        proj.accumulate(s)
    with pytest.raises(RuntimeError, match="already received"):
        proj.accumulate(good[0])  # a 4th slice
    first = proj.result().clone()
    with pytest.raises(RuntimeError, match="already read"):
        proj.result()
    with pytest.raises(RuntimeError, match="reset"):
        proj.accumulate(good[0])  # the next forward, without reset()
    assert torch.equal(stream(proj, good), first)  # reset() starts from zeros, not the old sum
    out = torch.full_like(first, float("nan"))
    proj.reset()
    for s in good:
        proj.accumulate(s)
    assert proj.result(out=out) is out and torch.equal(out, first)


def test_projected_capture_counts_at_finish(device) -> None:
    proj, _ = make_projection(device, mxfp8=False)
    sink = ProjectedAuxCapture(proj)
    slices = new_slices(device, seed=1)
    for s in slices[:2]:
        sink.capture(s, owned=False)
    assert len(sink) == 2
    with pytest.raises(RuntimeError, match="got 2 aux captures, expected 3"):
        finish_aux_hidden_states(sink)
    sink.capture(slices[2])
    assert finish_aux_hidden_states(sink) is None  # no packed tensor: the owner reads proj
    torch.testing.assert_close(proj.result(), stream(make_projection(device, False)[0], slices))


def test_construction_errors_name_shapes(device) -> None:
    w = torch.zeros(N, SLICES * HIDDEN, device=device)
    with pytest.raises(ValueError, match=r"\(40, 192\).*3 \* 32"):
        StreamedProjection(w, torch.zeros(4, N, device=device), 32, SLICES,
                           dtype=torch.float32, out_dtype=torch.float32)
    with pytest.raises(ValueError, match=r"float32 \[T, 40\], got torch.float16 \(4, 40\)"):
        StreamedProjection(w, torch.zeros(4, N, device=device, dtype=torch.float16), HIDDEN,
                           SLICES, dtype=torch.float32, out_dtype=torch.float32)


def _engine(tmp_path, device, target: str, mxfp8: bool, **kw) -> Engine:
    return Engine(model_path=tiny_checkpoint(target, tmp_path), device=device,
                  speculative_algorithm="DFLASH",
                  speculative_draft_model_path=tiny_checkpoint(f"{target}-dflash", tmp_path),
                  speculative_draft_fc_quantization="mxfp8" if mxfp8 else None,
                  max_total_tokens=4096, cuda_graph_bs_decode=[1, 2, 4], **kw)


@pytest.mark.parametrize("target", ["tiny-k3", "tiny-llama"])
@pytest.mark.parametrize("mxfp8", [False, True])
def test_target_feeds_the_streamed_projection(tmp_path, device, target: str, mxfp8: bool):
    worker = _engine(tmp_path, device, target, mxfp8).worker
    draft, runner = worker.draft_runner.model, worker.target_runner
    vocab = runner.model_config.hf_config.vocab_size
    prompts = [[vocab - 70 + i for i in range(n)] for n in (40, 23, 9)]
    reqs, fb = extend_batch(runner, prompts)
    fb.aux_projection = draft.new_streamed_projection(fb.num_tokens, runner.model_config.dtype)
    streamed_out = eager_forward(runner, fb)
    assert streamed_out.aux_hidden_states is None  # no [T, K*H] tensor on this path
    streamed = fb.aux_projection.result()
    release(runner, reqs)
    reqs, fb = extend_batch(runner, prompts)
    concat_out = eager_forward(runner, fb)
    release(runner, reqs)
    assert streamed.shape == (fb.num_tokens, draft.fc.out_features)
    assert streamed.dtype == draft.fc.weight.dtype
    tol = 1e-5 if runner.model_config.dtype == torch.float32 else 2e-2
    concat = draft.fc_forward(concat_out.aux_hidden_states)
    torch.testing.assert_close(streamed, concat, rtol=tol, atol=tol)
    if device == "cuda" and mxfp8:  # both run accumulating_gemm's MXFP8 kernel: equal bits
        assert torch.equal(streamed, concat)
    assert torch.equal(streamed_out.next_token_logits, concat_out.next_token_logits)


@pytest.mark.parametrize("target,mxfp8", [("tiny-k3", False), ("tiny-k3", True),
                                          ("tiny-llama", False)])
def test_dflash_greedy_equals_target_only_with_streamed_prefill(tmp_path, device, target, mxfp8,
                                                               monkeypatch):
    ref = Engine(model_path=tiny_checkpoint(target, tmp_path), device=device,
                 max_total_tokens=4096, cuda_graph_bs_decode=[1, 2, 4]).generate(PROMPTS, GREEDY)
    # the worker binds the factory at start (prefill and verify graphs capture with it)
    made = []
    make = DFlashDraftModel.new_streamed_projection
    monkeypatch.setattr(DFlashDraftModel, "new_streamed_projection",
                        lambda self, *a, **k: made.append(make(self, *a, **k)) or made[-1])
    engine = _engine(tmp_path, device, target, mxfp8,
                     speculative_dflash_aux_projection="streamed")
    outs = engine.generate(PROMPTS, GREEDY)
    assert made and all(p.num_accumulated == p.num_slices for p in made), "never streamed"
    for a, b in zip(ref, outs, strict=True):
        assert a["output_ids"] == b["output_ids"]


def test_pipeline_stage_cannot_stream(tmp_path) -> None:
    # A PP stage gets earlier captures already concatenated: no ordered [T, H] slices to stream.
    runner = make_runner(tiny_checkpoint("tiny-llama", tmp_path), aux_layer_ids=[0, 2])
    reqs, fb = extend_batch(runner, [[1, 2, 3]])
    fb.aux_projection = StreamedProjection(torch.zeros(8, 128), torch.zeros(3, 8), 64, 2,
                                           dtype=torch.float32, out_dtype=torch.float32)
    with pipeline_stage(2), pytest.raises(
            ValueError, match=r"cannot project aux states as tapped \(pipeline stage of 2\)"):
        eager_forward(runner, fb)
    release(runner, reqs)


def test_flag_is_validated() -> None:
    with pytest.raises(ValueError, match="speculative-dflash-aux-projection"):
        ServerArgs(model_path="x", speculative_dflash_aux_projection="concat")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
