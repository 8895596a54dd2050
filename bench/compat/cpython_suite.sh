#!/usr/bin/env bash
# CPython's own regression tests (`python3 -m test`), plain and under
# `pagefold run`; compares the sets of failing tests. Exit 0 iff every test
# that fails under pagefold also fails plain, and both runs completed.
#
#   bench/compat/cpython_suite.sh [--out DIR] [--timeout S] [-- REGRTEST ARGS...]
#
# Without REGRTEST ARGS it runs every test this machine can run (`-j2`, no
# extra resources, a hung test stopped after 900 s). A subset, e.g. for CI:
#   bench/compat/cpython_suite.sh -- -j2 test_subprocess test_mmap test_array
#
# Both runs get --junit-xml and PYTHONHASHSEED=0 and run one after the other
# in a scratch directory. --timeout S stops each whole run after S seconds
# (it then counts as incomplete, and the script fails). Results (junit XML,
# logs, the pagefold report) stay in DIR (default: a new temporary directory,
# printed). Needs a Python with its regression tests (Debian: the
# libpython3.X-testsuite package). Environment: PAGEFOLD (the pagefold
# binary, default target/release/pagefold of this checkout), PYTHON (default
# python3).
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
[ ${#args[@]} -eq 0 ] && args=(-j2 --timeout 900)

die() { echo "cpython_suite: $*" >&2; exit 2; }
[ -x "$pagefold" ] || die "$pagefold not found (cargo build --release -p pagefold -p pagefold-preload)"
"$python" -c "import importlib.util as u; assert u.find_spec('test.test_subprocess')" 2>/dev/null \
  || die "$python has no regression tests (Debian: apt-get install libpython3.X-testsuite)"
if [ -z "$out" ]; then out="$(mktemp -d /tmp/cpython_suite.XXXXXX)"; fi
mkdir -p "$out" && out="$(cd "$out" && pwd)"
work="$out/cwd"; mkdir -p "$work"
echo "cpython_suite: $("$python" -VV | head -1), regrtest ${args[*]}, descriptor limit $(ulimit -Sn)/$(ulimit -Hn), results in $out"

run() { # run MODE: plain | pagefold
  local mode=$1 t0 t1 rc
  local cmd=("$python" -m test --junit-xml "$out/$mode.xml" "${args[@]}")
  rm -f "$out/$mode.xml"
  t0=$EPOCHREALTIME
  if [ "$mode" = plain ]; then
    (cd "$work" && PYTHONHASHSEED=0 timeout -k 30 "$limit" "${cmd[@]}") >"$out/$mode.log" 2>&1
  else
    (cd "$work" && PYTHONHASHSEED=0 timeout -k 30 "$limit" "$pagefold" run --json --report "$out/pagefold-report.json" -- "${cmd[@]}") >"$out/$mode.log" 2>&1
  fi
  rc=$?
  t1=$EPOCHREALTIME
  echo "$rc $t0 $t1" >"$out/$mode.status"
}

run plain
run pagefold

# regrtest exits 0 (all passed), 2 (some failed) or 3 (environment changed).
"$python" "$root/bench/compat/compare_junit.py" --name cpython_suite --ok-codes 0,2,3 "$out"
