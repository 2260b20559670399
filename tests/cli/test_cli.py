#!/usr/bin/env python3
"""Table-driven test of every option of every tpflex command (plan, demo, bench, calibrate).

For each numeric option: invalid values (negative, '+3', '010', '0x10', 2^32+1, 2^64, '', 'abc',
'1e3', min-1, max+1) must exit 2 with a message that names the option and echoes the text typed;
both range ends must pass the parser (calibrate's too, which needs a GPU to run), and boundary and
valid values must run. Choice and file options, flags given a value, a value that is the next
option, unknown options, stray words, --opt=value, unwritable outputs (refused before any work),
plan's --json errors, the shape rules with the smallest legal value suggested (and the suggestion
runs), the top level's version and help, and the bench's section numbers (help and tables) are
covered too. Every run is bounded by a timeout (a hang fails the test).
Usage: test_cli.py PATH/TO/tpflex

TPF_CLI_QUICK=1 (cli_options_quick: the instrumented CI tiers and the CUDA-enabled build, where a
run costs 4-20x more) is the same table thinned where the code under test does not change: every
invalid form, the '=' form and the missing and repeated value for the first option of each kind
of each command, and for every other option its out-of-range values and range ends; the runs of
the default demo, of every demo capacity suggestion but the first and of every calibrate
--schedules grid but the first are left out. The full table (cli_options) runs in make test-sim.
"""
import os
import json
import subprocess
import sys

TPF = sys.argv[1] if len(sys.argv) > 1 else "tpflex"
TIMEOUT = int(os.environ.get("TPF_CLI_TIMEOUT", "20"))  # seconds per run
QUICK = os.environ.get("TPF_CLI_QUICK", "0") not in ("", "0")
U64 = 2**64
failures = []
count = 0

# Arguments a command needs to run, and tiny shapes for valid runs.
BASE = {
    "plan": {"--tp": "4", "--capacity": "64", "--hidden": "64", "--algo": "ring", "--coll": "ag"},
    "demo": {"--tp": "2", "--capacity": "32", "--hidden": "16", "--microbatches": "1"},
    "bench": {"--tp": "2", "--capacity": "64", "--hidden": "16", "--n": "16", "--iters": "1",
              "--warmup": "0", "--calls": "100", "--section": "setshape", "--quick": None},
    "calibrate": {"--backend": "sim"},
}
HAVE_CUDA = os.environ.get("TPF_CLI_HAVE_CUDA", "OFF").upper() in ("1", "ON", "TRUE", "YES")
# Numeric options: (command, option, min, max), as the commands' option tables give them.
NUMS = [
    ("plan", "--tp", 1, 64), ("plan", "--capacity", 1, 2**40 - 1),
    ("plan", "--tokens", 1, 2**40 - 1),
    ("plan", "--hidden", 1, 2**24), ("plan", "--splits", 0, 1024), ("plan", "--n", 1, 2**40),
    ("plan", "--k", 1, 2**40), ("plan", "--rank", 0, 63),
    ("demo", "--tp", 1, 64), ("demo", "--microbatches", 1, 100000),
    ("demo", "--capacity", 1, 2**24), ("demo", "--hidden", 4, 2**16),
    ("demo", "--seed", 0, U64 - 1), ("demo", "--max-delay-us", 0, 1000000),
    ("demo", "--timeout-ms", 1, 3600000), ("demo", "--arena-mib", 1, 2**20),
    ("demo", "--rows", 1, 1000000),
    ("bench", "--tp", 1, 64), ("bench", "--capacity", 1, 2**20), ("bench", "--hidden", 1, 2**16),
    ("bench", "--n", 1, 2**16), ("bench", "--iters", 1, 1000), ("bench", "--warmup", 0, 1000),
    ("bench", "--calls", 100, 1000000000), ("bench", "--timeout", 1, 86400),
    ("bench", "--arena-mib", 1, 2**20),
    ("calibrate", "--device", 0, 63), ("calibrate", "--peer-device", 0, 63),
    ("calibrate", "--hidden", 64, 2**16), ("calibrate", "--n", 64, 2**16),
    ("calibrate", "--iters", 3, 1000),
    ("calibrate", "--capacity", 64, 2**20), ("calibrate", "--tp", 2, 8),
]
# Choice options: (command, option, valid words).
CHOICES = [
    ("plan", "--algo", ["ring", "pipeline", "bulk"]), ("plan", "--coll", ["ag", "rs"]),
    ("plan", "--dtype", ["bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2"]),
    ("demo", "--backend", ["sim"]), ("demo", "--dtype", ["bf16", "fp16", "fp32"]),
    ("demo", "--mode", ["threads", "procs"]),
    ("bench", "--backend", ["sim"]),
    ("bench", "--section", ["setshape", "dynamic", "chunking", "tp", "serial", "all", "planner"]),
    ("bench", "--model", ["shared", "dedicated"]), ("bench", "--mode", ["threads", "procs", "both"]),
    ("calibrate", "--backend", ["cuda", "sim"]), ("calibrate", "--dtype", ["bf16", "fp16", "fp32"]),
    ("calibrate", "--fp8", ["on", "off"]),
]
FLAGS = [("plan", "--aggregate"), ("plan", "--json"), ("plan", "--project"), ("demo", "--no-check"),
         ("bench", "--quick"), ("bench", "--adaptive"), ("calibrate", "--quick"),
         ("calibrate", "--schedules")]
FILES = [("demo", "--trace"), ("bench", "--csv"), ("bench", "--json"), ("calibrate", "--out"),
         ("plan", "--svg")]
# Options that take a value (every non-flag option of every command).
VALUED = [(c, o) for c, o, _, _ in NUMS] + [(c, o) for c, o, _ in CHOICES] + FILES + [
    ("plan", "--cost"), ("bench", "--cost"), ("bench", "--ops")]
# Text options that must not be empty: (command, option).
TEXTS = [("bench", "--tokens"), ("bench", "--tp-list"), ("bench", "--ops")]


def argv(cmd, over=None, drop=(), extra=()):
    args = dict(BASE[cmd])
    for k in drop:
        args.pop(k, None)
    args.update(over or {})
    out = [TPF, cmd]
    for k, v in args.items():
        out += [k] if v is None else [k, v]
    return out + list(extra)


def firsts(table):
    """The indices of the first row of each command in table (rows start with the command)."""
    seen, out = set(), set()
    for i, row in enumerate(table):
        if row[0] not in seen:
            seen.add(row[0])
            out.add(i)
    return out


def full(table, i):
    """Whether row i of table gets the whole sweep: always, or under QUICK its command's first."""
    return not QUICK or i in firsts(table)


def run(args):
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return "timeout", "", ""


def case(name, args, rc=0, err=None, out=None):
    """rc: expected exit status (or 'nonzero'); err/out: substrings required in stderr/stdout."""
    global count
    count += 1
    got, so, se = run(args)
    bad = []
    if got == "timeout":
        bad.append("timed out after %d s (hang)" % TIMEOUT)
    elif rc == "nonzero" and got == 0 or rc != "nonzero" and got != rc:
        bad.append("exit %s, want %s" % (got, rc))
    for want, text, where in ((err, se, "stderr"), (out, so, "stdout")):
        for w in [want] if isinstance(want, str) else (want or []):
            if w not in text:
                bad.append("%s lacks %r" % (where, w))
    if bad:
        failures.append("%s: %s\n    cmd: %s\n    stdout: %s\n    stderr: %s" %
                        (name, "; ".join(bad), " ".join(repr(a) for a in args), so[-400:],
                         se[-400:]))


