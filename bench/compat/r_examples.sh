#!/usr/bin/env bash
# The examples of R's base and recommended packages (the same check as
# R CMD check's, via tools::testInstalledPackage(pkg, types = "examples")),
# plain and under `pagefold run`. Compares, per package, pass/fail and the
# produced PKG-Ex.Rout (and PKG-Ex.pdf) after normalising what differs between
# any two runs: timings, addresses, temporary file names, dates, the run's
# directory, the values of LD_PRELOAD and PAGEFOLD_REPORT (plain runs get
# them too, empty: examples print the environment), trailing padding, and
# the sections examples mark with
# IGNORE_RDIFF_BEGIN/END (as R's own Rdiff does: PIDs, hash table order).
# Exit 0 iff pagefold adds no failure and no difference.
#
#   bench/compat/r_examples.sh [--out DIR] [--baseline] [--fast | PKG...]
#
#   --fast      a quick subset for CI: splines class stats4 parallel (about
#               10 s a run; parallel's examples fork: mcparallel, mclapply)
#   --baseline  also a second plain run, compared with the first in the same
#               way: shows that the normalisation removes every run-to-run
#               difference (a difference there is reported, and fails)
#   --timeout S each package's examples are stopped after S seconds (default
#               1800) and count as failed ("timeout"): a hang does not block
#   --compare-only  no runs: compare the results already in --out DIR
#   PKG...      these packages instead of the default set
#
# Default set: the base and recommended packages of R 4.2 (tcltk's examples
# need no display: they are guarded by interactive()):
# base stats utils graphics grDevices methods datasets tools grid splines
# stats4 parallel compiler tcltk MASS lattice Matrix nlme survival rpart class
# cluster KernSmooth mgcv nnet boot codetools foreign spatial.
# Environment: PAGEFOLD (pagefold binary, default target/release/pagefold of
# this checkout), RSCRIPT (default Rscript).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
pagefold="${PAGEFOLD:-$root/target/release/pagefold}"
rscript="${RSCRIPT:-Rscript}"
out="" baseline=0 compare_only=0 timeout=1800 pkgs=()
default_pkgs=(base stats utils graphics grDevices methods datasets tools grid splines stats4
  parallel compiler tcltk MASS lattice Matrix nlme survival rpart class cluster KernSmooth mgcv
  nnet boot codetools foreign spatial)
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --baseline) baseline=1; shift ;;
    --compare-only) compare_only=1; shift ;;
    --timeout) timeout="$2"; shift 2 ;;
    --fast) pkgs+=(splines class stats4 parallel); shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "r_examples: unknown option $1" >&2; exit 2 ;;
    *) pkgs+=("$1"); shift ;;
  esac
done
[ ${#pkgs[@]} -eq 0 ] && pkgs=("${default_pkgs[@]}")

die() { echo "r_examples: $*" >&2; exit 2; }
[ -x "$pagefold" ] || die "$pagefold not found (cargo build --release -p pagefold -p pagefold-preload)"
command -v "$rscript" >/dev/null || die "$rscript not found (apt-get install r-base-core r-recommended)"
command -v python3 >/dev/null || die "python3 not found (used to compare the outputs)"
if [ -z "$out" ]; then out="$(mktemp -d /tmp/r_examples.XXXXXX)"; fi
mkdir -p "$out" && out="$(cd "$out" && pwd)"
echo "r_examples: $("$rscript" --version 2>&1 | head -1), packages: ${pkgs[*]}; results in $out"

[ $compare_only = 1 ] || cat >"$out/driver.sh" <<'SH'
# bash driver.sh OUTDIR TIMEOUT RSCRIPT PKG...: the examples of each package
# into OUTDIR/PKG (in its own Rscript, stopped after TIMEOUT seconds), one
# line "PKG STATUS SECONDS" per package into OUTDIR/status; STATUS is
# testInstalledPackage's value (0 = passed), timeout or not-installed.
dir=$1 limit=$2 rscript=$3; shift 3
for p in "$@"; do
  mkdir -p "$dir/$p"
  t0=$EPOCHREALTIME
  timeout -k 10 "$limit" "$rscript" -e "if (!requireNamespace('$p', quietly = TRUE)) quit(status = 99)" \
    -e "quit(status = tools::testInstalledPackage('$p', types = 'examples', outDir = '$dir/$p'))"
  rc=$?
  case $rc in 124|137) rc=timeout ;; 99) rc=not-installed ;; esac
  echo "$p $rc $(awk "BEGIN { printf \"%.1f\", $EPOCHREALTIME - $t0 }")" >>"$dir/status"
