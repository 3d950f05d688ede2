#!/usr/bin/env bash
# SGLang 0.5.23's GSM8K harness (`python -m sglang.test.few_shot_gsm8k`) for the H200 device
# machine, which cannot reach a package index: the wheels of the packages the harness imports
# beyond the machine's image (Python 3.12), and SGLang's Python sources without its compiled
# extensions (the `sglang` wheel is 39 MB of mostly Rust extensions the client never loads),
# saved to the ignored .carry/sglang-client (about 20 MB).
#
#   scripts/device/fetch_sglang_client.sh
#
# On the device (carry .carry/sglang-client):
#   python3 -m sglang_aux.test.sglang_client --offline .carry/sglang-client
# installs them where `benchmark/gsm8k/run_sglang_harness.sh` finds them.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-.carry/sglang-client}
PYTHON_VERSION=${PYTHON_VERSION:-3.12}
# What the harness imports that the image lacks (found by `python -X importtime` of a run):
# the sgl frontend's runtime endpoint, SGLang's srt.utils (orjson, IPython.display for a
# notebook helper), and what those import; checked in a venv holding only the image's packages.
PACKAGES=(pybase64 pillow msgspec pyzmq aiohttp multidict yarl propcache aiohappyeyeballs
          aiosignal frozenlist dill tabulate psutil attrs orjson ipython traitlets pygments)
PLATFORMS=(manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_28_x86_64)
platform_flags=()
for p in "${PLATFORMS[@]}"; do platform_flags+=(--platform "$p"); done
rm -rf "$DEST"; mkdir -p "$DEST"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
  --implementation cp "${platform_flags[@]}" -d "$DEST" "${PACKAGES[@]}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps -d "$work" sglang==0.5.23
(cd "$work" && python3 -m zipfile -e sglang-*.whl unpacked)
(cd "$work/unpacked" && find sglang -name "*.py" -o -name "*.json" -o -name "*.jinja" \
  | tar czf - -T -) > "$DEST/sglang-0.5.23-py.tgz"
ls -1 "$DEST"
echo "$(du -sh "$DEST" | cut -f1) in $DEST"
