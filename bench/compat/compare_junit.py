"""Compares two junit XML results of one test suite, plain and under
pagefold, written by the scripts beside this file into OUT: OUT/MODE.xml and
OUT/MODE.status ("exit-code start end") for MODE in plain and pagefold.

    compare_junit.py --name NAME --ok-codes 0,1 OUT

Prints each run's counts, the tests that fail in both, plain only and under
pagefold only, and the tests skipped in one run only. Exit 0 iff both runs
completed (exit code in --ok-codes, XML present) and no test fails under
pagefold that passes plain.
"""
import argparse
import sys
import xml.etree.ElementTree as ET

ap = argparse.ArgumentParser()
ap.add_argument("--name", required=True)
ap.add_argument("--ok-codes", default="0,1")
ap.add_argument("out")
opts = ap.parse_args()
out = opts.out
ok_codes = {int(c) for c in opts.ok_codes.split(",")}
res = {}
for mode in ("plain", "pagefold"):
    rc, t0, t1 = open(f"{out}/{mode}.status").read().split()
    rc, wall = int(rc), float(t1) - float(t0)
    r = {"rc": rc, "wall": wall, "ok": rc in ok_codes}
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
        tid = "::".join(x for x in (tc.get("classname"), tc.get("name")) if x)
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
    if rc not in ok_codes:
        r["err"] = f"exit code {rc}" + (" (timed out)" if rc in (124, 137) else "")
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
print(f"{opts.name}:", "OK: pagefold adds no failure" if good else "FAIL")
sys.exit(0 if good else 1)