done
SH

run() { # run MODE
  local mode=$1 rc
  rm -rf "$out/$mode"; mkdir -p "$out/$mode"
  local cmd=(bash "$out/driver.sh" "$out/$mode" "$timeout" "$rscript" "${pkgs[@]}")
  local t0=$EPOCHREALTIME
  if [ "$mode" = pagefold ]; then
    (cd "$out/$mode" && "$pagefold" run --json --report "$out/pagefold-report.json" -- "${cmd[@]}") >"$out/$mode.log" 2>&1
  else
    # The same variable names as under pagefold (examples print the
    # environment); an empty LD_PRELOAD loads nothing. Values are normalised.
    (cd "$out/$mode" && LD_PRELOAD= PAGEFOLD_REPORT=/nonexistent "${cmd[@]}") >"$out/$mode.log" 2>&1
  fi
  rc=$?
  echo "$rc $t0 $EPOCHREALTIME" >"$out/$mode.time"
  echo "r_examples: $mode run: exit $rc, $(python3 -c "print(f'{$EPOCHREALTIME - $t0:.0f}')") s"
}

if [ $compare_only = 0 ]; then
  run plain
  [ $baseline = 1 ] && run plain2
  run pagefold
fi

python3 - "$out" "$baseline" "${pkgs[@]}" <<'PY'
import difflib, os, re, sys
out, baseline, pkgs = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]

# What legitimately differs between two runs of the same examples.
RULES = [
    (rb"^Time elapsed: .*$", b"Time elapsed: <T>"),
    (rb"0x[0-9a-fA-F]{6,16}", b"0x<ADDR>"),                       # environments, pointers, bytecode
    (rb"Rtmp[A-Za-z0-9]{6}", b"Rtmp<X>"),                          # tempdir()
    (rb"(Rtmp<X>/[A-Za-z_.]*?)[0-9a-f]{6,}", rb"\1<X>"),          # tempfile(pattern) in it
    (rb"\b(file|Rf|Rex|pdf|plot)[0-9a-f]{6,}", rb"\1<X>"),         # basename(tempfile())
    (rb"\b\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?( [A-Z]{3,4})?", b"<DATETIME>"),
    (rb"\b(Mon|Tue|Wed|Thu|Fri|Sat|Sun) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d\d:\d\d:\d\d( [A-Z]{3,4})? \d{4}", b"<DATE>"),
    (rb"^(LD_PRELOAD|PAGEFOLD_REPORT):.*$", rb"\1: <X>"),           # Sys.getenv(): set by pagefold run
    (rb"[ \t]+$", b""),                                            # padding that follows a name's length
]
# system.time() / proc.time() print a header line, then the numbers
TIME_HEADER = re.compile(rb"^\s*((user|system|elapsed|user\.self|sys\.self|user\.child|sys\.child)\s*)+$")
def norm_rout(b, rundir):
    b = b.replace(rundir.encode(), b"<RUNDIR>")                    # getwd() of the run
    out, ignoring, prev = [], False, b""
    for line in b.split(b"\n"):
        # R's own Rdiff ignores what examples mark as not reproducible
        if re.match(rb"^[>+] *## IGNORE_RDIFF_BEGIN", line):
            ignoring = True
        elif re.match(rb"^[>+] *## IGNORE_RDIFF_END", line):
            ignoring = False
        elif ignoring:
            continue
        out.append(b"<TIMES>" if TIME_HEADER.match(prev) else line)
        prev = line
    b = b"\n".join(out)
    for pat, rep in RULES:
        b = re.sub(pat, rep, b, flags=re.M)
    return b
