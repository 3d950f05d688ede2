"""Training over the draft vocabulary on CUDA (bf16 autocast, the loss over the LM head's
rows of the map): a tiny draft trained with `--train-over-token-map` on the GPU is served
with its map from the config, with CUDA graphs, and greedy DFlash gives the target-only
tokens; every `--sdpa-backend` trains on CUDA; host rows copied in on a stream of their own
train the same draft; compiled (the default on CUDA) and packed steps train as the eager
one, DFlash's and DSpark's; DSpark's kept logsumexp gives the whole softmax's step; the
step profile says the steps' peak memory; MXFP8 rows encode as on the CPU and train the same
draft from the device and from pinned host memory."""

import json
import logging
import re
import sys

import pytest
import torch
from safetensors.torch import load_file

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.gsm8k_data import local_path_or_skip
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.tools import train_dflash
from sglang_aux.tools.dflash_training.export import TRAINING_RECORD
from sglang_aux.tools.dflash_training.mxfp8_rows import MXFP8Rows
from sglang_aux.tools.dflash_training.target_head import logsumexp_columns

register_cuda_ci(est_time=180, suite="default")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_draft_trained_over_its_map_on_cuda_is_served_losslessly_with_graphs(tmp_path):
    local_path_or_skip("train")
    target = tiny_checkpoint("tiny-llama", tmp_path / "ckpt")
    out = tmp_path / "draft"
    train_dflash.main(["--smoke", "--target", target, "--out", str(out), "--device", "cuda",
                       "--num-samples", "8", "--steps", "30", "--token-map-size", "96",
                       "--train-over-token-map"])
    config = json.loads((out / "config.json").read_text())
    assert config["dflash_config"]["token_map"] == "freq_96.pt"
    common = dict(model_path=target, device="cuda", max_total_tokens=4096,
                  max_running_requests=4)
    prompts = ["Question: Tom has 3 apples.", "12 + 30 =", "The quick brown"]
    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    ref = Engine(**common).generate(prompts, params)
    engine = Engine(**common, speculative_algorithm="DFLASH",
                    speculative_draft_model_path=str(out))
    ids = torch.load(out / "freq_96.pt")  # the samples may write fewer distinct ids
    assert 0 < len(ids) <= 96
    assert engine.worker.draft_runner.model.lm_head_weight.shape[0] == len(ids)
    spec = engine.generate(prompts, params)
    for r, s in zip(ref, spec, strict=True):
        assert s["output_ids"] == r["output_ids"]
        assert s["meta_info"]["spec_verify_ct"] > 0
    assert engine.worker.target_runner.forwards_info()["TARGET_VERIFY"]["graph"] > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_each_sdpa_backend_trains_on_cuda(tmp_path):
    """`--sdpa-backend efficient` runs (its kernel takes no grouped K/V heads: they are
    repeated for it) and trains as torch's own choice does, on the default context bucket."""
    local_path_or_skip("train")
    target = tiny_checkpoint("tiny-llama", tmp_path / "ckpt")
    losses = {}
    for backend in ("auto", "efficient", "math"):
        out = tmp_path / backend
        train_dflash.main(["--smoke", "--target", target, "--out", str(out), "--device",
                           "cuda", "--num-samples", "8", "--steps", "12",
                           "--sdpa-backend", backend])
        card = (out / "README.md").read_text()
        losses[backend] = float(re.search(r"Final loss ([0-9.]+)", card).group(1))
    assert losses["efficient"] == pytest.approx(losses["auto"], rel=0.05)
    assert losses["math"] == pytest.approx(losses["auto"], rel=0.05)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_host_rows_copied_on_their_own_stream_train_the_same_draft(tmp_path, caplog):
    """`--device-reserve-gb` larger than the device keeps every sample's rows in pinned host
    memory; `--batch-stream` (the default) copies a batch's rows in on a stream of their own:
    the same draft, bitwise, as the copies in line with the steps (`--no-batch-stream`)."""
    local_path_or_skip("train")
    target = tiny_checkpoint("tiny-llama", tmp_path / "ckpt")
    samples = tmp_path / "samples.jsonl"
    common = ["--smoke", "--target", target, "--device", "cuda", "--num-samples", "8",
              "--samples-file", str(samples)]
    train_dflash.main([*common, "--phase", "data"])
    # the math kernels: deterministic backward, so two runs can be compared bit for bit
    common += ["--phase", "train", "--steps", "12", "--device-reserve-gb", "100000",
               "--sdpa-backend", "math"]
    with caplog.at_level(logging.INFO):
        train_dflash.main([*common, "--out", str(tmp_path / "inline"), "--no-batch-stream"])
    assert re.search(r"aux states of (\d+)/\1 sequences in host memory", caplog.text)
    train_dflash.main([*common, "--out", str(tmp_path / "stream")])
    a = load_file(tmp_path / "inline/model.safetensors")
    b = load_file(tmp_path / "stream/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mxfp8_rows_encode_as_on_the_cpu_and_train_from_the_host_as_from_the_device(tmp_path):
    """`--mxfp8-rows` on CUDA: the Triton quantizer's bytes and their decoding equal the CPU
    reference's (bf16 rows with a kept logsumexp, fp32 rows); every row in pinned host memory
    (uint8 rows packed in the host chunks) trains the draft every row on the device trains,
    and so does the Triton decoder (`--mxfp8-rows-decode triton`: the same bytes)."""
    local_path_or_skip("train")
    g = torch.Generator().manual_seed(0)
    for dtype, raw in ((torch.bfloat16, 2), (torch.float32, 1)):
        hidden = torch.randn(300, 4 * 96, generator=g) * torch.logspace(-3, 3, 4 * 96)
        rows = torch.cat([hidden.to(dtype),
                          logsumexp_columns(torch.randn(300, generator=g) * 50, dtype)], -1)
        codec = MXFP8Rows(4 * 96, raw, dtype)
        cpu = codec.encode(rows)
        assert torch.equal(codec.encode(rows.cuda()).cpu(), cpu)
        # bit for bit: a kept logsumexp's low half read as bf16 may be a NaN (never equal)
        assert torch.equal(codec.decode(cpu.cuda()).cpu().view(torch.uint8),
                           codec.decode(cpu).view(torch.uint8))
        # the Triton decoder, a batch's [N, T, width] with zero padding: the same bytes
        batch = torch.cat([cpu, torch.zeros_like(cpu[:60])]).view(3, 120, -1).cuda()
        triton_codec = MXFP8Rows(4 * 96, raw, dtype, decoder="triton")
        assert torch.equal(triton_codec.decode(batch).view(torch.uint8),
                           codec.decode(batch).view(torch.uint8))
    target = tiny_checkpoint("tiny-llama", tmp_path / "ckpt")
    samples = tmp_path / "samples.jsonl"
    common = ["--smoke", "--target", target, "--device", "cuda", "--num-samples", "8",
              "--samples-file", str(samples)]
    train_dflash.main([*common, "--phase", "data"])
    common += ["--phase", "train", "--steps", "12", "--sdpa-backend", "math", "--mxfp8-rows"]
    train_dflash.main([*common, "--out", str(tmp_path / "host"), "--device-reserve-gb", "100000"])
    train_dflash.main([*common, "--out", str(tmp_path / "device"), "--device-reserve-gb", "0"])
    train_dflash.main([*common, "--out", str(tmp_path / "triton"), "--device-reserve-gb", "0",
                       "--mxfp8-rows-decode", "triton"])
    a = load_file(tmp_path / "host/model.safetensors")
    b = load_file(tmp_path / "device/model.safetensors")
    c = load_file(tmp_path / "triton/model.safetensors")
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) and torch.equal(b[k], c[k]) for k in a)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_step_profile_says_the_steps_peak_memory(tmp_path, caplog):
    """`--profile-steps` on CUDA logs the most device memory the profiled steps held above
    what was allocated when they began (the activations, the loss's slice, the batch): more
    than nothing, less than the device."""
    local_path_or_skip("train")
    target = tiny_checkpoint("tiny-llama", tmp_path / "ckpt")
    with caplog.at_level(logging.INFO):
        train_dflash.main(["--smoke", "--target", target, "--out", str(tmp_path / "d"),
                           "--device", "cuda", "--num-samples", "8", "--steps", "12",
                           "--profile-steps", "4"])
    peak = float(re.search(r"([0-9.]+) MiB at most above the steps' start", caplog.text)[1])
    assert 0 < peak < torch.cuda.get_device_properties(0).total_memory / 2**20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("algorithm", ["dflash", "dspark", "dspark_vocab", "dspark_lse"])
