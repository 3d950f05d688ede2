"""A fresh DFlash (or DSpark) draft for a target, and the HF-format folder a trained one is
shipped as: config.json (with `dflash_config`; DSpark's head keys beside it),
model.safetensors, README.md, and for a large vocabulary its draft vocabulary
(`freq_<H>.pt`, SGLang's `--speculative-token-map` file, as FR-Spec drafts ship it)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

from sglang_aux.srt.configs.dflash_config import build_target_layer_ids
from sglang_aux.srt.configs.dspark_config import dspark_config_keys
from sglang_aux.srt.model_loader.model_cache import write_folder
from sglang_aux.srt.models.dflash import DFlashDraftModel
from sglang_aux.srt.models.registry import get_model_class
from sglang_aux.srt.models.weight_utils import checkpoint_tensors

# Keys a draft copies from its target: same width, heads and RoPE, so the target's embedding
# and LM head fit and positions mean the same.
_FROM_TARGET = ("vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta",
                "rope_parameters", "hidden_size", "num_attention_heads", "num_key_value_heads",
                "intermediate_size")
EVAL_LINE = "- Held-out accept length:"
# Shipped drafts keep every file under this (the package's data files stay small enough for
# the repository's 50 MB file limit, with margin)
MAX_SHARD_BYTES = 45_000_000
SHARD_INDEX = "model.safetensors.index.json"
# beside the card, what it says for a program: steps, seconds (the steps' own and each
# phase's), the final stats and the held-out curve
TRAINING_RECORD = "training.json"


def draft_config(target: dict, *, num_layers: int, num_aux_layers: int, block_size: int,
                 mask_token_id: int, intermediate_size: int | None = None) -> dict:
    """config.json of a draft of `num_layers` Qwen3-style layers at the target's width
    (MLP width `intermediate_size`, default the target's), reading `num_aux_layers` target
    layers picked by `build_target_layer_ids`."""
    head_dim = target.get("head_dim") or target["hidden_size"] // target["num_attention_heads"]
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        **{k: target[k] for k in _FROM_TARGET if k in target},
        **({"intermediate_size": intermediate_size} if intermediate_size else {}),
        "head_dim": head_dim,
        "torch_dtype": target.get("torch_dtype") or target.get("dtype") or "float32",
        "num_hidden_layers": num_layers,
        "tie_word_embeddings": False,
        "dflash_config": {
            "target_layer_ids": build_target_layer_ids(target["num_hidden_layers"],
                                                       num_aux_layers),
            "block_size": block_size,
            "mask_token_id": mask_token_id,
            "target_hidden_size": target["hidden_size"],
        },
    }


def dspark_draft_config(target: dict, *, markov_rank: int, **kwargs) -> dict:
    """`draft_config(target, **kwargs)` as a DSpark draft (its `block_size` is gamma) with a
    Markov head of rank `markov_rank` and a confidence head."""
    return {**draft_config(target, **kwargs), **dspark_config_keys(markov_rank)}


def new_draft(config: dict, device: torch.device, seed: int) -> DFlashDraftModel:
    """The config's draft class with fp32 master weights, PyTorch's default init from a
    private CPU seed (the global CUDA generator is never reseeded: graphs may already be
    captured in this process)."""
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        draft = get_model_class(config["architectures"][0])(SimpleNamespace(**config))
    return draft.to(device)


DEFAULT_TOKEN_MAP_SIZE = 32768  # ids in the draft vocabulary a draft ships (`--token-map-size`)


def token_map_file(size: int) -> str:
    """The draft vocabulary's file name in a draft folder (SGLang's FR-Spec drafts' name)."""
    return f"freq_{size}.pt"


def write_draft(draft: DFlashDraftModel, config: dict, out: str | Path, card: str,
                max_shard_bytes: int = MAX_SHARD_BYTES,
                token_map: tuple[int, list[int]] | None = None) -> Path:
    """Write the folder whole (`model_cache.write_folder`; a draft already there is replaced);
    weights in the config's `torch_dtype`, sharded as transformers shards a large checkpoint
    (`model-0000i-of-0000n.safetensors` of at most `max_shard_bytes` each, plus
    `model.safetensors.index.json`) when they do not fit one file; `token_map` (size, ids):
    the draft vocabulary, saved as `token_map_file(size)`."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not (out / "config.json").is_file():
            raise FileExistsError(f"{out} exists and holds no draft: give --out a new folder")
        shutil.rmtree(out)
    dtype = getattr(torch, config["torch_dtype"])
    tensors = {k: v.detach().to("cpu", dtype).contiguous()
               for k, v in checkpoint_tensors(draft).items()}
    shards = _shards(tensors, max_shard_bytes)

    def write(tmp: Path) -> None:
        if len(shards) == 1:
            save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, names in enumerate(shards, 1):
                file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                save_file({k: tensors[k] for k in names}, str(tmp / file),
                          metadata={"format": "pt"})
                weight_map.update(dict.fromkeys(names, file))
            total = sum(t.numel() * t.element_size() for t in tensors.values())
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / SHARD_INDEX).write_text(json.dumps(index, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / "README.md").write_text(card)
        if token_map is not None:
            size, ids = token_map
            torch.save(torch.tensor(ids, dtype=torch.int64), tmp / token_map_file(size))

    return write_folder(out, write, keep_existing=False)


def _shards(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[list[str]]:
    """Tensor names in order, cut into runs of at most `max_bytes` (a larger tensor alone)."""
    shards, cur, used = [], [], 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        if cur and used + n > max_bytes:
            shards.append(cur)
            cur, used = [], 0
        cur.append(name)
        used += n
    return shards + ([cur] if cur else [])


def render_card(name: str, info: dict) -> str:
    """The README card: what the draft is, its data and training, results and the command."""
    dc = info["config"]["dflash_config"]
    acc = " ".join(f"{a:.3f}" for a in info["acc"])
    kind = "DSpark" if "markov_rank" in info["config"] else "DFlash"
    heads = "" if kind == "DFlash" else f"""\
- Heads: Markov rank {info['config']['markov_rank']} (vanilla), a confidence head on \
[hidden; markov_w1[previous token]]. Block size = gamma: row k proposes the token at \
anchor + k + 1. Loss: the paper's 0.1 cross-entropy + 0.9 L1 distance to the target's \
distribution + 1.0 confidence BCE against 1 - TV, rows weighted exp(-k / {info['gamma']}).
- Expected accept length (rejection sampling, training blocks) \
{info['expected_accept']:.3f}; confidence mean absolute error {info['confidence_error']:.3f}.
"""
    return f"""# {name}

{kind} draft for `{info['target']}`, trained by `sglang_aux.tools.train_dflash`.

- Draft: {info['config']['num_hidden_layers']} Qwen3-style layer(s), hidden \
{info['config']['hidden_size']}, MLP {info['config']['intermediate_size']}, \
fc {len(dc['target_layer_ids'])} x {dc['target_hidden_size']} \
-> {info['config']['hidden_size']}; the target's embedding and LM head (frozen).
- Target layers read: {dc['target_layer_ids']}; block size {dc['block_size']}; mask token \
`{info['mask_token']}` (id {dc['mask_token_id']}).
- Data: {info['num_samples']} continuations by the target, those of two tokens or more, \
of {info['data']}; {info['num_tokens']} tokens.
- Training: {info['steps']} steps x {info['batch_size']} sequences x {info['anchors']} blocks, \
AdamW lr {info['lr']} (warm-up + cosine), loss decay gamma {info['gamma']}, seed {info['seed']}.
{info.get('init_line', '')}\
- Final loss {info['loss']:.4f}; accuracy per offset 1..{len(info['acc'])}: {acc}; \
training accept length {info['accept']:.3f}.
{info.get('val_line', '')}{heads}{EVAL_LINE} {info.get('eval', 'not measured')}
- Time: {info['timings']} on {info['device']}.

Use: `--model-path {info['target']} --speculative-algorithm {kind.upper()} \
--speculative-draft-model-path <this folder>` (a shipped draft also by its name).
{info.get('token_map_line', '')}
Made with:

```bash
{info['command']}
```
"""


def set_card_eval(out: str | Path, text: str) -> None:
    """Replace the card's held-out accept-length line (an evaluation run after training)."""
    path = Path(out) / "README.md"
    card = re.sub(rf"^{re.escape(EVAL_LINE)}.*$", f"{EVAL_LINE} {text}", path.read_text(),
                  flags=re.M)
    path.write_text(card)
