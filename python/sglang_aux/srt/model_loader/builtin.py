"""Built-in models: names that resolve to folders the package makes in its cache."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.configs.presets import DEFAULT_MODEL, PRESETS
from sglang_aux.srt.model_loader.gguf_sources import (
    QWEN25_CODER_0_5B,
    QWEN25_CODER_1_5B,
    PartPackages,
    assemble_parts,
    packaged_smollm2_gguf,
)
from sglang_aux.srt.model_loader.model_cache import (
    cache_dir,
    check_model_folder,
    check_tokenizer_folder,
)
from sglang_aux.srt.model_loader.preset_checkpoint import write_checkpoint
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

# DFlash drafts the project trained, shipped as package data.
DRAFTS_DIR = Path(__file__).resolve().parents[2] / "data" / "drafts"
SHIPPED_DRAFTS = ("smollm2-135m-instruct-dflash-b8",)
# Drafts too large for the repository (their card says why): one command trains each into the
# cache, where its name then resolves.
TRAINED_DRAFTS = ("qwen2.5-coder-1.5b-instruct-dflash-b16-gsm8k",
                  "qwen2.5-coder-1.5b-instruct-dflash-b16",
                  "qwen2.5-coder-1.5b-instruct-dflash-b16-more",
                  "qwen2.5-coder-1.5b-instruct-dspark-b15-gsm8k",
                  "qwen2.5-coder-1.5b-instruct-dspark-b15", "smollm2-135m-instruct-dspark-b7")


def assembled_gguf(packages: PartPackages) -> Path:
    """The GGUF assembled from part packages, kept in the cache (`<cache>/gguf/<file>`; a
    file staged there by other means is used as is when its size is right)."""
    return assemble_parts(packages, cache_dir() / "gguf" / packages.file_name)


# Real models imported on first use from the GGUF file their source gives (each source raises
# FileNotFoundError naming the pip command when its packages are missing).
IMPORTED_MODELS: dict[str, Callable[[], Path]] = {
    "smollm2-135m-instruct": packaged_smollm2_gguf,
    "qwen2.5-coder-1.5b-instruct": lambda: assembled_gguf(QWEN25_CODER_1_5B),
    "qwen2.5-coder-0.5b-instruct": lambda: assembled_gguf(QWEN25_CODER_0_5B),
}


def _write_builtin(name: str, out: Path) -> None:
    """Make the cache folder of a built-in model; one left without config.json (written
    in place by an older version that was interrupted) is replaced."""
    if out.is_dir() and any(out.iterdir()):
        logger.warning("%s is incomplete (no config.json): rebuilding it", out)
        shutil.rmtree(out)
    if name in IMPORTED_MODELS:
        from sglang_aux.srt.model_loader.gguf_import import import_gguf

        import_gguf(IMPORTED_MODELS[name](), out, keep_existing=True)
    else:
        write_checkpoint(name, out, keep_existing=True)


def trained_draft_dir(name: str) -> Path:
    """Where `train_dflash --recipe NAME` writes the draft NAME."""
    return cache_dir() / "drafts" / name


def _trained_draft(name: str) -> str:
    path = trained_draft_dir(name)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"draft {name!r} is not trained on this machine ({path}); train it (one GPU; "
            f"5 to 15 minutes on an H200) with `python -m sglang_aux.tools.train_dflash "
            f"--recipe {name}`"
        )
    return str(path)


def _shipped_draft(name: str) -> str:
    path = DRAFTS_DIR / name
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"draft {name!r} is not in this build of the package ({path}); train it with "
            "`python -m sglang_aux.tools.train_dflash`"
        )
    return str(path)


def _imported_file(gguf: Path) -> str:
    """A GGUF file given as the model path: imported once into
    `<cache>/gguf-imports/<stem>-<bytes>` (the size tells a replaced file apart)."""
    out = cache_dir() / "gguf-imports" / f"{gguf.stem}-{gguf.stat().st_size}"
    if not (out / "config.json").is_file():
        from sglang_aux.srt.model_loader.gguf_import import import_gguf

        import_gguf(gguf, out, keep_existing=True)
    return str(out)


def resolve_model_path(name_or_path: str | None) -> str:
    """A folder path as given; a `.gguf` file as the folder it is imported to; a built-in name
    (or None: the default) as its folder: presets
    are written to the cache on first use, imported models (`smollm2-135m-instruct`,
    `qwen2.5-coder-1.5b-instruct`, ...) are imported there from their installed GGUF file,
    shipped drafts come from the package."""
    name = name_or_path or DEFAULT_MODEL
    if name.endswith(".gguf") and Path(name).is_file():
        return _imported_file(Path(name))
    if name in SHIPPED_DRAFTS:
        return _shipped_draft(name)
    if name in TRAINED_DRAFTS:
        return _trained_draft(name)
    if name not in PRESETS and name not in IMPORTED_MODELS:
        if not Path(name).is_dir():
            builtins = sorted([*PRESETS, *IMPORTED_MODELS, *SHIPPED_DRAFTS, *TRAINED_DRAFTS])
            raise FileNotFoundError(
                f"model path {name!r} is neither a folder nor a built-in model "
                f"({', '.join(builtins)})"
            )
        return name
    out = cache_dir() / name
    if not (out / "config.json").is_file():
        _write_builtin(name, out)
    return str(out)


def _config_of(name_or_path: str | None, args: ServerArgs) -> ModelConfig:
    if args.load_format == "dummy" and (name_or_path or DEFAULT_MODEL) in PRESETS:
        name = name_or_path or DEFAULT_MODEL
        return ModelConfig.from_dict(dict(PRESETS[name]), name, args.resolved_dtype(),
                                     args.context_length)
    path = resolve_model_path(name_or_path)
    check_model_folder(path, weights=args.load_format != "dummy")
    return ModelConfig.from_pretrained(path, args.resolved_dtype(), args.context_length)


def resolve_draft(args: ServerArgs) -> ModelConfig:
    """The draft's config; `--speculative-draft-model-path` may name a preset or a shipped
    draft (`smollm2-135m-instruct-dflash-b8`) too."""
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
    check_tokenizer_folder(args.tokenizer_path or args.model_path)
    return config, Tokenizer.from_dir(args.tokenizer_path or args.model_path)
