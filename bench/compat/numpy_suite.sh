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

"$python" - "$out" <<'PY'
import sys, xml.etree.ElementTree as ET
out = sys.argv[1]
res = {}
for mode in ("plain", "pagefold"):
    rc, t0, t1 = open(f"{out}/{mode}.status").read().split()
    rc, wall = int(rc), float(t1) - float(t0)
    r = {"rc": rc, "wall": wall, "ok": rc in (0, 1)}
    try:
        root = ET.parse(f"{out}/{mode}.xml").getroot()
    except Exception as e:
        r["ok"] = False
        r["err"] = f"no junit XML ({e})"
        res[mode] = r
        continue
    failed, skipped = set(), {}
    counts = dict(passed=0, failed=0, errors=0, skipped=0, xfailed=0)
    for tc in root.iter("testcase"):
        tid = f'{tc.get("classname")}::{tc.get("name")}'
        kinds = {c.tag for c in tc}
        if "failure" in kinds or "error" in kinds:
            failed.add(tid)
            counts["failed" if "failure" in kinds else "errors"] += 1
        elif "skipped" in kinds:
            sk = tc.find("skipped")
            xf = sk.get("type") == "pytest.xfail"
            counts["xfailed" if xf else "skipped"] += 1
            if not xf:
                skipped[tid] = (sk.get("message") or "")[:120]
        else:
            counts["passed"] += 1
    r.update(counts, failed_ids=failed, skipped_ids=skipped)
    res[mode] = r
    if rc not in (0, 1):
        r["err"] = f"pytest exit code {rc}" + (" (timed out)" if rc in (124, 137) else "")
for mode, r in res.items():
    if "failed_ids" in r:
        print(f"{mode:9s}: exit {r['rc']}, {r['wall']:.0f} s: {r['passed']} passed, {r['failed']} failed, "
              f"{r['errors']} errors, {r['skipped']} skipped, {r['xfailed']} xfailed")
    if "err" in r:
        print(f"{mode:9s}: INCOMPLETE: {r['err']} (see {out}/{mode}.log)")
good = all(r["ok"] for r in res.values())
if good:
    new = sorted(res["pagefold"]["failed_ids"] - res["plain"]["failed_ids"])
    gone = sorted(res["plain"]["failed_ids"] - res["pagefold"]["failed_ids"])
    for t in sorted(res["plain"]["failed_ids"] & res["pagefold"]["failed_ids"]):
        print(f"  fails in both: {t}")
    for t in gone:
        print(f"  fails plain only: {t}")
    for t in new:
        print(f"  FAILS UNDER PAGEFOLD ONLY: {t}")
    # Not a failure, but not tested either: say so.
    for a, b in (("pagefold", "plain"), ("plain", "pagefold")):
        for t in sorted(set(res[a]["skipped_ids"]) - set(res[b]["skipped_ids"])):
            print(f"  skipped {a} only: {t}: {res[a]['skipped_ids'][t]}")
    good = not new
print("numpy_suite:", "OK: pagefold adds no failure" if good else "FAIL")
sys.exit(0 if good else 1)
PY
