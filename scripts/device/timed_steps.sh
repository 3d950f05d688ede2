# Sourced first by the one-call device scripts, whose argument is OUT: strict mode, OUT made
# ($out), the package put first on PYTHONPATH, $bench the benches' folder; then `step NAME
# LIMIT_S CMD...` runs CMD under its own time limit with its log in $out/NAME.log, records
# "NAME rc=.. Ns" in $out/status.txt and prints the log's tail, so a slow or failing step
# leaves the others' results.
set -uo pipefail
out=${1:?usage: ${0##*/} OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
bench=benchmark/spec_decode
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0))s" >>"$out/status.txt"
  tail -n 40 "$out/$name.log"
}
