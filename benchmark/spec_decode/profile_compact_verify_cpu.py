"""Where a DFlash verify step's time goes on CPU, static against compact verify: SmolLM2 with its
shipped draft, 32 GSM8K 5-shot prompts at once, 64 forced tokens each, eager steps; the verify
forwards' seconds and, inside them, the attention's (torch-native backend).

    python benchmark/spec_decode/profile_compact_verify_cpu.py static
    python benchmark/spec_decode/profile_compact_verify_cpu.py compact [MAX_TOKENS]

Compact's token-major layout makes each verified token a pseudo-request that gathers its
request's whole context (`TorchNativeAttnBackend._forward_fixed`), so the attention reads
tokens x context where static reads requests x context (docs/dspark.md)."""

import argparse
import json
import os
import time

from sglang_aux.srt.layers.attention import torch_native_backend
from sglang_aux.test.runtime_utils import engine_in_verify_mode


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["static", "compact"])
    p.add_argument("max_tokens", type=int, nargs="?", default=None,
                   help="--compact-verify-max-tokens (compact; default: the budget fraction)")
    p.add_argument("--requests", type=int, default=32)
    args = p.parse_args()
    gsm8k = os.environ.get("SGLANG_AUX_GSM8K_DIR", "../shared/data/gsm8k")
    with open(f"{gsm8k}/train.jsonl") as f:
        shots = [json.loads(line) for _, line in zip(range(5), f, strict=False)]
    with open(f"{gsm8k}/test.jsonl") as f:
        questions = [json.loads(line)["question"] for line in f][: args.requests]
    prefix = "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)
    prompts = [f"{prefix}Question: {q}\nAnswer:" for q in questions]

    attention: list[float] = []
    fixed = torch_native_backend.TorchNativeAttnBackend._forward_fixed

    def timed_attention(self, q, layer, fb, *rest):
        t = time.perf_counter()
        out = fixed(self, q, layer, fb, *rest)
        if fb.forward_mode.name == "TARGET_VERIFY":
            attention.append(time.perf_counter() - t)
        return out

    torch_native_backend.TorchNativeAttnBackend._forward_fixed = timed_attention
    kw = dict(model_path="smollm2-135m-instruct", speculative_algorithm="DFLASH",
              speculative_draft_model_path="smollm2-135m-instruct-dflash-b8", device="cpu",
              max_running_requests=args.requests, disable_decode_cuda_graph=True,
              disable_prefill_cuda_graph=True, context_length=2048)
    if args.max_tokens is not None:
        kw["compact_verify_max_tokens"] = args.max_tokens
    engine = engine_in_verify_mode(args.mode, **kw)
    verify: list[tuple[int, float]] = []
    forward = engine.worker.target_runner.forward

    def timed_forward(fb):
        if not fb.forward_mode.is_cuda_graph():
            return forward(fb)
        t = time.perf_counter()
        out = forward(fb)
        verify.append((fb.batch_size, time.perf_counter() - t))
        return out

    engine.worker.target_runner.forward = timed_forward
    engine.generate(prompts[:2], {"max_new_tokens": 8, "temperature": 0})  # warm-up
    verify.clear()
    attention.clear()
    start = time.perf_counter()
    engine.generate(prompts, {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True})
    total = time.perf_counter() - start
    full = [(n, round(t, 3)) for n, t in verify if n >= args.requests][:4]
    print(f"{args.mode} {args.max_tokens or ''}: total {total:.1f} s; {len(verify)} verify "
          f"steps {sum(t for _, t in verify):.1f} s, of which attention {sum(attention):.1f} s; "
          f"first full steps (forward batch size, s): {full}")


if __name__ == "__main__":
    main()
