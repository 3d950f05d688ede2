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

INIT_GAIN = 2.0


def byte_level_tokenizer() -> Tokenizer:
    """256 byte tokens (ids 0..255) and the special tokens after them; no merges."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def init_weights(model: torch.nn.Module, gain: float) -> None:
    """Matrices ~ N(0, gain^2 / fan_in), embeddings ~ N(0, 1), norms at one.

    A gain above one lets every layer move the residual stream: with PyTorch's default init
    a random tiny model mostly repeats its input token, which makes a weak test subject.
    """
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.normal_(0.0, gain / p.shape[1] ** 0.5)
            elif p.dim() == 2:
                p.normal_(0.0, 1.0)


def write_checkpoint(preset: str, out: str | Path, seed: int = 0) -> Path:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    config = dict(PRESETS[preset])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = get_model_class(config["architectures"][0])(SimpleNamespace(**config))
    init_weights(model, INIT_GAIN)
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
