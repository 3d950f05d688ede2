"""The scheduler process on CUDA (run on the H200): spawned, it builds the engine and its
graphs on the GPU while the front end's process never initializes CUDA; its requests give
the in-process Engine's tokens (greedy and seeded sampled, target-only and DFlash); its
figures report device memory; shutdown stops it cleanly."""

import asyncio
import os
import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.managers.tokenizer.tokenizer_manager import TokenizerManager
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint

register_cuda_ci(est_time=120, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "What is the capital of France?"]
PARAMS = [{"temperature": 0, "max_new_tokens": 24, "ignore_eos": True},
          {"temperature": 0.8, "top_p": 0.9, "max_new_tokens": 24, "ignore_eos": True,
           "seed": 7}]
CAPTURE_BS = [1, 2, 4, 8]
KINDS = ["target", "dflash"]


def _args(tmp_path, kind: str) -> ServerArgs:
    spec = {} if kind == "target" else dict(
        speculative_algorithm="DFLASH",
        speculative_draft_model_path=tiny_checkpoint("tiny-llama-dflash", tmp_path))
    return ServerArgs(model_path=tiny_checkpoint("tiny-llama", tmp_path), device="cuda",
                      dtype="float32", max_total_tokens=16384, max_running_requests=8,
                      cuda_graph_bs_decode=CAPTURE_BS, **spec)


def _serve(args: ServerArgs) -> tuple[list[dict], dict]:
    manager = TokenizerManager(args, Engine)
    manager.start()

    async def run():
        outs = [await (await manager.submit(text=p, sampling_params=params)).result()
                for p in PROMPTS for params in PARAMS]
        return outs, await manager.engine_info()

    outs, info = asyncio.run(run())
    process = manager.scheduler.process
    manager.shutdown()
    assert process.exitcode == 0
    return outs, info


def test_the_scheduler_process_serves_on_cuda(tmp_path):
    assert not torch.cuda.is_initialized(), "an earlier test initialized CUDA here"
    served = {kind: _serve(_args(tmp_path, kind)) for kind in KINDS}
    assert not torch.cuda.is_initialized(), "the front end touched CUDA"
    for kind, (outs, info) in served.items():
        assert info["scheduler_pid"] != os.getpid() and info["device_memory_allocated"] > 0
        assert info["capture_bs"] == CAPTURE_BS and info["num_running_reqs"] == 0
        engine = Engine(_args(tmp_path, kind))
        refs = [engine.generate(p, params) for p in PROMPTS for params in PARAMS]
        assert [o["output_ids"] for o in outs] == [r["output_ids"] for r in refs], kind
        assert [o["meta_info"]["spec_verify_ct"] for o in outs] == [
            r["meta_info"]["spec_verify_ct"] for r in refs], kind
        del engine


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