# ---- numbers: every invalid form, the range ends, and the message ----
for i, (cmd, opt, lo, hi) in enumerate(NUMS):
    bad = ["-1", "+3", "010", "0x10", str(2**32 + 1), str(U64), "", "abc", "1e3", " 5", "5 "]
    if not full(NUMS, i):
        bad = []  # QUICK: this option's range only (its out-of-range values below)
    if lo > 0:
        bad.append(str(lo - 1))
    bad.append(str(hi + 1))
    for v in bad:
        if v.lstrip("0123456789") == "" and v != "" and not v.startswith("0") and lo <= int(v) <= hi:
            continue  # in range: not an invalid value for this option
        rng = "[%d, %d]" % (lo, hi)
        case("%s %s %r" % (cmd, opt, v), argv(cmd, {opt: v}), 2,
             err=["%s '%s'" % (opt, v), rng])
        if full(NUMS, i):
            case("%s %s=%r" % (cmd, opt, v), argv(cmd, extra=["%s=%s" % (opt, v)], drop=[opt]), 2,
                 err="%s '%s'" % (opt, v))
    if not full(NUMS, i):
        continue
    case("%s %s without a value" % (cmd, opt), argv(cmd, drop=[opt], extra=[opt]), 2,
         err="%s needs a value" % opt)
    case("%s %s twice" % (cmd, opt), argv(cmd, {opt: str(lo)}, extra=[opt, str(lo)]), 2,
         err="%s given more than once" % opt)

# ---- the range ends pass the parser (for every numeric option, including calibrate's, which
# needs a GPU to run): followed by an unknown option, the error is that option, not the value ----
for i, (cmd, opt, lo, hi) in enumerate(NUMS):
    for v in (lo, hi):
        for form in ("sep", "eq") if full(NUMS, i) else ("sep",):
            extra = [opt, str(v)] if form == "sep" else ["%s=%d" % (opt, v)]
            case("%s %s %d accepted (%s)" % (cmd, opt, v, form),
                 argv(cmd, drop=[opt], extra=extra + ["--zz-end"]), 2,
                 err="unknown option '--zz-end'")
# ---- a value that is an option: the value is missing (never a file called "--no-check") ----
for i, (cmd, opt) in enumerate(VALUED):
    if not full(VALUED, i):
        continue
    case("%s %s followed by an option" % (cmd, opt), argv(cmd, drop=[opt], extra=[opt, "--zz"]), 2,
         err="%s needs a value (the next word '--zz' is an option" % opt)

# ---- choices, flags, files ----
for i, (cmd, opt, words) in enumerate(CHOICES):
    for v in ["xyz", "", "RING", words[0] + "x"] if full(CHOICES, i) else ["xyz"]:
        case("%s %s %r" % (cmd, opt, v), argv(cmd, {opt: v}), 2, err="%s '%s'" % (opt, v))
for cmd, opt in FLAGS:
    case("%s %s=1" % (cmd, opt), argv(cmd, drop=[opt], extra=[opt + "=1"]), 2,
         err="%s takes no value" % opt)
for cmd, opt in FILES:
    case("%s %s ''" % (cmd, opt), argv(cmd, {opt: ""}), 2, err="%s '' is empty" % opt)
    # refused up front (exit 2, before any work), naming the option and the path
    case("%s %s unwritable" % (cmd, opt), argv(cmd, {opt: "/nonexistent/dir/t.json"}), 2,
         err="%s '/nonexistent/dir/t.json' cannot be written" % opt)
    case("%s %s a directory" % (cmd, opt), argv(cmd, {opt: "/tmp"}), 2,
         err="%s '/tmp' cannot be written" % opt)
for cmd, opt in TEXTS:
    case("%s %s ''" % (cmd, opt), argv(cmd, {opt: ""}), 2, err="%s '' is empty" % opt)

# ---- unknown options, stray words, --opt=value, help ----
for cmd in BASE:
    case(cmd + " unknown option", argv(cmd, extra=["--x"]), 2, err="unknown option '--x'")
    case(cmd + " unknown option=value", argv(cmd, extra=["--x=3"]), 2, err="unknown option '--x'")
    case(cmd + " single dash", argv(cmd, extra=["-x"]), 2, err="'-x'")
    case(cmd + " stray word", argv(cmd, extra=["stray"]), 2, err="unexpected argument 'stray'")
    case(cmd + " --help", [TPF, cmd, "--help"], 0, out="usage: tpflex " + cmd)
case("unknown command", [TPF, "frobnicate"], 2, err="unknown command 'frobnicate'")
case("version", [TPF, "version"], 0, out="tpflex ")
case("--version", [TPF, "--version"], 0, out="tpflex ")
case("version stray word", [TPF, "version", "x"], 2, err="unexpected argument 'x'")
case("version unknown option", [TPF, "version", "--json"], 2, err="unknown option '--json'")
case("version --help", [TPF, "version", "--help"], 0, out="usage: tpflex version")
for h in ("help", "--help", "-h"):
    case("top level " + h, [TPF, h], 0, out=["usage: tpflex <command>", "calibrate", "version"])
case("help stray word", [TPF, "help", "x"], 2, err="unexpected argument 'x'")
case("help unknown option", [TPF, "help", "--x=1"], 2, err="unknown option '--x'")
case("no command", [TPF], 2, err="usage: tpflex")

# ---- plan: input errors, algorithm-specific options, JSON errors, help text ----
P = "plan"
case("plan reference command", [TPF, "plan", "--tp", "4", "--capacity", "4096", "--tokens", "1000",
                                "--hidden", "1024", "--algo", "ring", "--coll", "rs", "--rank",
                                "1"], 0, out=["schedule check: OK", "rank 1:"])
case("plan --opt=value", [TPF, "plan", "--tp=4", "--capacity=64", "--hidden=64", "--algo=bulk",
                          "--coll=rs", "--k=32"], 0, out="schedule check: OK")
for req in ["--tp", "--capacity", "--hidden", "--algo", "--coll"]:
    case("plan without " + req, argv(P, drop=[req]), 2, err=req + " is required")
case("plan --aggregate with pipeline", argv(P, {"--algo": "pipeline", "--coll": "rs"},
                                            extra=["--aggregate"]), 2,
     err="--aggregate does not apply to --algo pipeline")
case("plan --aggregate with ring rs", argv(P, {"--coll": "rs"}, extra=["--aggregate"]), 2,
     err="--aggregate")
case("plan --splits with bulk", argv(P, {"--algo": "bulk", "--splits": "2"}), 2,
     err="--splits does not apply to --algo bulk")
