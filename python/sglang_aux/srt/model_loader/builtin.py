"""Built-in models: names that resolve to folders the package makes in its cache."""

from __future__ import annotations

import os
from pathlib import Path

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.managers.tokenizer import Tokenizer
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.tools.presets import PRESETS

DEFAULT_MODEL = "tiny-k3"


def cache_dir() -> Path:
    return Path(os.environ.get("SGLANG_AUX_CACHE", Path.home() / ".cache" / "sglang_aux"))


def resolve_model_path(name_or_path: str | None) -> str:
    """A folder path as given; a preset name (or None: the default) as its cached folder,
    written on first use."""
    name = name_or_path or DEFAULT_MODEL
    if name not in PRESETS:
        if not Path(name).is_dir():
            raise FileNotFoundError(
                f"model path {name!r} is neither a folder nor a built-in model "
                f"({', '.join(sorted(PRESETS))})"
            )
        return name
    out = cache_dir() / name
    if not (out / "config.json").is_file():
        from sglang_aux.tools.make_checkpoint import write_checkpoint

        write_checkpoint(name, out)
    return str(out)


def _config_of(name_or_path: str | None, args: ServerArgs) -> ModelConfig:
    if args.load_format == "dummy" and (name_or_path or DEFAULT_MODEL) in PRESETS:
        name = name_or_path or DEFAULT_MODEL
        return ModelConfig.from_dict(dict(PRESETS[name]), name, args.dtype, args.context_length)
    return ModelConfig.from_pretrained(resolve_model_path(name_or_path), args.dtype,
                                       args.context_length)


def resolve_draft(args: ServerArgs) -> ModelConfig:
    """The draft's config; `--speculative-draft-model-path` may name a preset too."""
    if not args.speculative_draft_model_path:
        raise ValueError(
            f"--speculative-algorithm {args.speculative_algorithm} needs "
            "--speculative-draft-model-path (a DFlash draft folder)"
        )
    return _config_of(args.speculative_draft_model_path, args)


def resolve_model(args: ServerArgs) -> tuple[ModelConfig, Tokenizer]:
    """The model config and tokenizer `args` name. With `--load-format dummy` a preset name
    needs no folder (its weights are random anyway); otherwise presets are made on first use,
    and `args.model_path` is set to the folder."""
    config = _config_of(args.model_path, args)
    args.model_path = config.model_path
    if args.tokenizer_path is None and args.model_path in PRESETS:
        return config, Tokenizer.byte_level()
    return config, Tokenizer.from_dir(args.tokenizer_path or args.model_path)
