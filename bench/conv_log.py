#!/usr/bin/env python3
"""Where measuring cuDNN's convolution algorithms spends its time, and what it chose:
a summary of the lines `GP_CONV_VERBOSE=1 gpipe-onnx train ...` writes on stderr.

    GP_CONV_VERBOSE=1 gpipe-onnx train model.onnx ... --algorithms alg.txt 2> conv.log
    python3 bench/conv_log.py conv.log [more.log ...]   (.gz files too)

For each log: the problems and the wall time the trainer reported; the legacy API's
cudnnFind time; the graph API's plans and timing, per engine, as the candidates' cost
(each candidate's best time times the calls it ran, from the give-up rules of
src/backend/cuda/conv_graph.cpp: a first untimed call, then up to 3 timed ones, fewer
when far behind the fastest so far); configurations listed twice in one candidate
list; which API won each direction, the engines that won most; and how each result
added into its output was made (legacy beta 1, the graph API plus an add, the graph
API's engines with beta 1) with the median time of the winner against the next way.

The cost model is an estimate (it does not see the warm-up call's own time); it is
checked against the log's own `seconds` lines, printed beside it.
"""
import argparse
import collections
import gzip
import re
import statistics
import sys

# conv_graph.cpp's constants (TIMED_RUNS, GIVE_UP_RATIO, WARM_GIVE_UP_RATIO, WARM_GIVE_UP_MS).
TIMED_RUNS = 3
GIVE_UP_RATIO = 1.25
WARM_RATIO = 10.0
WARM_MS = 50.0

CANDIDATE = re.compile(r"^conv-choice graph(-beta)? (fwd|data|filter) name=(\S+) ms=(\S+)")
LIST_END = re.compile(r"^conv-choice (?:graph (fwd|data|filter) seconds|(fwd|data|filter)-accumulate )")
GRAPH_SECONDS = re.compile(r"^conv-choice graph \S+ seconds: (\d+) plans built in (\S+), measured in (\S+)")
LEGACY_SECONDS = re.compile(r"^conv-choice legacy seconds: (\S+)")
CHOSEN_GRAPH = re.compile(r"^conv-choice chosen (\w+) graph name=(\S+) ms=(\S+) legacy_ms=(\S+)")
CHOSEN_LEGACY = re.compile(r"^conv-choice chosen (\w+) legacy algo=(\S+) ms=(\S+) graph_ms=(\S+)")
ACCUMULATE = re.compile(r"^conv-choice (\w+)-accumulate (\S+) legacy algo=\S+ ms=(\S+) graph ms=(\S+) "
                        r"add ms=(\S+) graph-beta (\S+) ms=(\S+)")
PROBLEM = re.compile(r"^conv-choice problem ")
TOTAL = re.compile(r"measured cuDNN's convolution algorithms: (\d+) problems in (\S+) s")


def calls_of(ms, best):
    """Calls a candidate of best time `ms` ran with `best` the fastest so far (-1: none)."""
    if best > 0 and ms > max(WARM_RATIO * best, best + WARM_MS):
        return 1
    if best > 0 and ms > GIVE_UP_RATIO * best:
        return 2
    return 1 + TIMED_RUNS


def engine_of(name):
    return name.split("_")[0]