case("plan --n with ring rs", argv(P, {"--coll": "rs", "--n": "8"}), 2, err="--n does not apply")
case("plan --k with ring ag", argv(P, {"--k": "8"}), 2, err="--k does not apply")
case("plan --rank = P", argv(P, {"--rank": "4"}), 2, err="--rank '4'")
case("plan --tokens > C", argv(P, {"--tokens": "128"}), 2, err="--tokens '128'")
case("plan --tokens not divisible", argv(P, {"--tokens": "6"}), 2,
     err=["TPF_EDIVISIBLE", "smallest legal --tokens >= 6 is 8"])
BIGC = str(2**40 - 4)  # a multiple of 4 that fits the ready word's 40-bit rows
case("plan overflowing buffer", argv(P, {"--capacity": BIGC, "--hidden": str(2**24)}), 2,
     err="--capacity")
case("plan overflowing GEMM --n", argv(P, {"--capacity": BIGC, "--hidden": "4",
                                           "--algo": "bulk", "--n": str(2**40)}), 2,
     err="--n '%d'" % 2**40)
case("plan overflowing GEMM --k", argv(P, {"--capacity": BIGC, "--hidden": "4",
                                           "--algo": "bulk", "--k": str(2**40)}), 2,
     err="--k '%d'" % 2**40)
case("plan --capacity 2^40 (the ready word's rows are 40-bit)", argv(P, {"--capacity": str(2**40)}),
     2, err="--capacity '%d' is not a decimal number in [1, %d]" % (2**40, 2**40 - 1))
# a capacity that breaks a layout rule: an input error naming --capacity, with the smallest legal
# capacity, and that suggestion runs
for over, want in [({"--capacity": "66"}, 68), ({"--tp": "1", "--capacity": "1", "--hidden": "1"}, 8),
                   ({"--tp": "8", "--capacity": "1000", "--hidden": "8", "--algo": "pipeline",
                     "--coll": "rs"}, 1024)]:
    case("plan illegal capacity %s" % over, argv(P, over), 2,
         err=["--capacity %s" % over["--capacity"], "smallest legal --capacity >= %s is %d" %
              (over["--capacity"], want)])
    case("plan suggested capacity %d" % want, argv(P, dict(over, **{"--capacity": str(want)})), 0,
         out="schedule check: OK")
case("plan --splits no capacity fixes", argv(P, {"--algo": "pipeline", "--coll": "rs",
                                                  "--splits": "3"}), 2,
     err="hidden 64 not divisible by num_splits 3")
case("plan --json --help", argv(P, extra=["--json", "--help"]), 0, out="usage: tpflex plan")
for name, extra in [("bad number", ["--tp", "-1"]), ("unknown option", ["--x"]),
                    ("stray word", ["stray"])]:
    a = argv(P, drop=["--tp"] if extra[0] == "--tp" else [], extra=extra + ["--json"])
    count += 1
    rc, so, se = run(a)
    try:
        j = json.loads(so)
        ok = rc == 2 and j.get("status") == "error" and extra[-1] in j.get("message", "")
    except ValueError:
        ok = False
    if not ok:
        failures.append("plan --json %s: want exit 2 and a JSON error naming %r on stdout; got "
                        "exit %s, stdout %r" % (name, extra[-1], rc, so[:300]))
case("plan --json valid", argv(P, extra=["--json"]), 0, out='"check":"OK"')
rc, so, _ = run([TPF, "plan", "--help"])
count += 1
for opt in ["--tp", "--capacity", "--tokens", "--hidden", "--algo", "--coll", "--splits",
            "--aggregate", "--dtype", "--n", "--k", "--rank", "--json", "--predict", "--cost",
            "--project"]:
    line = next((l for l in so.splitlines() if l.strip().startswith(opt + " ") or
                 l.strip() == opt or l.strip().startswith(opt + "  ")), "")
    if "required" not in line and "optional" not in line:
        failures.append("plan --help: %s is not described as required or optional" % opt)
# boundaries that must run
for over in [{"--tp": "1", "--capacity": "8", "--hidden": "1"}, {"--tp": "64", "--rank": "63"},
             {"--tokens": "4"}, {"--splits": "0"}, {"--tokens": "64"},
             {"--algo": "pipeline", "--coll": "rs", "--splits": "1"},
             {"--hidden": str(2**24), "--capacity": "4"}, {"--dtype": "fp32"}]:
    case("plan valid %s" % over, argv(P, over), 0, out="schedule check: OK")
case("plan valid --aggregate", argv(P, extra=["--aggregate"]), 0, out="schedule check: OK")
# --predict / --cost: the planner's candidates and choice on a cost table
case("plan --predict default table", argv(P, extra=["--predict"]), 0, out="choice: ")
case("plan --predict --cost file", argv(P, extra=["--predict", "--cost", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "cost", "sim.txt")]), 0,
    out="<- chosen")
case("plan --cost without --predict", argv(P, extra=["--cost", "/tmp/x"]), 2,
     err="--cost applies with --predict, --project or --svg only")
case("plan --predict --cost missing", argv(P, extra=["--predict", "--cost", "/nonexistent/t"]), 2,
     err="--cost '/nonexistent/t' cannot be read")
with open("/tmp/tpflex_cli_bad_cost.txt", "w") as f:
    f.write("launch_us 1\nfrobnicate 2\n")
case("plan --predict --cost bad table", argv(P, extra=["--predict", "--cost",
     "/tmp/tpflex_cli_bad_cost.txt"]), 2, err="line 2: unknown key")
# A table without link costs parses (every key is optional) but cannot price a transfer: it used
# to print inf / -nan predictions and exit 0.
with open("/tmp/tpflex_cli_nolink_cost.txt", "w") as f:
    f.write("launch_us 1\nhandshake_us 2\nbarrier_us 3\ngemm bf16 16 64 64 5\n"
            "gemm bf16 1024 1024 1024 400\n")
NOLINK = "no 'copy peer' line, and a SEND to another rank is priced"
for extra, where in [(["--predict"], "err"), (["--predict", "--json"], "out"),
                     (["--project"], "out")]:
    case("plan %s, table without 'copy peer'" % " ".join(extra),
         argv(P, extra=extra + ["--cost", "/tmp/tpflex_cli_nolink_cost.txt"]), "nonzero",
         **{where: NOLINK})
case("plan --predict=x", argv(P, extra=["--predict=x"]), 2, err="--predict")
for opt, extra in [("--splits", ["--splits", "4"]), ("--aggregate", ["--aggregate"])]:
    case("plan --predict %s" % opt, argv(P, extra=["--predict"] + extra), 2,
         err="%s does not apply with --predict" % opt)
case("plan --cost empty", argv(P, extra=["--predict", "--cost", ""]), 2, err="--cost")

# --project: the multi-GPU projection (no required options; the grid has defaults)
SIM_COST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "cost",
                        "sim.txt")
case("plan --project default", [TPF, "plan", "--project"], 0,
     out=["PROJECTION", "ring ag", "ring rs", "pipeline rs", "3584", "1024", "32768", "summary:",
          "E_fixed", "speedup"])
case("plan --predict --project", [TPF, "plan", "--predict", "--project", "--coll", "ag"], 0,
     out=["PROJECTION", "ring ag"])
