#!/usr/bin/env python3
"""Checks that #include arrows between Kiln's top-level directories only point down.

The layers (docs/architecture.md):

    dialects  <  formats  <  {passes < codegen, runtime}  <  compiler  <  tools
    support (image files, .npy) sits beside formats, used by tools and compiler.

Allowed: a directory includes its own files and those of the layers listed for it
below. The compiler reaches the runtime only through its installed headers
(runtime/include/kiln/: the public API and the calibration seam), never through
runtime/src or runtime/kernels. Tests may include anything.

Prints every violation as FILE:LINE: message and exits 1 when there is one.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ALLOWED = {
    "dialects": {"dialects"},
    "formats": {"formats"},
    "support": {"support"},
    "passes": {"passes", "dialects", "formats"},
    "codegen": {"codegen", "passes", "dialects", "formats"},
    "runtime": {"runtime", "formats"},
    "compiler": {"compiler", "codegen", "passes", "dialects", "formats", "support", "runtime-api"},
    "tools": {"tools", "compiler", "codegen", "passes", "dialects", "formats", "support", "runtime", "runtime-api"},
}

# Where quoted includes are looked up, in order (besides the including file's dir).
SEARCH = ["", "runtime/src", "runtime", "runtime/include"]

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    rel = os.path.relpath(path, ROOT)
    top = rel.split(os.sep)[0]
    if rel.startswith(os.path.join("runtime", "include") + os.sep):
        return "runtime-api"
    return top


def resolve(including, name):
    candidates = [os.path.join(os.path.dirname(including), name)]
    candidates += [os.path.join(ROOT, d, name) for d in SEARCH]
    for c in candidates:
        if os.path.isfile(c):
            return os.path.normpath(c)
    return None  # generated (build tree), system or third party


def main():
    problems = []
    for top in ALLOWED:
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if not f.endswith((".h", ".cc", ".cpp", ".c", ".def", ".inc")):
                    continue
                path = os.path.join(dirpath, f)
                src_layer = layer_of(path)
                allowed = ALLOWED.get(src_layer if src_layer != "runtime-api" else "runtime", set())
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for lineno, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = resolve(path, m.group(1))
                        if target is None or not target.startswith(ROOT + os.sep):
                            continue
                        dst_layer = layer_of(target)
                        if src_layer in ("runtime", "runtime-api") and dst_layer == "runtime-api":
                            continue
                        if dst_layer not in allowed and dst_layer != src_layer:
                            problems.append(f"{os.path.relpath(path, ROOT)}:{lineno}: {src_layer} includes "
                                            f"{os.path.relpath(target, ROOT)} ({dst_layer})")
    for p in problems:
        print(p)
    print(f"include layering: {len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
