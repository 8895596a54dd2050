#!/usr/bin/env bash
# A Python package's own pytest suite (numpy's, pandas', ...), plain and under
# `pagefold run`; compares the sets of failing tests. Exit 0 iff every test
# that fails (or errors) under pagefold also fails plain, and both runs
# completed.
#
#   bench/compat/pytest_suite.sh [--package P] [--out DIR] [--timeout S] [PYTEST ARGS...]
#
# --package P (default numpy) is the package under test; without PYTEST ARGS
# its full suite runs (`--pyargs P`, slow tests included). Subsets:
#   bench/compat/pytest_suite.sh --pyargs numpy._core.tests.test_multiarray
#   bench/compat/pytest_suite.sh --package pandas --pyargs pandas.tests.frame -m "not slow"
#
# Both runs get the same options: -p no:cacheprovider -q -rf
# --continue-on-collection-errors --junitxml=...
# and PYTHONHASHSEED=0; they run one after the other in a scratch directory
# (no project pytest.ini). numpy's conftest then uses its derandomized
# hypothesis profile. --timeout S stops each run after S seconds (it then
# counts as incomplete, and the script fails): a hang does not block. Results
# (junit XML, logs, the pagefold report) stay in DIR (default: a new
# temporary directory, printed).
# Environment: PAGEFOLD (the pagefold binary, default target/release/pagefold
# of this checkout), PYTHON (default python3), and the pagefold binary's own
# (PAGEFOLD_PRELOAD ...).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
pagefold="${PAGEFOLD:-$root/target/release/pagefold}"
python="${PYTHON:-python3}"
out=""
limit=0
package=numpy
while :; do
  case "${1:-}" in
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    --package) package="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --timeout) limit="$2"; shift 2 ;;
    *) break ;;
  esac
done
[ "${1:-}" = "--" ] && shift
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--pyargs "$package")
name="${package}_suite"

die() { echo "$name: $*" >&2; exit 2; }
[ -x "$pagefold" ] || die "$pagefold not found (cargo build --release -p pagefold -p pagefold-preload)"
"$python" -c "import $package, pytest, hypothesis" 2>/dev/null \
  || die "$python lacks $package, pytest or hypothesis (python3 -m pip install $package pytest hypothesis)"
if [ -z "$out" ]; then out="$(mktemp -d "/tmp/$name.XXXXXX")"; fi
mkdir -p "$out" && out="$(cd "$out" && pwd)"
work="$out/cwd"; mkdir -p "$work"
echo "$name: $package $("$python" -c "import $package; print($package.__version__)"), pytest ${args[*]}, results in $out"

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

"$python" "$root/bench/compat/compare_junit.py" --name "$name" --ok-codes 0,1 "$out"
