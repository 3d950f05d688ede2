"""Write an HF-format model folder from a preset: random init with a fixed seed.

    python -m sglang_aux.tools.make_checkpoint --preset tiny-k3 --out /tmp/tiny-k3
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from sglang_aux.srt.models.registry import get_model_class
from sglang_aux.tools.presets import PRESETS, SPECIAL_TOKENS


def byte_level_tokenizer() -> Tokenizer:
    """256 byte tokens (ids 0..255) and the special tokens after them; no merges."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def write_checkpoint(preset: str, out: str | Path, seed: int = 0) -> Path:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    config = dict(PRESETS[preset])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = get_model_class(config["architectures"][0])(SimpleNamespace(**config))
    dtype = getattr(torch, config["torch_dtype"])
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()
               if not k.endswith("cos_sin_cache")}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    byte_level_tokenizer().save(str(out / "tokenizer.json"))
    tok_cfg = {"eos_token": SPECIAL_TOKENS[0], "bos_token": None, "add_bos_token": False}
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(write_checkpoint(args.preset, args.out, args.seed))


if __name__ == "__main__":
    main()
