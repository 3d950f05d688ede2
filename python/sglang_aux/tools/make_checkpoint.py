"""Write an HF-format model folder from a preset: random init with a fixed seed.

    python -m sglang_aux.tools.make_checkpoint --preset tiny-k3 --out /tmp/tiny-k3
"""

from __future__ import annotations

import argparse

from sglang_aux.srt.configs.presets import PRESETS
from sglang_aux.srt.model_loader.preset_checkpoint import write_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(write_checkpoint(args.preset, args.out, args.seed))


if __name__ == "__main__":
    main()