case("plan --project one row", [TPF, "plan", "--project", "--tp", "4", "--tokens", "4096", "--n",
                                "1024", "--algo", "ring", "--coll", "ag"], 0,
     out="summary: 1 rows")
case("plan --project --cost", [TPF, "plan", "--project", "--cost", SIM_COST, "--capacity", "1024",
                               "--hidden", "256", "--n", "256"], 0, out=["sim.txt", "summary:"])
case("plan --project --algo bulk", [TPF, "plan", "--project", "--algo", "bulk"], 2,
     err="--algo bulk has nothing to project")
case("plan --project pipeline ag", [TPF, "plan", "--project", "--algo", "pipeline", "--coll", "ag"],
     2, err="pipeline has no all-gather")
for opt, val in [("--splits", "2"), ("--rank", "0"), ("--k", "64"), ("--svg", "/tmp/x.svg")]:
    case("plan --project %s" % opt, [TPF, "plan", "--project", opt, val], 2,
         err="%s does not apply with --project" % opt)
case("plan --project --aggregate", [TPF, "plan", "--project", "--aggregate"], 2,
     err="--aggregate does not apply with --project")
case("plan --project --json", [TPF, "plan", "--project", "--json"], 2,
     out=['"status":"error"', "--json does not apply with --project"])
case("plan --project --tokens > C", [TPF, "plan", "--project", "--tokens", "65536"], 2,
     err="--tokens '65536' is above the capacity 32768")
# --project: inputs no layout accepts are input errors (exit 2) with the smallest legal value;
# a capacity below 64 still ends (the T grid starts at 1)
case("plan --project illegal capacity", [TPF, "plan", "--project", "--capacity", "100"], 2,
     err=["--capacity 100 with --tp 8", "smallest legal --capacity >= 100 is 104"])
case("plan --project illegal --tokens", [TPF, "plan", "--project", "--tokens", "100"], 2,
     err=["--tokens '100'", "smallest legal --tokens >= 100 is 104"])
case("plan --project alignment", [TPF, "plan", "--project", "--tp", "8", "--capacity", "1000",
                                  "--hidden", "8"], 2,
     err=["TPF_EALIGN", "smallest legal --capacity >= 1000 is 1024"])
case("plan --project small capacity ends", [TPF, "plan", "--project", "--tp", "1", "--capacity",
                                            "8", "--hidden", "64", "--n", "64", "--coll", "ag"],
     0, out="summary:")
case("plan --project --tp 64 --capacity 1", [TPF, "plan", "--project", "--tp", "64",
                                             "--capacity", "1"], 2,
     err="smallest legal --capacity >= 1 is 64")

# ---- calibrate: the sim table, the CUDA error without CUDA, cuda-only options ----
CAL = "calibrate"
case("calibrate sim to stdout", [TPF, CAL, "--backend", "sim"], 0,
     out=["SYNTHETIC", "launch_us", "copy peer", "gemm bf16"], err="wrote the synthetic table")
CAL_OUT = "/tmp/tpflex_cli_calibrated.txt"
case("calibrate sim --out", [TPF, CAL, "--backend", "sim", "--out", CAL_OUT], 0,
     out="to " + CAL_OUT)
case("calibrate table feeds plan --predict", argv(P, extra=["--predict", "--cost", CAL_OUT]), 0,
     out=["<- chosen", CAL_OUT])
case("calibrate --backend=sim", [TPF, CAL, "--backend=sim", "--out=" + CAL_OUT], 0)
for opt, val in [("--dtype", "fp16"), ("--device", "0"), ("--peer-device", "0"),
                 ("--hidden", "1024"), ("--n", "1024"), ("--iters", "3")]:
    case("calibrate sim %s" % opt, [TPF, CAL, "--backend", "sim", opt, val], 2,
         err="%s applies to --backend cuda only" % opt)
case("calibrate sim --quick", [TPF, CAL, "--backend", "sim", "--quick"], 2,
     err="--quick applies to --backend cuda only")
if not HAVE_CUDA:
    case("calibrate cuda without CUDA", [TPF, CAL, "--backend", "cuda"], 2,
         err=["this build has no CUDA backend", "-DTPF_WITH_CUDA=ON", "--backend sim"])
    case("calibrate default backend is cuda", [TPF, CAL, "--quick"], 2,
         err="this build has no CUDA backend")
else:
    # a CUDA build: without a usable GPU the error points to the simulator's table
    count += 1
    rc, so, se = run([TPF, CAL, "--backend", "cuda", "--quick", "--out", "/tmp/tpflex_cli_cal.txt"])
    if rc != 0 and ("no CUDA device usable" not in se or "--backend sim" not in se):
        failures.append("calibrate cuda without a GPU: exit %s; stderr must say 'no CUDA device "
                        "usable' and point to --backend sim: %r" % (rc, se[-400:]))

# ---- calibrate --schedules: the planner's candidates measured (sim here), the tuned table used ----
SCH = [TPF, CAL, "--backend", "sim", "--schedules", "--quick", "--capacity", "256", "--hidden",
       "64", "--n", "64", "--tp", "4"]
TUNED = "/tmp/tpflex_cli_tuned.txt"
for opt, val in [("--capacity", "256"), ("--tp", "4")]:  # grid options need --schedules
    case("calibrate %s without --schedules" % opt, [TPF, CAL, "--backend", "sim", opt, val], 2,
         err="%s applies to --schedules only" % opt)
for opt, val in [("--dtype", "bf16"), ("--device", "0"), ("--peer-device", "0")]:
    case("calibrate sim --schedules %s" % opt, SCH + [opt, val], 2,
         err="%s applies to --backend cuda only" % opt)
# the schedules are bf16 (checked before any measurement, so also without CUDA)
case("calibrate --schedules --dtype fp16", [TPF, CAL, "--schedules", "--dtype", "fp16"], 2,
     err=["--dtype 'fp16' with --schedules", "bf16"])
case("calibrate --schedules --iters 167", SCH + ["--iters", "167"], 2,
     err=["--iters '167' with --schedules", "at most 166"])
for over in [["--iters", "166", "--tp", "2", "--capacity", "64"], ["--tp", "2"], ["--tp", "8"],
             ["--capacity", "64"]][:1 if QUICK else None]:
    args = SCH + over
    for k in range(0, len(over), 2):  # the later of two equal options would be refused
        i = args.index(over[k])
        if i < len(SCH):
            del args[i:i + 2]
    case("calibrate sim --schedules %s" % " ".join(over), args, 0,
         out=["sched shared ring ag 2 2 0 bf16 64 64 ", "sched shared pipeline rs 2 ",
              "MEASURED schedules"], err="schedules ")
case("calibrate sim --schedules --out", SCH + ["--out", TUNED], 0,
     out=["wrote the synthetic table", "schedules ", "points measured on the simulator"])
case("calibrate --schedules table parses (plan --predict)",
     [TPF, "plan", "--predict", "--cost", TUNED, "--tp", "4", "--capacity", "256", "--tokens",
      "32", "--hidden", "64", "--n", "64", "--algo", "ring", "--coll", "ag"], 0,
     out=["measured schedule points:", "shared", "source", "model(us)", "<- chosen"])