def test_compiled_and_packed_steps_train_as_the_eager_one_on_cuda(tmp_path, algorithm):
    """The default step on CUDA (the draft's forward and the loss's slices through
    torch.compile), `--pack-context` (the context pass over the sequences' own rows alone)
    and both train as the eager step (`--no-compile`; bf16 autocast, the default context
    bucket), for a DFlash draft and for a DSpark one (its forward and its own loss's
    slices compiled), the latter over a draft vocabulary too, and there with the target's
    kept logsumexp (`--target-logsumexp`: bf16 rows carry its float in two columns)."""
    local_path_or_skip("train")
    target = tiny_checkpoint("tiny-llama", tmp_path / "ckpt")
    extra = ["--algorithm", "dspark", "--block-size", "4"] if "dspark" in algorithm else []
    if algorithm in ("dspark_vocab", "dspark_lse"):  # the Markov rows gathered
        extra += ["--token-map-size", "64", "--train-over-token-map"]
    if algorithm == "dspark_lse":
        extra += ["--target-logsumexp"]
    losses = {}
    for flags in (("--no-compile",), (), ("--no-compile", "--pack-context"),
                  ("--pack-context",)):
        out = tmp_path / ("-".join(flags) or "default")
        train_dflash.main(["--smoke", "--target", target, "--out", str(out), "--device",
                           "cuda", "--num-samples", "8", "--steps", "12", *extra, *flags])
        card = (out / "README.md").read_text()
        losses[flags] = float(re.search(r"Final loss ([0-9.]+)", card).group(1))
    eager = losses[("--no-compile",)]
    for flags, loss in losses.items():
        assert loss == pytest.approx(eager, rel=0.02), flags


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_kept_logsumexp_gives_the_whole_softmaxs_first_step_on_cuda(tmp_path):
    """`--target-logsumexp` on CUDA (bf16 rows, the compiled step): the first step's loss and
    accept are the whole softmax's (the same batch and draft; bf16 logits, hence 1e-3)."""
    local_path_or_skip("train")
    target = tiny_checkpoint("tiny-llama", tmp_path / "ckpt")
    records = []
    for flags in ([], ["--target-logsumexp"]):
        out = tmp_path / f"draft{len(flags)}"
        train_dflash.main(["--smoke", "--target", target, "--out", str(out), "--device",
                           "cuda", "--num-samples", "8", "--algorithm", "dspark",
                           "--block-size", "4", "--token-map-size", "64",
                           "--train-over-token-map", "--steps", "1", "--lr", "1e-12",
                           "--log-every", "1", *flags])
        records.append(json.loads((out / TRAINING_RECORD).read_text()))
    assert records[1]["loss"] == pytest.approx(records[0]["loss"], rel=1e-3)
    assert records[1]["accept"] == pytest.approx(records[0]["accept"], abs=0.05)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
