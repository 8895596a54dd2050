#!/usr/bin/env bash
# numpy's own test suite, plain and under `pagefold run`; compares the sets of
# failing tests. Exit 0 iff every test that fails (or errors) under pagefold
# also fails plain, and both runs completed.
#
#   bench/compat/numpy_suite.sh [--out DIR] [--timeout S] [PYTEST ARGS...]
#
# Without PYTEST ARGS it runs the full suite (`--pyargs numpy`, slow tests
# included). A subset, e.g. for CI:
#   bench/compat/numpy_suite.sh --pyargs numpy._core.tests.test_multiarray
#   bench/compat/numpy_suite.sh --pyargs numpy -k "einsum or linalg"
#
# Both runs get the same options: -p no:cacheprovider -q -rf
# --continue-on-collection-errors --junitxml=...
# and PYTHONHASHSEED=0; they run one after the other in a scratch directory
# (no project pytest.ini). numpy's conftest then uses its derandomized
# hypothesis profile. --timeout S stops each run after S seconds (it then
# counts as incomplete, and the script fails): a hang does not block. Results (junit XML, logs, the pagefold report) stay in
# DIR (default: a new temporary directory, printed).
# Environment: PAGEFOLD (the pagefold binary, default target/release/pagefold
# of this checkout), PYTHON (default python3), and the pagefold binary's own
# (PAGEFOLD_PRELOAD ...).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
pagefold="${PAGEFOLD:-$root/target/release/pagefold}"
python="${PYTHON:-python3}"
out=""
limit=0
while :; do
  case "${1:-}" in
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    --out) out="$2"; shift 2 ;;
    --timeout) limit="$2"; shift 2 ;;
    *) break ;;
  esac
done
[ "${1:-}" = "--" ] && shift
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--pyargs numpy)

die() { echo "numpy_suite: $*" >&2; exit 2; }
[ -x "$pagefold" ] || die "$pagefold not found (cargo build --release -p pagefold -p pagefold-preload)"
"$python" -c 'import numpy, pytest, hypothesis' 2>/dev/null \
  || die "$python lacks numpy, pytest or hypothesis (python3 -m pip install numpy pytest hypothesis)"
if [ -z "$out" ]; then out="$(mktemp -d /tmp/numpy_suite.XXXXXX)"; fi
mkdir -p "$out" && out="$(cd "$out" && pwd)"
work="$out/cwd"; mkdir -p "$work"
echo "numpy_suite: numpy $("$python" -c 'import numpy; print(numpy.__version__)'), pytest ${args[*]}, results in $out"

run() { # run MODE: plain | pagefold
  local mode=$1 t0 t1 rc
  local cmd=(timeout -k 30 "$limit" "$python" -m pytest -p no:cacheprovider -q -rf --continue-on-collection-errors --junitxml="$out/$mode.xml" "${args[@]}")
  rm -f "$out/$mode.xml"
  t0=$EPOCHREALTIME
  if [ "$mode" = plain ]; then
    (cd "$work" && PYTHONHASHSEED=0 "${cmd[@]}") >"$out/$mode.log" 2>&1
  else
    (cd "$work" && PYTHONHASHSEED=0 timeout -k 30 "$limit" "$pagefold" run --json --report "$out/pagefold-report.json" -- "${cmd[@]:4}") >"$out/$mode.log" 2>&1
  fi
  rc=$?
  t1=$EPOCHREALTIME
  echo "$rc $t0 $t1" >"$out/$mode.status"
}

run plain
run pagefold

"$python" "$root/bench/compat/compare_junit.py" --name numpy_suite --ok-codes 0,1 "$out"
