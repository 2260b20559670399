#!/usr/bin/env python3
"""tpflex plan --svg and --predict --svg: the two pictures, checked for structure against the
command's own JSON (an independent reading of the same schedules and candidates).

Schedule picture: well-formed XML (xml.etree); one <g class="rank"> per rank; in each, one lane
per stream that rank's steps use and one box per step, of the step's kind, in the order of the
JSON's steps; the boxes sized by the cost model (each box's start over its step's predicted start
is one scale for the whole picture, from --predict --json's timeline of the same schedule); T and
the split count in the title. Prediction picture: one series per candidate label, a circle of the
planner's choice at every T of the grid, the asked T's circle on the chosen candidate of
--predict --json, and the dashed line at the asked T.
Usage: test_svg.py PATH/TO/tpflex
"""
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

TPF = sys.argv[1] if len(sys.argv) > 1 else "tpflex"
NS = "{http://www.w3.org/2000/svg}"
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


def run(args):
    p = subprocess.run([TPF] + args, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        sys.exit("FAIL: %s exited %d: %s %s" % (" ".join(args), p.returncode, p.stdout[-400:],
                                               p.stderr[-400:]))
    return p.stdout


KIND = {"GEMM": "gemm", "SEND": "copy", "RECV": "wait", "REDUCE": "reduce",
        "PEER_REDUCE": "reduce", "BARRIER": "sync", "HANDSHAKE": "sync"}


def schedule_case(tmp, args, splits_label):
    path = os.path.join(tmp, "sched.svg")
    plan = json.loads(run(args + ["--json"]))
    out = run(args + ["--svg", path])
    check("svg: %s" % path in out, "%s: no 'svg:' line in the output" % args)
    root = ET.parse(path).getroot()  # raises on malformed XML
    title = root.find(NS + "title").text
    T = plan["active"][0]
    check("T=%d " % T in title and "splits %d" % plan["num_splits"] in title,
          "title %r lacks T=%d or splits %d" % (title, T, plan["num_splits"]))
    ranks = [g for g in root.iter(NS + "g") if g.get("class") == "rank"]
    check(len(ranks) == len(plan["schedules"]),
          "%d rank groups, want %d" % (len(ranks), len(plan["schedules"])))
    for g, sched in zip(ranks, plan["schedules"]):
        r = sched["rank"]
        steps = sched["steps"]
        lanes = [e for e in g.iter(NS + "rect") if e.get("class") == "lane"]
        boxes = [e for e in g.iter(NS + "rect") if (e.get("class") or "").startswith("box ")]
        streams = sorted({s["stream"] for s in steps})
        check(sorted(e.get("data-stream") for e in lanes) == streams,
              "rank %d: lanes %s, want the streams %s" % (
                  r, [e.get("data-stream") for e in lanes], streams))
        check(len(boxes) == len(steps), "rank %d: %d boxes, want %d steps" % (r, len(boxes),
                                                                           len(steps)))
        kinds = [e.get("class").split()[1] for e in boxes]
        check(kinds == [KIND[s["kind"]] for s in steps], "rank %d: box kinds %s" % (r, kinds))
    # Boxes sized by the cost model: rank 0's box starts against --predict's timeline of the same
    # schedule (the candidate with this split count) share one scale.
    plain = [a for i, a in enumerate(args) if a != "--splits" and
             (i == 0 or args[i - 1] != "--splits")]
    pred = json.loads(run(plain + ["--predict", "--json"]))
    cand = [c for c in pred["candidates"] if c["label"] == splits_label]
    if check(len(cand) == 1, "no candidate %r in --predict" % splits_label):
        tl = cand[0]["timeline"]["steps"]
        boxes = [e for e in ranks[0].iter(NS + "rect") if (e.get("class") or "").startswith("box ")]
        x0 = float(next(e for e in root.iter(NS + "rect") if e.get("class") == "lane").get("x"))
        scales = [(float(b.get("x")) - x0) / s["start_us"] for b, s in zip(boxes, tl)
                  if s["start_us"] > 1.0]
        check(len(scales) > 2 and max(scales) - min(scales) < 0.02 * max(scales),
              "box starts are not the cost model's start times at one scale: %s" % scales)
    return len(ranks)


def predict_case(tmp, args):
    path = os.path.join(tmp, "pred.svg")
    pred = json.loads(run(args + ["--predict", "--json"]))
    run(args + ["--predict", "--svg", path])
    root = ET.parse(path).getroot()
    T = pred["active"][0]
    series = [e for e in root.iter(NS + "path") if e.get("class") == "series"]
    labels = {e.get("data-label") for e in series}
    want = {c["label"] for c in pred["candidates"]}
    check(want <= labels, "series %s lack the candidates %s" % (sorted(labels), sorted(want)))
    check(len(labels) == len(series), "a label drawn twice: %s" % [e.get("data-label")
                                                                   for e in series])
    chosen = [e for e in root.iter(NS + "circle") if e.get("class") == "chosen"]
    ts = [int(e.get("data-t")) for e in chosen]
    check(len(ts) == len(set(ts)) and len(ts) >= 10,
          "want one choice per T of the grid (>= 10), got %s" % ts)
    at = [e for e in chosen if int(e.get("data-t")) == T]
    label = pred["candidates"][pred["chosen"]]["label"]
    check(len(at) == 1 and at[0].get("data-label") == label,
          "the choice at T=%d is %s, want %r" % (T, [e.get("data-label") for e in at], label))
    asked = [e for e in root.iter(NS + "line") if e.get("class") == "asked"]
    check(len(asked) == 1 and int(asked[0].get("data-t")) == T, "no dashed line at T=%d" % T)
    return len(series), len(chosen)


def main():
    base = ["plan", "--tp", "4", "--capacity", "4096", "--tokens", "1000", "--hidden", "1024",
            "--algo", "ring", "--coll", "ag"]
    with tempfile.TemporaryDirectory() as tmp:
        n = schedule_case(tmp, base, "ring ag splits 4")
        rs = ["plan", "--tp", "4", "--capacity", "2048", "--tokens", "512", "--hidden", "1024",
              "--algo", "pipeline", "--coll", "rs", "--splits", "4"]
        schedule_case(tmp, rs, "pipeline rs splits 4")
        path = os.path.join(tmp, "one.svg")  # --rank: that rank's timeline alone
        run(base + ["--rank", "2", "--svg", path])
        one = [g for g in ET.parse(path).getroot().iter(NS + "g") if g.get("class") == "rank"]
        check([g.get("data-rank") for g in one] == ["2"],
              "--rank 2 drew ranks %s" % [g.get("data-rank") for g in one])
        ns, nc = predict_case(tmp, base)
        predict_case(tmp, ["plan", "--tp", "8", "--capacity", "8192", "--tokens", "2048",
                           "--hidden", "4096", "--algo", "ring", "--coll", "rs"])
    if failures:
        for f in failures:
            print("FAIL:", f)
        sys.exit(1)
    print("plan svg: %d ranks' timelines, %d series and %d choices, structure as expected"
          % (n, ns, nc))


main()