case("bench planner on the tuned table", [TPF, "bench", "--backend", "sim", "--section", "planner",
                                          "--tp", "4", "--capacity", "256", "--hidden", "64", "--n",
                                          "64", "--iters", "1", "--warmup", "0", "--quick",
                                          "--cost", TUNED], 0,
     out=["tuned: the table has measured schedule points", "  measured  ",
          "decisions by source:", "bench finished: all checks passed"])
case("bench planner --model dedicated: shared points unused",
     [TPF, "bench", "--backend", "sim", "--section", "planner", "--tp", "2", "--capacity", "256",
      "--hidden", "64", "--n", "64", "--iters", "1", "--warmup", "0", "--quick", "--model",
      "dedicated", "--cost", TUNED], 0, out=["0 measured, 0 scaled,", "with --model dedicated"])

# ---- demo: per-value messages, boundaries, wording ----
D = "demo"
case("demo capacity not a multiple", argv(D, {"--capacity": "33"}), 2,
     err=["--capacity '33' is not a multiple of --tp 2",
          "the smallest capacity >= 33 that every layout accepts is 36"])
# the one suggestion is a capacity the demo runs with
SUGGESTED = [({"--capacity": "33"}, 36),
             ({"--tp": "3", "--capacity": "1000", "--hidden": "102"}, 1008),
             ({"--tp": "3", "--capacity": "1002", "--hidden": "126"}, 1008),
             ({"--tp": "1", "--capacity": "1", "--hidden": "4"}, 8)]
for k, (over, want) in enumerate(SUGGESTED):
    case("demo capacity suggestion %s" % over, argv(D, over), 2,
         err="the smallest capacity >= %s that every layout accepts is %d" %
         (over["--capacity"], want))
    if QUICK and k > 0:
        continue  # QUICK: the first suggestion runs (the others take seconds each instrumented)
    case("demo suggested capacity %d runs" % want, argv(D, dict(over, **{"--capacity": str(want)})),
         0, out="every check OK")
case("demo hidden not a multiple", argv(D, {"--tp": "4", "--capacity": "32", "--hidden": "18"}),
     2, err="--hidden '18' is not a multiple of --tp 4")
case("bench capacity checked up front", [TPF, "bench", "--capacity", "100", "--hidden", "64"], 2,
     err=["--capacity 100 does not fit", "C/8 must be a multiple of P = 4",
          "the smallest capacity >= 100 that every section accepts is 128"])
case("bench capacity suggestion runs", [TPF, "bench", "--capacity", "128", "--hidden", "64",
                                        "--section", "setshape", "--calls", "100", "--quick"], 0)
case("bench arena too small names --arena-mib",
     [TPF, "bench", "--section", "dynamic", "--capacity", "1024", "--hidden", "4096",
      "--arena-mib", "1", "--quick"], "nonzero", out="raise it with --arena-mib, now 1")
case("demo arena too small", argv(D, {"--arena-mib": "1", "--capacity": "4096",
                                      "--hidden": "1024"}), 1, out="--arena-mib")
case("demo backend cuda without CUDA or GPU", argv(D, {"--backend": "cuda"}), "nonzero")
# a wait bound the run meets: the error is the run's own (not a stale layout probe's) and names
# the option that raises it
case("demo timeout names --timeout-ms", argv(D, {"--tp": "8", "--capacity": "64", "--hidden": "8",
                                                 "--timeout-ms": "1", "--max-delay-us": "100000"}),
     1, out=["TPF_ETIMEOUT: rank", "raise it with --timeout-ms, now 1", "result            FAILED"])
case("demo capacity breaks alignment", argv(D, {"--tp": "1", "--capacity": "1", "--hidden": "4"}),
     2, err=["--capacity '1'", "breaks a layout rule", "smallest capacity >= 1 that every layout"])
case("plan capacity breaks alignment", argv(P, {"--tp": "1", "--capacity": "1", "--hidden": "1"}),
     2, err="TPF_EALIGN")
for over in [{"--tp": "1", "--capacity": "8", "--hidden": "4"}, {"--seed": str(U64 - 1)},
             {"--seed": "0"}, {"--max-delay-us": "0"}, {"--timeout-ms": "3600000"},
             {"--rows": "1"}, {"--dtype": "fp32"}, {"--arena-mib": "64"},
             {"--tp": "8", "--capacity": "64", "--hidden": "64"}]:
    case("demo valid %s" % over, argv(D, over), 0, out="result            every check OK")
case("demo --mode procs with --trace", argv(D, {"--mode": "procs", "--trace": "/tmp/x.json"}), 2,
     err=["--trace applies to --mode threads only", "--mode threads"])
case("demo --mode procs with --arena-mib", argv(D, {"--mode": "procs", "--arena-mib": "64"}), 2,
     err="--arena-mib applies to --mode threads only")
case("demo --mode procs with --backend cuda", argv(D, {"--mode": "procs", "--backend": "cuda"}),
     2, err="--mode procs runs on --backend sim only")
case("demo --no-check", argv(D, extra=["--no-check"]), 0, out="(checks off)")
case("demo --trace ok", argv(D, {"--trace": "/tmp/tpflex_cli_test_trace.json"}), 0,
     out="trace             /tmp/tpflex_cli_test_trace.json")
case("demo --opt=value", [TPF, "demo", "--tp=2", "--capacity=32", "--hidden=16",
                          "--microbatches=1"], 0, out="every check OK")
if not QUICK:  # the default shapes: the longest run of the table
    case("demo default", [TPF, "demo"], 0,
         out=["12 of 12 run, 12 checked OK", "every check OK", "6 dgrad/wgrad", "tokens",
              "rows/rank", "(external:", "a multiple of 4"])

# ---- bench: boundaries ----
B = "bench"
for over in [{"--iters": "1"}, {"--warmup": "0"}, {"--calls": "100"}, {"--tp": "1"},
             {"--section": "dynamic"}, {"--csv": "/tmp/tpflex_cli_test.csv"},
             {"--json": "/tmp/tpflex_cli_test.json"}]:
    case("bench valid %s" % over, argv(B, over), 0, out="bench finished: all checks passed")
case("bench --section repeated", argv(B, extra=["--section", "chunking"]), 0,
     out=["Section 1", "Section 3"])
case("bench help numbering", [TPF, "bench", "--help"], 0,
     out=["1 setshape", "2 dynamic", "3 chunking", "4/5 tp", "6 planner"])
# the tables carry the numbers the help gives; section 1's table says (in its rows, not only in a
# note) that the simulator's set_active_shape includes the canary fill
case("bench tables numbered as the help", argv(B, extra=["--section", "dynamic", "--section",
                                                         "tp", "--section", "chunking"]), 0,
     out=["Section 1: cost of changing T", "Section 2: dynamic T", "Section 3: chunking",
          "Section 4/5:", "bench finished: all checks passed"])
case("bench section 1 canary in the table", argv(B), 0,
     out=["tpf_comm_set_active_shape", "(+ sim canary fill of inactive bytes)",
          "tpf_manager_set_active_shape", "(+ sim canary fill)"])
if not HAVE_CUDA:
    case("bench cuda without CUDA", argv(B, {"--backend": "cuda"}), 2,
         err="this build has no CUDA backend")
