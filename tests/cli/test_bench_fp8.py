#!/usr/bin/env python3
"""`tpflex bench --section fp8` on the simulator (CTest bench_fp8_sim).

The quick run: every operation of the section (ring_ag+gemm, bulk_ag+gemm, serial_ag,gemm,
gemm+ring_rs, gemm+pipeline_rs, serial_gemm,rs) has one bf16 row and one fp8_e4m3 row per (P, T),
every row's #wrong is 0, bytes/rank is what the layout moves (AG: half in fp8; RS: the same, its
buffer holds bf16 partials), the ratio columns are filled on fp8 rows only, the header says the
figures are CPU figures, and the JSON file holds the same table. Times are printed, not judged.
Then bad inputs: exit status 2, a message naming the value and the rule, nothing on stdout.

usage: test_bench_fp8.py TPFLEX
"""
import json
import os
import re
import subprocess
import sys
import tempfile

TPF = sys.argv[1]
OPS = ["ring_ag+gemm", "bulk_ag+gemm", "serial_ag,gemm", "gemm+ring_rs", "gemm+pipeline_rs",
       "serial_gemm,rs"]
AG = {"ring_ag+gemm", "bulk_ag+gemm", "serial_ag,gemm"}
failures = []


def run(args, timeout=600):
    p = subprocess.run([TPF] + args, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def check(cond, what):
    if not cond:
        failures.append(what)


def quick_run():
    with tempfile.TemporaryDirectory() as tmp:
        js = os.path.join(tmp, "fp8.json")
        # Small shapes (the simulator's GEMM is a CPU loop; the sanitizer and coverage tiers run
        # this test too): C 256, H 64, N 64, T 64 .. 256.
        rc, out, err = run(["bench", "--backend", "sim", "--section", "fp8", "--quick",
                            "--capacity", "256", "--hidden", "64", "--n", "64",
                            "--tokens", "64,128,256", "--json", js])
        check(rc == 0, "quick run: exit %s, want 0; stderr: %s" % (rc, err[-600:]))
        check("# bench finished: all checks passed" in out, "quick run: no 'all checks passed'")
        check("FAILED" not in out, "quick run: a FAILED note")
        check("NOTE: simulator times are CPU times" in out, "quick run: no CPU-figures NOTE")
        check("# fp8 section: ranks as threads  P=2,4  T=64,128,256" in out,
              "quick run: no fp8 section header line (P=2,4 T=64,128,256)")
        if not os.path.exists(js):
            failures.append("quick run: no JSON file")
            return
        with open(js) as f:
            doc = json.load(f)
    tables = [t for t in doc["tables"] if t["id"] == "fp8"]
    check(len(tables) == 1, "JSON: %d fp8 tables, want 1" % len(tables))
    if not tables:
        return
    t = tables[0]
    col = {c: i for i, c in enumerate(t["columns"])}
    for c in ["op", "dtype", "P", "T", "bytes/rank", "time(us)", "serial(us)", "speedup",
              "fp8/bf16", "vs_bf16", "#wrong"]:
        check(c in col, "JSON: no column %r" % c)
    if failures:
        return
    H = int(re.search(r"\bH=(\d+)", doc["meta"]).group(1))
    seen = {}
    for r in t["rows"]:
        op, dt, P, T = r[col["op"]], r[col["dtype"]], r[col["P"]], r[col["T"]]
        key = (op, dt, P, T)
        check(key not in seen, "row %s twice" % (key,))
        seen[key] = r
        check(r[col["#wrong"]] == 0, "row %s: #wrong %s" % (key, r[col["#wrong"]]))
        for c in ["time(us)", "serial(us)", "speedup"]:
            v = r[col[c]]
            check(isinstance(v, (int, float)) and v > 0, "row %s: %s = %r" % (key, c, v))
        e = 1 if (op in AG and dt == "fp8_e4m3") else 2
        want = (P - 1) * (T // P) * H * e
        check(r[col["bytes/rank"]] == want,
              "row %s: bytes/rank %s, want %d" % (key, r[col["bytes/rank"]], want))
        for c in ["fp8/bf16", "vs_bf16"]:
            v = r[col[c]]
            if dt == "bf16":
                check(v is None, "bf16 row %s: %s = %r, want n/a" % (key, c, v))
            else:
                check(isinstance(v, (int, float)) and v > 0, "fp8 row %s: %s = %r" % (key, c, v))
    for P in (2, 4):
        for T in (64, 128, 256):
            for op in OPS:
                for dt in ("bf16", "fp8_e4m3"):
                    check((op, dt, P, T) in seen, "no row %s %s P=%d T=%d" % (op, dt, P, T))
    check(len(seen) == 2 * 3 * len(OPS) * 2, "%d rows, want %d" % (len(seen), 2 * 3 * len(OPS) * 2))


def bad(name, args, want_err):
    rc, out, err = run(["bench", "--backend", "sim", "--section", "fp8"] + args, timeout=60)
    check(rc == 2, "%s: exit %s, want 2" % (name, rc))
    for w in want_err:
        check(w in err, "%s: stderr lacks %r: %s" % (name, w, err.strip()))
    check(out == "", "%s: something on stdout: %s" % (name, out[:200]))


quick_run()
bad("P the capacity cannot hold", ["--tp-list", "8", "--capacity", "100"],
    ["--capacity 100 does not fit", "P = 8", "fp8_e4m3",
     "the smallest capacity >= 100 that every section accepts is 104"])
# bf16 chunks of 1 row x 8 columns are 16 bytes; fp8's are 8: only the FP8 layout refuses.
bad("fp8 chunk under 16 bytes at C", ["--tp", "2", "--tp-list", "2", "--hidden", "8",
                                      "--capacity", "2"],
    ["--capacity 2 does not fit", "ring ag fp8_e4m3 at 2 rows", "16-byte alignment",
     "the smallest capacity >= 2 that every section accepts is"])
bad("fp8 chunk under 16 bytes at a T", ["--tp-list", "2", "--capacity", "64", "--hidden", "8",
                                        "--n", "16", "--tokens", "2"],
    ["--section fp8: T = 2 does not fit", "fp8_e4m3", "16-byte alignment"])
bad("procs mode", ["--mode", "procs"], ["--mode procs", "threads only"])
bad("--ops", ["--ops", "ring_ag+gemm"], ["--ops applies to --section tp only"])

if failures:
    print("bench fp8: %d failure(s)" % len(failures))
    for f in failures:
        print("  " + f)
    sys.exit(1)
print("bench fp8: rows, checks and bad inputs as expected")
