#!/usr/bin/env python3
"""`tpflex demo --mode procs` (one process per simulator rank) against --mode threads, at one P.

  test_demo_procs.py PATH/TO/tpflex P

Checks: the run passes (exit 0, every microbatch OK, the bytes the simulator's processes moved
summed to the schedules', one registration per communicator); its table is the threads mode's
row for row (every column but the measured ops time); a run whose waits time out fails with
exit 1 in both modes; a rank process killed mid-run is named by rank 0 within seconds, the run
exits 1 and nothing is left in /dev/shm. Every run is bounded."""
import os
import re
import signal
import subprocess
import sys
import time

TPF, P = sys.argv[1], int(sys.argv[2])
SHAPE = ["--tp", str(P), "--capacity", "256", "--hidden", "64"]
BOUND_S = 120
fails = []


def run(args):
    p = subprocess.run([TPF, "demo"] + args, capture_output=True, text=True, timeout=BOUND_S)
    return p.returncode, p.stdout, p.stderr


def table(out):
    """The rows of the table without the ops-ms column (a measured time)."""
    rows = []
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 12 and f[0].isdigit() and f[-1] in ("OK", "FAIL"):
            rows.append(f[:-2] + f[-1:])
    return rows


def shm():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("tpflex-sim-")}
    except OSError:
        return set()


def expect(cond, what, out=""):
    if not cond:
        fails.append(what + ("\n" + "\n".join(out.strip().splitlines()[-15:]) if out else ""))


before = shm()
args = SHAPE + ["--microbatches", "6"]
rc, out, err = run(args + ["--mode", "procs"])
expect(rc == 0, f"procs run: exit {rc}", out + err)
expect(f"TP {P} (one process per rank)" in out, "procs header does not name the mode", out)
expect("6 of 6 run, 6 checked OK, 0 failed" in out, "procs summary: not 6 of 6 OK", out)
expect("backend-measured bytes equal the schedule's" in out, "procs: measured bytes differ", out)
expect("registrations     1 per communicator" in out, "procs: not one registration each", out)
expect(re.search(r"result +every check OK", out), "procs: no verdict", out)
trc, tout, terr = run(args)
expect(trc == 0, f"threads run: exit {trc}", tout + terr)
expect(table(out) == table(tout) and len(table(out)) == 6,
       f"tables differ:\nprocs   {table(out)}\nthreads {table(tout)}")

# Waits that time out (1 ms bound, steps delayed up to 20 ms): exit 1 in both modes.
bad = SHAPE + ["--microbatches", "2", "--max-delay-us", "20000", "--timeout-ms", "1"]
for mode in ("threads", "procs"):
    rc, out, err = run(bad + ["--mode", mode])
    expect(rc == 1 and "result            FAILED" in out and "TPF_ETIMEOUT" in out,
           f"{mode} timeout run: exit {rc}", out + err)

# A rank's process killed mid-run: rank 0 names it, the run fails, nothing is left behind.
if P >= 2:
    p = subprocess.Popen([TPF, "demo", "--mode", "procs", "--microbatches", "100000"] + SHAPE,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in p.stdout:  # the first table row: every rank is running microbatches
        lines.append(line)
        if table(line):
            break
    kids = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
    t0 = time.monotonic()
    os.kill(int(kids[P - 1]), signal.SIGKILL)  # the last rank (forked in rank order)
    try:
        rest, _ = p.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        p.kill()
        rest, _ = p.communicate()
        fails.append("killed rank: the run did not end")
    took = time.monotonic() - t0
    out = "".join(lines) + rest
    expect(p.returncode == 1, f"killed rank: exit {p.returncode}", out)
    named = re.search(r"rank %d left the group|rank %d \(pid \d+\)" % (P - 1, P - 1), out)
    expect(named and "result            FAILED" in out,
           "killed rank: not named, or no FAILED verdict", out)
    expect(took < 30, f"killed rank: the run took {took:.1f} s to end")
left = shm() - before
expect(not left, f"left behind in /dev/shm: {sorted(left)}")

for f in fails:
    print("FAIL", f)
print(f"demo procs P={P}: " + ("every check OK" if not fails else "FAILED"))
sys.exit(1 if fails else 0)