# the planner section (sim, tiny): fixed, no overlap and adaptive side by side, with predictions
PL = [TPF, "bench", "--backend", "sim", "--section", "planner", "--tp", "4", "--capacity", "256",
      "--hidden", "64", "--n", "32", "--iters", "1", "--warmup", "0", "--quick"]
case("bench planner sim", PL, 0,
     out=["Section 6:", "adapt/min", "pred(us)", "Section 6b", "pred/meas", "adaptive (",
          "bench finished: all checks passed"])
case("bench planner --cost --model dedicated", PL + ["--cost", CAL_OUT, "--model", "dedicated"], 0,
     out=["model: dedicated", CAL_OUT])
case("bench planner --cost missing", PL + ["--cost", "/nonexistent/c.txt"], 2,
     err="--cost '/nonexistent/c.txt' cannot be read")
case("bench --cost without planner", argv(B, extra=["--cost", CAL_OUT]), 2,
     err="--cost applies to --section planner only")
case("bench --model without planner", argv(B, extra=["--model", "shared"]), 2,
     err="--model applies to --section planner only")
case("bench planner --iters too many", [TPF, "bench", "--section", "planner", "--iters", "167"], 2,
     err="--iters '167'")
case("bench planner + setshape", argv(B, extra=["--section", "planner"]) , 0,
     out=["Section 1", "Section 6:"])

# the tp section's modes (--mode threads|procs|both), T and P lists, the procs bound
TPM = [TPF, "bench", "--backend", "sim", "--section", "tp", "--tp-list", "2", "--capacity", "64",
       "--hidden", "16", "--n", "16", "--iters", "1", "--warmup", "0"]
for mode in ["threads", "procs", "both"]:
    want = ["Section 4/5 modes", "tT/tC/(T/C)", "enqueue(us)", "tp section: mode=" + mode,
            "T=16,64", "bench finished: all checks passed",
            # the simulator has no enqueue counters: a note instead of the breakdown table
            "# enqueue breakdown: not measured: it needs the CUDA backend"]
    want += [" procs "] if mode != "threads" else []
    want += [" threads "] if mode != "procs" else []
    case("bench tp --mode %s" % mode, TPM + ["--mode", mode, "--tokens", "16"], 0, out=want)
case("bench tp default mode on sim is threads", TPM + ["--tokens", "32,64"], 0,
     out=["tp section: mode=threads", "T=32,64", "procs mode not run"])
case("bench tp --mode procs --timeout", TPM + ["--mode", "procs", "--timeout", "60"], 0,
     out="bench finished: all checks passed")
case("bench tp --tp-list 2,4", TPM[:6] + ["--tp-list", "2,4"] + TPM[8:] + ["--tokens", "32"], 0,
     out=["tp section: mode=threads  P=2,4  T=32,64", "bench finished: all checks passed"])
case("bench --mode without tp", argv(B, {"--mode": "both"}), 2,
     err="--mode applies to --section tp only")
case("bench --tokens without tp", argv(B, {"--tokens": "32"}), 2,
     err="--tokens applies to --section tp only")
case("bench --tp-list without tp", argv(B, {"--tp-list": "2"}), 2,
     err="--tp-list applies to --section tp only")
# the host section: --tp-list and --tokens feed its CUDA table only, so on the simulator they
# are refused; with --backend cuda they pass the parser, and then a build without CUDA says so
# (2) and a CUDA build without a usable GPU stops with the clear 'needs a GPU' status (1) before
# any table (with a GPU it runs: exit 0 and the CUDA table)
HOSTS = [TPF, "bench", "--backend", "sim", "--section", "host", "--quick"]
case("bench host sim --tp-list", HOSTS + ["--tp-list", "1,2"], 2,
     err="--tp-list applies to --section tp only")
case("bench host sim --tokens", HOSTS + ["--tokens", "64"], 2,
     err="--tokens applies to --section tp only")
HOSTC = [TPF, "bench", "--backend", "cuda", "--section", "host", "--quick"]
for extra in ([], ["--tp-list", "1,2", "--tokens", "1024,4096"]):
    if not HAVE_CUDA:
        case("bench cuda host without CUDA %s" % extra, HOSTC + extra, 2,
             err="this build has no CUDA backend")
        continue
    count += 1
    try:
        p = subprocess.run(HOSTC + extra, capture_output=True, text=True, timeout=600)
        rc, so, se = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        rc, so, se = "timeout", "", ""
    no_gpu = rc == 1 and "--backend cuda needs a GPU (" in se and "Section host" not in so
    ran = rc == 0 and "Section host (CUDA)" in so and "bench finished: all checks passed" in so
    if not (no_gpu or ran):
        failures.append("bench cuda host %s: want exit 1 and 'needs a GPU' on stderr (no GPU) or "
                        "exit 0 with the CUDA table (a GPU); exit %s, stdout %r, stderr %r"
                        % (extra, rc, so[-300:], se[-300:]))
case("bench --timeout with threads only", TPM + ["--mode", "threads", "--timeout", "5"], 2,
     err="--timeout applies to --mode procs or both only")
for val, msg in [("16,x", "'x' is not a decimal number in [1, 64]"),
                 ("16,,32", "'' is not a decimal number"), ("016", "'016' is not a decimal"),
                 ("65", "'65' is not a decimal number in [1, 64]"), ("0", "'0' is not"),
                 ("32,16", "ascending without repeats"), ("16,16", "ascending without repeats"),
                 ("15", "15 is not a multiple of P = 2"), ("16,", "'' is not a decimal")]:
    case("bench --tokens %r" % val, TPM + ["--tokens", val], 2, err=["--tokens '%s'" % val, msg])
for val, msg in [("0", "'0' is not a decimal number in [1, 64]"), ("65", "[1, 64]"),
                 ("4,2", "ascending"), ("2,x", "'x'"), ("1,2,3,4,5,6,7,8,9", "at most 8 values")]:
    case("bench --tp-list %r" % val, TPM[:6] + ["--tp-list", val] + TPM[8:], 2,
         err=["--tp-list '%s'" % val, msg])
case("bench --tokens not a multiple of a listed P", TPM[:6] + ["--tp-list", "2,4"] + TPM[8:] +
     ["--tokens", "6"], 2, err="6 is not a multiple of P = 4")
# --ops: the operations of the tp section to run (names as the tables print them); the serial
# baselines a selected row needs always run, the others do not; forwarded to procs-mode workers
OPS = ["ring_ag+gemm", "ring_ag_aggr+gemm", "gemm+ring_rs", "gemm+pipeline_rs"]
TPM4 = TPM[:6] + ["--tp-list", "2,4"] + TPM[8:] + ["--tokens", "32"]
for name in OPS:  # each alone (the smallest list), threads and procs
    serial = "serial_ag,gemm" if "ag" in name else "serial_gemm,rs"
    other = "serial_gemm,rs" if "ag" in name else "serial_ag,gemm"
    for mode in ["threads", "procs"]:
        args = TPM4 + ["--mode", mode, "--ops", name]
        count += 1
        rc, so, se = run(args)
        rows = [l.split()[0] for l in so.splitlines() if l and not l.startswith("#")]
        want = {name, serial}
        if rc != 0 or set(rows) != want or "ops=" + name not in so or \
                "bench finished: all checks passed" not in so:
            failures.append("bench --ops %s --mode %s: want exit 0 and rows of %s only; got exit "
                            "%s, rows %s\n    stderr: %s" % (name, mode, sorted(want), rc,
                                                            sorted(set(rows)), se[-300:]))
        if name == "ring_ag_aggr+gemm" and "P=2: no operation of --ops runs at this P" not in so:
            failures.append("bench --ops ring_ag_aggr+gemm --mode %s: no note for P=2" % mode)
