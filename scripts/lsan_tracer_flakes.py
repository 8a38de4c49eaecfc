#!/usr/bin/env python3
"""The failed tests of a meson test log that may have failed only because
LeakSanitizer's own stop-the-world tracer crashed at a process's exit.

    scripts/lsan_tracer_flakes.py BUILD/meson-logs/testlog.json

That crash ("Tracer caught signal 11" then "LeakSanitizer has encountered
a fatal error", google/sanitizers#1353) is the leak checker failing to
stop the process's threads, intermittently, after the process's work is
done: not a leak report and not a failure of the code. It may hit the test
binary itself or any gpipe-onnx the test runs; in the second case the test
sees that run abort and fails too (its own "[  FAILED  ]" or "FAIL:", and
the leaks of a test stopped midway), so those are no evidence against a
rerun: a real failure fails the rerun again. An AddressSanitizer error or
an UndefinedBehaviorSanitizer "runtime error:" is never the tracer's doing:
such a test is not rerun. .ci/run reruns the tests printed, once.

Prints their names (one line, space-separated); exits 1 when any failed
test failed otherwise (no tracer crash in its output, or a sanitizer
error beside it), 0 else.
"""
import json
import sys

TRACER = "Tracer caught signal"
FATAL = "LeakSanitizer has encountered a fatal error"
REAL = ("ERROR: AddressSanitizer", "runtime error:")


def main():
    flaky, real = [], []
    with open(sys.argv[1]) as f:
        for line in f:
            t = json.loads(line)
            if t.get("result") not in ("FAIL", "TIMEOUT"):
                continue
            out = (t.get("stdout") or "") + (t.get("stderr") or "")
            if t["result"] == "FAIL" and TRACER in out and FATAL in out and not any(r in out for r in REAL):
                flaky.append(t["name"])
            else:
                real.append(t["name"])
    if real:
        print("failed, not by the tracer's crash: " + " ".join(real), file=sys.stderr)
        return 1
    print(" ".join(flaky))
    return 0


if __name__ == "__main__":
    sys.exit(main())
