"""Training on the H200: `extract_aux` keeps a sequence's aux rows in pinned host memory once
the device would keep less than the reserve free, `SequenceSet` leaves them there, a batch
built from host rows equals one built from device rows bit for bit, and a training step
queues without a host sync (tiny-llama, fp32)."""

import sys

import pytest
import torch

from sglang_aux.srt.configs.presets import MASK_TOKEN_ID, PRESETS
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.runtime_utils import make_runner, tiny_checkpoint
from sglang_aux.tools.dflash_training.data import Sample, common_prefix_len, prompt_owners
from sglang_aux.tools.dflash_training.dspark_objective import DSparkTrainer
from sglang_aux.tools.dflash_training.export import draft_config, dspark_draft_config, new_draft
from sglang_aux.tools.dflash_training.features import extract_aux
from sglang_aux.tools.dflash_training.sequence_set import SequenceSet, sample_anchors
from sglang_aux.tools.dflash_training.trainer import TrainConfig, Trainer

register_cuda_ci(est_time=20, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _aux_runner(tmp_path):
    """A CUDA fp32 runner of the tiny target that captures a one-layer draft's two aux
    layers, and those layers."""
    config = draft_config(PRESETS["tiny-llama"], num_layers=1, num_aux_layers=2, block_size=4,
                          mask_token_id=MASK_TOKEN_ID)
    layer_ids = config["dflash_config"]["target_layer_ids"]
    return make_runner(tiny_checkpoint("tiny-llama", tmp_path), aux_layer_ids=layer_ids,
                       device="cuda", dtype="float32", max_total_tokens=2048,
                       max_running_requests=4), layer_ids


def test_rows_past_the_reserve_wait_on_the_host(tmp_path):
    runner, layer_ids = _aux_runner(tmp_path)
    g = torch.Generator().manual_seed(5)
    shots = torch.randint(0, 256, (17,), generator=g).tolist()
    samples = [Sample(shots + torch.randint(0, 256, (n,), generator=g).tolist(),
                      torch.randint(0, 256, (m,), generator=g).tolist())
               for n, m in [(4, 9), (2, 5), (7, 6), (3, 4), (5, 8)]]
    skip = common_prefix_len(samples)
    dev = torch.device("cuda")
    everything = torch.cuda.get_device_properties(dev).total_memory
    prefix, on_device = extract_aux(runner, samples, layer_ids, skip=skip, reserve_bytes=0)
    prefix_h, on_host = extract_aux(runner, samples, layer_ids, skip=skip,
                                    reserve_bytes=everything)
    assert all(a.device.type == "cuda" for a in on_device)
    assert all(a.device.type == "cpu" and a.is_pinned() for a in on_host)
    assert prefix_h.device.type == "cuda"  # the shared prefix is kept once, on the device
    for a, b in zip(on_device, on_host, strict=True):
        assert torch.equal(a, b.to(dev))
    kept_on_host = SequenceSet(samples, on_host, dev, prefix_h, reserve_bytes=everything)
    moved = SequenceSet(samples, on_host, dev, prefix_h, reserve_bytes=0)
    assert all(a.device.type == "cpu" for a in kept_on_host.aux)
    assert all(a.device.type == "cuda" for a in moved.aux)
    a, b = kept_on_host.batch([3, 0, 4]), moved.batch([3, 0, 4])
    assert a.aux.device.type == "cuda" and a.lens.device.type == "cuda"
    for x, y in ((a.aux, b.aux), (a.ids, b.ids), (a.lens, b.lens),
                 (a.prompt_lens, b.prompt_lens)):
        assert torch.equal(x, y)


def test_borrowed_prompt_rows_on_the_host_build_the_device_batches(tmp_path):
    """`share_prompts` on the GPU: a prompt continued three times keeps its rows once; with
    every row in pinned host memory (borrowed prompts are views of their owner's pinned
    rows) and with every row moved to the device, the batches are equal bit for bit, and
    equal to the same sequences' rows laid out whole."""
    runner, layer_ids = _aux_runner(tmp_path)
    g = torch.Generator().manual_seed(7)
    shots = torch.randint(0, 256, (13,), generator=g).tolist()
    prompts = [shots + torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 8)]
    samples = [Sample(prompts[i % 2], torch.randint(0, 256, (m,), generator=g).tolist())
               for i, m in enumerate([6, 4, 3, 7, 5, 2])]
    owner = prompt_owners(samples)
    skip = common_prefix_len(samples)
    dev = torch.device("cuda")
    everything = torch.cuda.get_device_properties(dev).total_memory
    prefix, rows = extract_aux(runner, samples, layer_ids, skip=skip,
                               reserve_bytes=everything, share_prompts=True)
    assert all(a.device.type == "cpu" and a.is_pinned() for a in rows)
    assert [len(a) for a in rows[2:]] == [len(s.output_ids) for s in samples[2:]]
    on_host = SequenceSet(samples, rows, dev, prefix, reserve_bytes=everything,
                          prompt_owner=owner)
    moved = SequenceSet(samples, rows, dev, prefix, reserve_bytes=0, prompt_owner=owner)
    assert all(p is None or p.is_pinned() for p in on_host.prompt_aux)
    assert all(p is None or p.device.type == "cuda" for p in moved.prompt_aux)
    whole = SequenceSet(samples, [torch.cat([rows[o][: len(s.prompt_ids) - skip], r])
                                  if o != i else r for i, (s, o, r)
                                  in enumerate(zip(samples, owner, rows, strict=True))],
                        dev, prefix, reserve_bytes=0)
    index = [5, 0, 2, 2, 3]
    a, b, c = on_host.batch(index, 8), moved.batch(index, 8), whole.batch(index, 8)
    assert a.aux.device.type == "cuda"
    for x, y, z in ((a.aux, b.aux, c.aux), (a.ids, b.ids, c.ids), (a.lens, b.lens, c.lens)):
        assert torch.equal(x, y) and torch.equal(y, z)