def norm_pdf(b, rundir):
    return re.sub(rb"/(CreationDate|ModDate) \(D:[^)]*\)", b"/Date", b)

def load(mode):
    st = {}
    try:
        for line in open(f"{out}/{mode}/status"):
            f = line.split()
            st[f[0]] = (f[1], float(f[2]))
    except FileNotFoundError:
        pass
    return st

def first_diff(a, b, name, n=3):
    """The first n differing lines (after normalisation) as 'line: a | b'."""
    la, lb = a.split(b"\n"), b.split(b"\n")
    sm = difflib.SequenceMatcher(None, la, lb, autojunk=False)
    hunks = [h for h in sm.get_opcodes() if h[0] != "equal"]
    show = []
    for tag, i1, i2, j1, j2 in hunks[:n]:
        x = b" / ".join(la[i1:min(i2, i1 + 2)])[:90].decode(errors="replace")
        y = b" / ".join(lb[j1:min(j2, j1 + 2)])[:90].decode(errors="replace")
        show.append(f"line {i1 + 1}: {x!r} | {y!r}")
    more = f" (+{len(hunks) - n} more)" if len(hunks) > n else ""
    return f"{name} differs at " + "; ".join(show) + more

def compare(m1, m2):
    """(rows, problems): per package status and first difference."""
    s1, s2 = load(m1), load(m2)
    problems, rows = [], []
    for p in pkgs:
        a, b = s1.get(p, ("missing", 0)), s2.get(p, ("missing", 0))
        diffs = []
        for ext, norm in (("Rout", norm_rout), ("pdf", norm_pdf)):
            f1, f2 = (f"{out}/{m}/{p}/{p}-Ex.{ext}" for m in (m1, m2))
            if ext == "Rout":   # a failed run leaves PKG-Ex.Rout.fail
                f1, f2 = (f if os.path.exists(f) else f + ".fail" for f in (f1, f2))
            e1, e2 = os.path.exists(f1), os.path.exists(f2)
            if e1 != e2:
                diffs.append(f"{ext} only in {m1 if e1 else m2}")
            elif e1:
                x = norm(open(f1, "rb").read(), f"{out}/{m1}")
                y = norm(open(f2, "rb").read(), f"{out}/{m2}")
                if x != y:
                    diffs.append(first_diff(x, y, ext) if ext == "Rout" else "pdf differs")
        ok = lambda s: s[0] == "0"
        bad = []
        if ok(a) and not ok(b):
            bad.append(f"fails under {m2} only (status {b[0]})")
        if diffs:
            bad.append("; ".join(diffs))
        rows.append((p, a, b, bad))
        problems += [f"{p}: {x}" for x in bad]
    return rows, problems

status = 0
pairs = [("plain", "plain2")] if baseline else []
pairs.append(("plain", "pagefold"))
for m1, m2 in pairs:
    rows, problems = compare(m1, m2)
    print(f"\n{m1} vs {m2}:")
    print(f"  {'package':12s} {m1+' status':>14s} {'s':>6s} {m2+' status':>16s} {'s':>6s}  outputs")
    for p, a, b, bad in rows:
        print(f"  {p:12s} {a[0]:>14s} {a[1]:6.1f} {b[0]:>16s} {b[1]:6.1f}  {'; '.join(bad) if bad else 'same'}")
    fails = [p for p, a, b, _ in rows if a[0] != "0"]
    if fails:
        print(f"  failing in {m1} too: {' '.join(fails)}")
    for x in problems:
        print("  DIFFERENCE:", x)
    if problems:
        status = 1
print("\nr_examples:", "OK: no failure and no difference added" if status == 0 else "FAIL")
sys.exit(status)
PY