case("bench --ops all four (the largest list)", TPM4 + ["--mode", "both", "--ops", ",".join(OPS)],
     0, out=["tp section: mode=both  P=2,4  T=32,64\n", "ring_ag_aggr+gemm", "gemm+ring_rs",
             "serial_gemm,rs", "bench finished: all checks passed"])
for val, msg in [("xyz", "unknown operation 'xyz'"), ("ring_ag+gemm,", "unknown operation ''"),
                 (",ring_ag+gemm", "unknown operation ''"), ("serial_ag", "unknown operation"),
                 ("RING_AG+GEMM", "unknown operation 'RING_AG+GEMM'"),
                 ("ring_ag+gemm ", "unknown operation 'ring_ag+gemm '"),
                 ("ring_ag+gemm,gemm+ring_rs,ring_ag+gemm", "'ring_ag+gemm' given twice")]:
    case("bench --ops %r" % val, TPM + ["--ops", val], 2,
         err=["--ops '%s'" % val, msg] + ([] if "twice" in msg else [", ".join(OPS)]))
case("bench --ops none runs at any P", TPM + ["--ops", "ring_ag_aggr+gemm"], 2,
     err=["--ops 'ring_ag_aggr+gemm': no operation runs at any P", "even P >= 4"])
case("bench --ops without tp", argv(B, {"--ops": "ring_ag+gemm"}), 2,
     err="--ops applies to --section tp only")
# --adaptive: every selected operation also on a TPF_PLAN_ADAPTIVE communicator, rows
# 'op[adaptive]' in both modes with the planner's split count per T in a note; --cost/--model
# apply to it (the workers get the same table)
ADA = TPM4 + ["--mode", "both", "--adaptive"]
count += 1
rc, so, se = run(ADA)
rows = [l.split()[:2] for l in so.splitlines() if l and not l.startswith("#")]
for name in OPS:
    for mode in ["threads", "procs"]:
        if [name + "[adaptive]", mode] not in rows:
            failures.append("bench --adaptive: no %s[adaptive] %s row" % (name, mode))
for want in ["adaptive: cost table ", "model shared", "[adaptive]: the operation on a "
             "TPF_PLAN_ADAPTIVE communicator", "ring_ag+gemm[adaptive] threads P=2: planner chose "
             "splits T=32: ", "gemm+pipeline_rs[adaptive] procs P=4: planner chose splits T=32: ",
             "ring_ag_aggr+gemm[adaptive] procs P=4", "bench finished: all checks passed"]:
    if rc != 0 or want not in so:
        failures.append("bench --adaptive: exit %s, stdout lacks %r\n    stderr: %s" %
                        (rc, want, se[-300:]))
case("bench --adaptive --ops --cost --model dedicated",
     TPM + ["--mode", "procs", "--adaptive", "--ops", "gemm+ring_rs", "--cost", CAL_OUT, "--model",
            "dedicated"], 0,
     out=["adaptive: cost table " + CAL_OUT + ", model dedicated", "gemm+ring_rs[adaptive] ",
          "gemm+ring_rs[adaptive] procs P=2: planner chose splits T=8: ",
          "bench finished: all checks passed"])
case("bench --adaptive --cost missing", TPM + ["--adaptive", "--cost", "/nonexistent/c.txt"], 2,
     err="--cost '/nonexistent/c.txt' cannot be read")
case("bench tp --cost without --adaptive", TPM + ["--cost", CAL_OUT], 2,
     err="--cost applies to --section planner only (or to the tp section with --adaptive)")
case("bench tp --model without --adaptive", TPM + ["--model", "dedicated"], 2,
     err="--model applies to --section planner only")
case("bench --adaptive without tp", argv(B, extra=["--adaptive"]), 2,
     err="--adaptive applies to --section tp only")
count += 1
rc, so, _ = run(TPM + ["--mode", "threads"])
if "[adaptive]" in so:
    failures.append("bench tp without --adaptive printed adaptive rows")
# never a breakdown table (nor its CSV/JSON rows) on the simulator: nothing measured it
count += 1
J = "/tmp/tpflex_cli_tp_enq.json"
rc, so, _ = run(TPM + ["--mode", "both", "--json", J])
try:
    with open(J) as f:
        jt = f.read()
except OSError:
    jt = ""
if rc != 0 or "enqueue breakdown (CUDA backend" in so or "tp_enqueue" in jt or "tp_modes" not in jt:
    failures.append("bench tp sim: want no enqueue breakdown table (stdout or JSON) and the "
                    "tp_modes table in the JSON; exit %s" % rc)
case("bench --proc-worker outside the launcher", TPM + ["--proc-worker", "/tmp/tpflex_cli_w"], 1,
     err="only the tp section's procs mode starts it")
if not HAVE_CUDA:
    case("bench cuda tp modes without CUDA", [TPF, "bench", "--backend", "cuda", "--section", "tp",
                                              "--mode", "both"], 2,
         err="this build has no CUDA backend")

# ---- the tools' small frictions ----
PRED = argv(P, {"--tp": "4", "--capacity": "4096", "--tokens": "1024", "--hidden": "1024"},
            extra=["--predict"])
# plan output has no -1 sentinels: "-" in text, null in JSON, where a step has no chunk or peer
count += 1
rc, so, _ = run(PRED)
tl = [l for l in so.splitlines() if " chunk " in l and ".." in l]
tc = [l.split(" chunk ")[1].split()[0] for l in tl]
if rc != 0 or not tl or "-1" in tc or "-" not in tc:
    failures.append("plan --predict timeline: want chunk '-' (never -1) for HANDSHAKE; exit %s, "
                    "lines %r" % (rc, tl[:3]))
count += 1
rc, so, _ = run(argv(P, extra=["--json"]))
try:
    steps = [st for sc in json.loads(so)["schedules"] for st in sc["steps"]]
    hs = [st for st in steps if st["kind"] == "HANDSHAKE"]
    ok = rc == 0 and hs and all(st["chunk"] is None and st["peer"] is None for st in hs) and all(
        st[k] is None or st[k] >= 0 for st in steps for k in ("chunk", "peer"))
except (ValueError, KeyError, TypeError):
    ok = False
if not ok:
    failures.append("plan --json: want chunk/peer null (never -1) where a step has none; exit %s, "
                    "stdout %r" % (rc, so[:300]))