def summarize(path, out):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", errors="replace") as f:
        lines = f.read().splitlines()
    problems = 0
    total = None
    legacy_s = 0.0
    graph_plans, graph_build_s, graph_run_s = 0, 0.0, 0.0
    cost = {"graph": collections.Counter(), "graph-beta": collections.Counter()}
    lists = {"graph": 0, "graph-beta": 0}
    twice = collections.Counter()
    twice_cost = 0.0
    won_api = collections.Counter()
    won_engine = collections.Counter()
    added = collections.Counter()
    margins = collections.defaultdict(list)
    current = []
    kind = None
    for line in lines:
        m = CANDIDATE.match(line)
        if m:
            kind = "graph-beta" if m.group(1) else "graph"
            current.append((m.group(3), float(m.group(4))))
            continue
        if LIST_END.match(line) and current:
            best = -1.0
            seen = set()
            lists[kind] += 1
            for name, ms in current:
                if ms < 0:
                    continue
                c = ms * calls_of(ms, best) / 1e3
                cost[kind][engine_of(name)] += c
                if name in seen:
                    twice[name] += 1
                    twice_cost += c
                seen.add(name)
                if best < 0 or ms < best:
                    best = ms
            current = []
        if PROBLEM.match(line):
            problems += 1
        elif TOTAL.search(line):
            m = TOTAL.search(line)
            total = (int(m.group(1)), float(m.group(2)))
        elif LEGACY_SECONDS.match(line):
            legacy_s += float(LEGACY_SECONDS.match(line).group(1))
        elif GRAPH_SECONDS.match(line):
            m = GRAPH_SECONDS.match(line)
            graph_plans += int(m.group(1))
            graph_build_s += float(m.group(2))
            graph_run_s += float(m.group(3))
        elif CHOSEN_GRAPH.match(line):
            m = CHOSEN_GRAPH.match(line)
            won_api[(m.group(1), "graph")] += 1
            won_engine[m.group(2)] += 1
        elif CHOSEN_LEGACY.match(line):
            m = CHOSEN_LEGACY.match(line)
            won_api[(m.group(1), "legacy")] += 1
            won_engine["legacy algo=" + m.group(2)] += 1
        elif ACCUMULATE.match(line):
            m = ACCUMULATE.match(line)
            way = m.group(2)
            added[(m.group(1), way)] += 1
            legacy_ms, graph_ms, add_ms, beta_ms = (float(m.group(i)) for i in (3, 4, 5, 7))
            times = {"legacy": legacy_ms, "graph": graph_ms + add_ms if add_ms >= 0 else -1, "graph-beta": beta_ms}
            mine = times.get(way, -1)
            others = [t for w, t in times.items() if w != way and t > 0]
            if mine > 0 and others:
                margins[way].append(mine / min(others))

    out.write("== %s\n" % path)
    if total:
        out.write("problems: %d (%d problem lines), measured in %.1f s (the trainer's own count)\n"
                  % (total[0], problems, total[1]))
    else:
        out.write("problems: %d problem lines (no total line: the run ended before it?)\n" % problems)
    out.write("legacy API (cudnnFind): %.1f s\n" % legacy_s)
    out.write("graph API, plain calls: %d plans built in %.1f s, timed in %.1f s (the log's seconds lines)\n"
              % (graph_plans, graph_build_s, graph_run_s))
    for k in ("graph", "graph-beta"):
        if not lists[k]:
            continue
        s = sum(cost[k].values())
        out.write("%s candidates' estimated cost: %.1f s over %d lists; by engine: %s\n" % (
            k, s, lists[k], ", ".join("%s %.1f s" % (e, c) for e, c in cost[k].most_common(6))))
    if twice:
        out.write("configurations listed twice in one list: %s; their second runs about %.1f s\n" % (
            ", ".join("%s x%d" % (n, c) for n, c in twice.most_common(5)), twice_cost))
    else:
        out.write("no configuration listed twice in one list\n")
    dirs = ("fwd", "data", "filter")
    out.write("winning API per direction: %s\n" % ", ".join(
        "%s graph %d legacy %d" % (d, won_api[(d, "graph")], won_api[(d, "legacy")]) for d in dirs))
    out.write("engines that won most: %s\n" % ", ".join(
        "%s x%d" % (n, c) for n, c in won_engine.most_common(6)))
    if added:
        out.write("results added into their output, the way that won: %s\n" % ", ".join(
            "%s %s %d" % (d, w, c) for (d, w), c in sorted(added.items())))
        for way, r in sorted(margins.items()):
            out.write("  %s won at a median %.2fx the next way's time (%d calls)\n"
                      % (way, statistics.median(r), len(r)))


# A log in the format src/backend/cuda/conv_algos.cu and conv_graph.cpp write (--check).
SAMPLE = """conv-choice problem n=8 img_ch=4 img=8x8 col_ch=4 col=8x8 k=1x1 s=1x1 q=0x0 d=1x1 group=1 mode=fp32
conv-choice graph fwd name=eng1_k2=1 ms=0.0100 ws=0
conv-choice graph fwd name=eng0 ms=2.0000 ws=0
conv-choice graph fwd name=eng0 ms=2.0000 ws=0
conv-choice graph fwd seconds: 3 plans built in 0.001, measured in 0.004
conv-choice legacy seconds: 0.500
conv-choice graph-beta fwd name=eng1_k2=1 ms=0.0110 ws=0
conv-choice fwd-accumulate graph-beta legacy algo=1 ms=0.0200 graph ms=0.0100 add ms=0.0050 graph-beta eng1_k2=1 ms=0.0110
conv-choice chosen fwd graph name=eng1_k2=1 ms=0.0100 legacy_ms=0.0200
conv-choice chosen data legacy algo=1 ms=0.0300 graph_ms=0.0400
measured cuDNN's convolution algorithms: 1 problems in 0.6 s (kept in the algorithms file for the next run)
"""


def check():
    import io
    import os
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        f.write(SAMPLE)
    try:
        out = io.StringIO()
        summarize(f.name, out)
    finally:
        os.unlink(f.name)
    text = out.getvalue()
    # eng0 twice in the plain list; the added call won by the beta engine at 0.011 ms
    # against the graph API's 0.010 + 0.005 (0.73x).
    want = ["problems: 1 (1 problem lines), measured in 0.6 s",
            "legacy API (cudnnFind): 0.5 s",
            "3 plans built in 0.0 s, timed in 0.0 s",
            "configurations listed twice in one list: eng0 x1",
            "fwd graph 1 legacy 0, data graph 0 legacy 1",
            "fwd graph-beta 1",
            "graph-beta won at a median 0.73x the next way's time (1 calls)"]
    missing = [w for w in want if w not in text]
    if missing:
        sys.exit("conv_log.py --check: missing %s in:\n%s" % (missing, text))
    print("conv_log.py --check: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logs", nargs="*", help="stderr of a GP_CONV_VERBOSE=1 run (.gz too)")
    ap.add_argument("--check", action="store_true", help="check the parser on a built-in sample log")
    args = ap.parse_args()
    if args.check:
        check()
        return
    if not args.logs:
        ap.error("name at least one log (or --check)")
    for p in args.logs:
        try:
            summarize(p, sys.stdout)
        except OSError as e:
            sys.exit("conv_log.py: cannot read %s: %s" % (p, e.strerror or e))


if __name__ == "__main__":
    main()
