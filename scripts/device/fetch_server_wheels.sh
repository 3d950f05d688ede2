#!/usr/bin/env bash
# Wheels the H200 device machine needs to run `python -m sglang_aux.launch_server` (its image
# has no FastAPI stack and it cannot reach a package index), saved to the ignored .carry/wheels
# and checked to install offline into an empty folder.
#
#   scripts/device/fetch_server_wheels.sh          # here, from any folder
#
# Then carry `.carry/wheels` and begin the device command with:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/wheels/*.whl \
#     && export PYTHONPATH=/tmp/site
#
# Versions are the ones installed here (what the tests ran with), else the newest; but
# typing-extensions is always the newest: it only ever adds names, and anyio 4.16 needs
# >= 4.16 where an older one may be installed here. With --no-deps every requirement is named
# below: FastAPI's, Starlette's, pydantic's, uvicorn's and jinja2's (chat templates) closure
# for Python 3.12.
set -euo pipefail

cd "$(dirname "$0")/../.."
DEST=.carry/wheels
PYTHON_VERSION=3.12
PACKAGES=(
  fastapi starlette annotated-doc opentelemetry-api
  pydantic pydantic-core annotated-types typing-inspection typing-extensions
  uvicorn h11 click httptools uvloop
  anyio sniffio idna
  jinja2 markupsafe
)
UNPINNED=(typing-extensions)
PLATFORMS=(manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_28_x86_64)

local_version() {
  python3 -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$1"
}

mkdir -p "$DEST"
platform_flags=()
for p in "${PLATFORMS[@]}"; do platform_flags+=(--platform "$p"); done
for pkg in "${PACKAGES[@]}"; do
  version=
  [[ " ${UNPINNED[*]} " == *" $pkg "* ]] || version=$(local_version "$pkg")
  spec=$pkg${version:+==$version}
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
    --implementation cp "${platform_flags[@]}" -d "$DEST" "$spec"
done

# The set is complete when the server's requirements resolve from it alone.
check=$(mktemp -d)
trap 'rm -rf "$check"' EXIT
python3 -m pip install -q --no-index --find-links "$DEST" --target "$check" \
  --python-version "$PYTHON_VERSION" --only-binary=:all: "${platform_flags[@]}" \
  fastapi uvicorn jinja2
ls -1 "$DEST"
echo "$(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST"