# --predict --json: one object with the candidates, their timelines, the choice and why
count += 1
rc, so, se = run(PRED + ["--json"])
try:
    j = json.loads(so)
    c = j["candidates"]
    ch = j["chosen"]
    ok = (rc == 0 and len(c) >= 2 and c[ch]["chosen"] and
          sum(1 for x in c if x["chosen"]) == 1 and
          all(x["timeline"] is None or x["timeline"]["steps"] for x in c) and
          all(st["chunk"] is None or st["chunk"] >= 0
              for x in c if x["timeline"] for st in x["timeline"]["steps"]) and
          abs(c[ch]["vs_best"] - 1.0) < 1e-9 and j["why"].startswith(c[ch]["label"]))
except (ValueError, KeyError, TypeError, IndexError):
    ok = False
if not ok:
    failures.append("plan --predict --json: want one JSON object with candidates, timelines, "
                    "chosen and why; exit %s, stdout %r, stderr %r" % (rc, so[:300], se[-300:]))
case("plan --predict --json error is JSON", argv(P, extra=["--predict", "--json", "--cost",
                                                          "/nonexistent/t"]), 2,
     out=['"status":"error"', "--cost '/nonexistent/t' cannot be read"])
# the choice line reads the right way: the next best takes N x as long, N >= 1 unless the faster
# one was held back by a margin (then the line says so)
count += 1
rc, so, _ = run(PRED)
line = next((l for l in so.splitlines() if l.startswith("choice: ")), "")
try:
    ratio = float(line.split("takes ")[1].split("x as long")[0])
    ok = rc == 0 and (ratio >= 1.0 or "kept" in line) and "x the next best" not in line
    # the number is the next best's predicted time over the chosen one's
    times = [float(l.split()[-5]) for l in so.splitlines() if l.strip().endswith(("yes", "<- chosen"))]
    ok = ok and abs(ratio - sorted(times)[1] / sorted(times)[0]) < 2e-3
except (IndexError, ValueError):
    ok = False
if not ok:
    failures.append("plan --predict choice line: want 'the next best, X (..), takes N.NNNx as "
                    "long' with N >= 1 = next best / chosen; got %r" % line)
# --project: the choice column fits its longest label (every row as long as the header)
for over in [["--algo", "ring", "--coll", "rs"], []]:
    count += 1
    rc, so, _ = run([TPF, "plan", "--project", "--tp", "8"] + over)
    lines = so.splitlines()
    head = next((l for l in lines if l.startswith("op ")), "")
    rows = [l for l in lines if l[:12].strip() in ("ring ag", "ring rs", "pipeline rs") and
            "not projected" not in l]
    if rc != 0 or not rows or any(len(l) != len(head) for l in rows):
        failures.append("plan --project %s: rows must line up with the header (choice column "
                        "sized to its longest label); header %d chars, rows %s" %
                        (" ".join(over), len(head), sorted(set(len(l) for l in rows))))
# bench legends are whole lines however long (a 512-byte buffer cut them)
count += 1
rc, so, _ = run([TPF, "bench", "--backend", "sim", "--section", "tp", "--tp", "2", "--capacity",
                 "64", "--hidden", "16", "--n", "16", "--iters", "1", "--warmup", "0",
                 "--mode", "threads", "--ops", "ring_ag+gemm"])
leg = next((l for l in so.splitlines() if l.startswith("# serial(us): the serial baseline")), "")
if rc != 0 or len(leg) <= 512 or not leg.endswith("tT/tC/(T/C) = 1 when the time scales with T"):
    failures.append("bench legend: want the whole serial(us) line (over 512 characters, ending "
                    "'... scales with T'); exit %s, got %d characters ending %r" %
                    (rc, len(leg), leg[-60:]))

# ---- FP8 in the planner (issue 28): fp8 gemm points from calibrate, the fallback on tables
# without them (said in the output), the RS site of an fp8 GEMM priced with bf16 partials ----
FP8P = [TPF, "plan", "--tp", "8", "--capacity", "32768", "--hidden", "8192", "--algo", "ring",
        "--coll", "ag", "--dtype", "fp8_e4m3", "--tokens", "4096", "--predict"]
FALLBACK = "no fp8_e4m3 gemm points: fp8_e4m3 GEMMs are priced on its bf16 points"
case("plan --predict fp8 on the shipped table", FP8P, 0, out=["<- chosen", FALLBACK])
count += 1
rc, so, se = run(FP8P + ["--cost", SIM_COST])  # the synthetic table has fp8 points: no note
if rc != 0 or "<- chosen" not in so or "no fp8_e4m3 gemm points" in so:
    failures.append("plan --predict fp8 on sim.txt: want a choice and no fallback note; exit %s, "
                    "stdout %r, stderr %r" % (rc, so[:400], se[-300:]))
case("plan --predict fp8 rs site", FP8P[:-7] + ["--coll", "rs", "--dtype", "fp8_e5m2", "--tokens",
                                                "4096", "--predict"], 0,
     out=["reduce-scatter site of an fp8_e5m2 GEMM", "bf16 partials", "<- chosen",
          "no fp8_e5m2 gemm points"])
count += 1
rc, so, se = run(FP8P + ["--json"])
try:
    j = json.loads(so)
    ok = (rc == 0 and j["gemm_dtype"] == "fp8_e4m3" and j["gemm_points_dtype"] == "bf16" and
          j["buffer_dtype"] == "fp8_e4m3" and j["candidates"][j["chosen"]]["chosen"])
except (ValueError, KeyError, TypeError, IndexError):
    ok = False
if not ok:
    failures.append("plan --predict fp8 --json: want gemm_dtype fp8_e4m3 priced on bf16 points; "
                    "exit %s, stdout %r, stderr %r" % (rc, so[:300], se[-300:]))
with open("/tmp/tpflex_cli_nogemm_cost.txt", "w") as f:
    f.write("launch_us 1\nhandshake_us 1\nbarrier_us 1\ncopy peer 1 1\ncopy local 1 1\n"
            "reduce 1 1\n")
case("plan --predict fp8 no gemm point", FP8P + ["--cost", "/tmp/tpflex_cli_nogemm_cost.txt"], 2,
     err=["no gemm point for fp8_e4m3", "fp8_e5m2, bf16, fp16, fp32"])
case("calibrate sim fp8 points", [TPF, CAL, "--backend", "sim"], 0,
     out="gemm fp8_e4m3 4096 1024 1024 ", err="4 of them fp8")
CAL8 = "/tmp/tpflex_cli_calibrated_nofp8.txt"
count += 1
rc, so, se = run([TPF, CAL, "--backend", "sim", "--fp8", "off", "--out", CAL8])
body = open(CAL8).read() if rc == 0 and os.path.exists(CAL8) else ""
if rc != 0 or "gemm fp8" in body or "gemm bf16" not in body or "0 of them fp8" not in so:
    failures.append("calibrate sim --fp8 off: want a table without fp8 gemm lines; exit %s, "
                    "stdout %r" % (rc, so[-300:]))
case("calibrate --fp8 off table feeds plan --predict fp8", FP8P + ["--cost", CAL8], 0,
     out=["<- chosen", FALLBACK])

print("%d cases, %d failed" % (count, len(failures)))
for f in failures:
    print("FAIL " + f)
sys.exit(1 if failures else 0)