def test_a_training_step_queues_without_a_host_sync(tmp_path):
    """Batch, anchors, objective, backward and optimizer step of the DFlash and DSpark
    trainers launch without a host sync (torch's sync debug mode raises on one), so the host
    prepares the next step while the device runs this one."""
    dev = torch.device("cuda")
    for algorithm in ("dflash", "dspark"):
        data, trainer = _trainer(tmp_path, algorithm, dev)
        gen = torch.Generator().manual_seed(0)
        trainer.step(*_inputs(data, trainer, gen))  # the first step allocates and selects
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(2):
                stats = trainer.step(*_inputs(data, trainer, gen))
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert torch.isfinite(stats["loss"]).item(), algorithm


def _inputs(data: SequenceSet, trainer, gen: torch.Generator):
    index = torch.randint(len(data), (2,), generator=gen).tolist()
    batch = data.batch(index)
    return batch, sample_anchors(batch, 3, gen)


def _trainer(tmp_path, algorithm: str, dev: torch.device):
    dspark = algorithm == "dspark"
    shape = dict(num_layers=1, num_aux_layers=2, block_size=4, mask_token_id=MASK_TOKEN_ID)
    config = (dspark_draft_config(PRESETS["tiny-llama"], markov_rank=8, **shape) if dspark
              else draft_config(PRESETS["tiny-llama"], **shape))
    layer_ids = config["dflash_config"]["target_layer_ids"]
    runner = make_runner(tiny_checkpoint("tiny-llama", tmp_path), aux_layer_ids=layer_ids,
                         device="cuda", dtype="float32", max_total_tokens=2048,
                         max_running_requests=4)
    g = torch.Generator().manual_seed(6)
    samples = [Sample(torch.randint(0, 256, (n,), generator=g).tolist(),
                      torch.randint(0, 256, (m,), generator=g).tolist())
               for n, m in [(9, 14), (7, 11), (12, 9)]]
    prefix, rows = extract_aux(runner, samples, layer_ids, skip=common_prefix_len(samples),
                               final_hidden=dspark)
    data = SequenceSet(samples, rows, dev, prefix)
    draft = new_draft(config, dev, seed=0)
    cls = DSparkTrainer if dspark else Trainer
    trainer = cls(draft, runner.model.get_input_embeddings(), runner.model.lm_head_weight,
                  MASK_TOKEN_ID, TrainConfig(steps=10))
    trainer.slice_rows = 8  # several slices
    return data, trainer


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
