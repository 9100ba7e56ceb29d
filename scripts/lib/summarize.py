#!/usr/bin/env python3
"""Sums the JUnit/xUnit reports of every suite and prints the closing line.

usage: summarize.py RESULTS_DIR [FAILED_STEP|REPORT ...]

Every test case in RESULTS_DIR/*.xml counts once; a failed step whose report shows
no failing case (a build error, a crash) counts as one failure more. Exit status is
1 when anything failed.
"""
import glob
import os
import sys
import xml.etree.ElementTree as ET


def count(path):
    passed = failed = skipped = 0
    failures = []
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        name = name if cls in ("", name) else f"{cls}.{name}"
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            failures.append(name)
        elif case.find("skipped") is not None or case.get("status") in ("notrun", "disabled"):
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, failures


def main():
    results_dir, failed_steps = sys.argv[1], sys.argv[2:]
    total_pass = total_fail = total_skip = 0
    print()
    print("== summary")
    for path in sorted(glob.glob(os.path.join(results_dir, "*.xml"))):
        suite = os.path.splitext(os.path.basename(path))[0]
        p, f, s, failures = count(path)
        total_pass += p
        total_fail += f
        total_skip += s
        print(f"  {suite:<16} {p:5d} passed {f:5d} failed {s:5d} skipped")
        for name in failures:
            print(f"    FAILED {name}")
    # A failed step counts once more unless its report already shows a failing case:
    # a build error or a crash before the report was written must not pass silently.
    for arg in failed_steps:
        step, _, report = arg.partition("|")
        if report and os.path.exists(report) and count(report)[1] > 0:
            continue
        print(f"    FAILED step: {step}")
        total_fail += 1
    if total_skip:
        print(f"  ({total_skip} skipped)")
    print(f"{total_pass} passed, {total_fail} failed")
    return 1 if total_fail else 0


if __name__ == "__main__":
    sys.exit(main())
