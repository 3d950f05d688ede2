"""One aux storage per DFlash target runner (CPU eager-replay backend): with prefill graphs and
mixed steps on, a whole engine's start-up (every graph's capture) and generation (graph and
eager forwards of every mode) allocate exactly one `[rows, K * hidden]` tensor, sized for the
largest forward, and every forward writes row views of it."""

import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.model_executor.runner_utils.aux_storage import AuxStorage
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint

register_cpu_ci(est_time=30, suite="default")

RUNNING, BLOCK, MIXED_TOKENS, PREFILL_TOKENS = 3, 4, 16, [16, 32, 64]
# ops that give a tensor fresh storage (the packer's `empty`, the list path's `cat`, ...)
_FRESH = {"empty", "empty_strided", "zeros", "ones", "full", "new_empty", "new_zeros", "cat",
          "stack", "clone", "empty_like", "zeros_like"}


class _FreshTensors(TorchDispatchMode):
    """Storages of every fresh 2-D tensor `width` wide, allocated while active."""

    def __init__(self, width: int):
        super().__init__()
        self.width, self.storages = width, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (func.overloadpacket.__name__ in _FRESH and isinstance(out, torch.Tensor)
                and out.dim() == 2 and out.shape[-1] == self.width):
            self.storages.add(out.untyped_storage().data_ptr())
        return out


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {p: tiny_checkpoint(p, root) for p in ("tiny-k3", "tiny-k3-dflash")}


def _engine(ckpts, **kw):
    return Engine(model_path=ckpts["tiny-k3"], speculative_algorithm="DFLASH",
                  speculative_draft_model_path=ckpts["tiny-k3-dflash"], device="cpu",
                  dtype="float32", max_total_tokens=4096, max_running_requests=RUNNING,
                  cuda_graph_bs_decode=[1, 2, 3], cuda_graph_tokens_prefill=PREFILL_TOKENS,
                  cuda_graph_max_bs_prefill=2, enable_mixed_chunk=True,
                  mixed_chunk_max_prefill_tokens=MIXED_TOKENS, disable_overlap_schedule=True,
                  chunked_prefill_size=-1, **kw)  # rows for graphs only (chunks: their test)


# tokens are bytes: the last prompt is too long for a mixed forward (a step of its own) but
# within the storage's rows (an eager prefill past them would write a transient tensor)
PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "x", "Once upon a time",
           "What is the capital of France?", "Longer than a mixed forward takes"]
GREEDY = {"temperature": 0, "max_new_tokens": 9, "ignore_eos": True}


@pytest.mark.parametrize("graphs", [True, False])
def test_one_aux_allocation_with_mixed_steps_and_prefill_graphs(ckpts, graphs):
    width = 3 * 64  # K = 3 captures of tiny-k3's hidden 64
    created = []
    create = AuxStorage.create.__func__

    def counting(cls, **kw):
        created.append(create(cls, **kw))
        return created[-1]

    with pytest.MonkeyPatch.context() as mp, _FreshTensors(width) as fresh:
        mp.setattr(AuxStorage, "create", classmethod(counting))
        engine = _engine(ckpts, disable_decode_cuda_graph=not graphs)
        outs = engine.generate(PROMPTS, GREEDY)
    runner = engine.worker.target_runner
    (storage,) = created
    assert runner.aux_storage is storage and not storage.streamed
    # the largest forward: the largest prefill graph's (more than a mixed step of every
    # running request plus its arrival tokens)
    assert storage.buffer.shape == (max(RUNNING * BLOCK + MIXED_TOKENS, PREFILL_TOKENS[-1]),
                                    width)
    weights = {w.untyped_storage().data_ptr() for r in (runner, engine.worker.draft_runner)
               for w in r.model.parameters()}  # the draft fc's [H, K * hidden]
    assert fresh.storages - weights == {storage.buffer.untyped_storage().data_ptr()}, \
        "a [T, K * hidden] tensor besides the aux storage"
    assert engine.worker.draft_runner.aux_storage is None
    for mode, g in runner.graph_runners.items():
        for fb in g.static:
            assert fb.aux_hidden_states_buffer.data_ptr() == storage.buffer.data_ptr(), mode
    assert (ForwardMode.MIXED in runner.graph_runners) == graphs
    assert ForwardMode.EXTEND in runner.graph_runners
    stats = engine.scheduler.stats
    assert stats["mixed_steps"] > 0 and stats["prefill_steps"] > 0
    assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in outs)


def test_rows_are_views_and_an_eager_prefill_past_them_gets_none():
    storage = AuxStorage.create(rows=8, width=6, streamed=False, dtype=torch.bfloat16,
                                device=torch.device("cpu"))
    step, extend = storage.rows(8), storage.rows(4)
    assert step.shape == (8, 6) and step.data_ptr() == storage.buffer.data_ptr()
    assert extend.shape == (4, 6) and extend.data_ptr() == storage.buffer.data_ptr()
    assert storage.rows(9) is None
    acc = AuxStorage.create(rows=8, width=6, streamed=True, dtype=torch.bfloat16,
                            device=torch.device("cpu"))
    assert acc.buffer.dtype == torch.float32 and acc.path == "streamed"
    assert acc.rows(8).shape == (8, 6)
    with pytest.raises(ValueError, match="rows and a width"):
        AuxStorage.create(rows=0, width=6, streamed=False, dtype=torch.float32,
                          device=torch.device("cpu"))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
