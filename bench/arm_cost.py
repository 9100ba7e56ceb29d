#!/usr/bin/python3
"""Cost of the generated Arm matmul kernels without Arm hardware: dynamic instructions per
multiply-accumulate counted under qemu-aarch64, and cycles per MAC predicted by llvm-mca for a
Neoverse V2 (Cortex-X3 class) core.

    /usr/bin/python3 bench/arm_cost.py [--features dotprod,i8mm] [--shapes 1x2048x2048,128x2048x2048]
                                       [--encodings int4,int8] [--json OUT.json]

For each Arm feature set: a tiny Llama checkpoint (tests/models/generate.py, preset tiny-llama)
is compiled by kiln-compile for `aarch64-linux-gnu` with those CPU features, W4A8 (int4 g32) and
W8A8 (int8) matmuls, `--emit=static-library`; bench/arm_cost/harness.cc is linked statically
against that kernel library and the aarch64 runtime (build/aarch64, `kiln_build_aarch64` in
scripts/lib/build.sh) and run under `qemu-aarch64 -cpu max -d in_asm,exec,nochain -dfilter
RANGE`, RANGE being the kernel library's code (or the row quantiser's), so that only the
kernel's instructions are logged: each executed translation block adds its instruction count.
Per shape M x N x K (output channels N, depth K; M = 1 is decode's GEMV) and encoding:
  matmul   instructions of one call of the generated kernel over all N channels, one thread;
  quant    instructions of the runtime's dynamic int8 quantisation of the M x K activations
           (kiln_uk_lhs_quant_qai8dx_f32_arm_neon, which Kiln runs before a generated W8A8/W4A8
           matmul on Arm; the pair-interleaving of the activations for SMMLA is in the matmul);
  mca      for every translation block of the kernel that executes >= 0.5% of its
           instructions: llvm-mca-19 -mcpu=neoverse-v2 cycles per iteration x executions,
           summed (compute only: no cache misses, no memory bandwidth), per MAC.
The harness first checks the kernel against the reference kernel on small shapes (21, 3, 1 and 30 x
296 x 256: row blocks of 16 and 5, and SME2's outer products and dot products; whole panels and a partial
one of both int4_p16k8 (16 rows) and int4_p128k4 (128 rows); int4_p16k16, whole panels only, over 288:
tiles of 12 and 8 rows, row pairs and a row alone, a block of 24 and one of 6; int4 also in groups of
64 and 128; within 1e-4 of the largest output).
Dynamic counts are deterministic: no repetitions. JSON out; never pass/fail.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FEATURES = {"neon": "", "dotprod": "+dotprod", "i8mm": "+dotprod,+i8mm", "sme2": "+dotprod,+i8mm,+sme,+sme2"}
# SME2 runs under the SME2-capable qemu (scripts/setup fetches it) at a streaming vector length.
QEMU_SME2 = os.environ.get("KILN_QEMU_SME2", "/opt/kiln/qemu-sme2/usr/bin/qemu-aarch64")
PRECISION = ["--precision=.*mlp.*=int4_g32_a8", "--precision=.*=int8_a8"]


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"arm_cost.py: {' '.join(map(str, cmd))} failed:\n{p.stdout}\n{p.stderr}")
    return p


def symbols(binary: str) -> dict[str, tuple[int, int]]:
    out = run(["llvm-nm-19", "-S", "--defined-only", binary]).stdout
    table = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tT":
            table[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
    return table


def count(qemu: list[str], harness: str, args: list[str], lo: int, hi: int, workdir: str):
    """Executed instructions in [lo, hi) and the executed blocks: {pc: (count, [words])}."""
    log = os.path.join(workdir, "qemu.log")
    run([*qemu, "-d", "in_asm,exec,nochain", "-dfilter", f"0x{lo:x}+0x{hi - lo:x}", "-D", log,
         harness, *args])
    blocks: dict[int, list[str]] = {}
    execs: collections.Counter = collections.Counter()
    cur = None
    with open(log, errors="replace") as f:
        for line in f:
            if line.startswith("IN:"):
                cur = []
                continue
            if cur is not None:
                m = re.match(r"0x([0-9a-f]+):\s+([0-9a-f]{8})\s", line)
                if m:
                    cur.append((int(m.group(1), 16), m.group(2)))
                    continue
                if cur:
                    blocks[cur[0][0]] = [w for _, w in cur]
                cur = None
            if line.startswith("Trace"):
                execs[int(line.split("[")[1].split("/")[1], 16)] += 1
    os.remove(log)
    total = sum(len(blocks[pc]) * n for pc, n in execs.items())
    return total, {pc: (n, blocks[pc]) for pc, n in execs.items()}


def mca_cycles(words: list[str], mcpu: str, mattr: str) -> float:
    """llvm-mca's cycles per iteration of one block (its words disassembled by llvm-mc)."""
    data = " ".join(f"0x{w[6:8]} 0x{w[4:6]} 0x{w[2:4]} 0x{w[0:2]}" for w in words)
    asm = run(["llvm-mc-19", "--disassemble", "-triple=aarch64", f"-mattr={mattr}"], input=data).stdout
    p = run(["llvm-mca-19", "-mtriple=aarch64", f"-mcpu={mcpu}", f"-mattr={mattr}", "-iterations=100"], input=asm)
    m = re.search(r"Total Cycles:\s+(\d+)", p.stdout)
    return int(m.group(1)) / 100.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--features", default="dotprod", help="comma list of " + ", ".join(FEATURES))
    ap.add_argument("--shapes", default="1x2048x2048,128x2048x2048", help="MxNxK list")
    ap.add_argument("--encodings", default="int4,int8")
    ap.add_argument("--compiler", default=os.path.join(ROOT, "build", "host", "bin", "kiln-compile"))
    ap.add_argument("--runtime", default=os.path.join(ROOT, "build", "aarch64", "runtime", "libkiln.a"),
                    help="the aarch64 runtime library (kiln_build_aarch64)")
    ap.add_argument("--qemu", default=os.environ.get("KILN_QEMU_AARCH64", "qemu-aarch64"))
    ap.add_argument("--qemu-sme2", default=QEMU_SME2, help="a qemu-aarch64 that runs SME2 (11.x)")
    ap.add_argument("--svl", type=int, default=512, help="streaming vector length in bits (sme2)")
    ap.add_argument("--mcpu", default="neoverse-v2")
    ap.add_argument("--json")
    ap.add_argument("--top", type=int, default=0, help="print the N blocks executing the most instructions")
    a = ap.parse_args()
    for tool in (a.compiler, a.runtime):
        if not os.path.exists(tool):
            sys.exit(f"arm_cost.py: {tool} is missing (build the host compiler and the aarch64 runtime first)")
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",") if s]
    result = {"tool": "bench/arm_cost.py", "qemu": run([a.qemu, "--version"]).stdout.splitlines()[0],
              "mca_cpu": a.mcpu, "host": platform.node(), "rows": []}
    if "sme2" in a.features.split(","):
        result["qemu_sme2"] = run([a.qemu_sme2, "--version"]).stdout.splitlines()[0]
        result["streaming_vector_bits"] = a.svl
    with tempfile.TemporaryDirectory(prefix="kiln-arm-cost-") as tmp:
        ckpt = os.path.join(tmp, "tiny-llama")
        run([sys.executable, os.path.join(ROOT, "tests", "models", "generate.py"), "--preset", "tiny-llama",
             "--out", ckpt])
        for feat in a.features.split(","):
            if feat not in FEATURES:
                sys.exit(f"arm_cost.py: unknown feature set {feat!r} (one of {', '.join(FEATURES)})")
            lib = os.path.join(tmp, f"k_{feat}")
            cmd = [a.compiler, ckpt, "-o", lib, "--target=aarch64-linux-gnu", "--emit=static-library", *PRECISION]
            if FEATURES[feat]:
                cmd.append(f"--cpu-features={FEATURES[feat]}")
            run(cmd)
            harness = os.path.join(tmp, f"harness_{feat}")
            run(["clang++-19", "--target=aarch64-linux-gnu", "-fuse-ld=lld", "-O2", "-std=c++17", "-static",
                 f"-DKILN_KERNELS=kiln_kernels_k_{feat}", f"-I{ROOT}", f"-I{ROOT}/runtime/include",
                 os.path.join(HERE, "arm_cost", "harness.cc"), lib + ".kernels.a", a.runtime, "-o", harness])
            syms = symbols(harness)
            gen = [v for k, v in syms.items() if "_gen_" in k]
            lo, hi = min(s for s, _ in gen), max(s + n for s, n in gen)
            qlo, qn = syms["kiln_uk_lhs_quant_qai8dx_f32_arm_neon"]
            mattr = "+neon" + ("," + FEATURES[feat] if FEATURES[feat] else "")
            qemu = ([a.qemu_sme2, "-cpu", f"max,sme-default-vector-length={a.svl // 8}"] if feat == "sme2"
                    else [a.qemu, "-cpu", "max"])
            for enc in a.encodings.split(","):
                # 21 rows (SME2: outer products) and 3 (SME2: the dot-product GEMV).
                check = run([*qemu, harness, "check", "21", "296", "256", enc]).stdout.strip()
                for m in ("3", "1", "30"):
                    check += "\n" + run([*qemu, harness, "check", m, "296", "256", enc]).stdout.strip()
                if enc == "int4":  # the group not a constant of the kernel
                    for m, group in (("21", "64"), ("1", "128")):
                        check += "\n" + run([*qemu, harness, "check", m, "296", "256", enc, "1", group]).stdout.strip()
                kernel = check.splitlines()[0].split()[-1]
                for M, N, K in shapes:
                    macs = M * N * K
                    insns, blocks = count(qemu, harness, ["matmul", M, N, K, enc], lo, hi, tmp)
                    qinsns, _ = count(qemu, harness, ["quant", M, N, K, enc], qlo, qlo + qn, tmp)
                    # The first (setup) call of the quantiser is in the count too: halve it.
                    qinsns_call = qinsns / 2
                    cycles = 0.0
                    covered = 0
                    # LLVM 19's scheduling models know no SME instructions: no prediction for sme2.
                    for pc, (n, words) in sorted(blocks.items(), key=lambda kv: -kv[1][0] * len(kv[1][1])):
                        if feat == "sme2" or n * len(words) < 0.005 * insns:
                            break
                        cycles += n * mca_cycles(words, a.mcpu, mattr)
                        covered += n * len(words)
                    for pc, (n, words) in sorted(blocks.items(), key=lambda kv: -kv[1][0] * len(kv[1][1]))[:a.top]:
                        data = " ".join(f"0x{w[6:8]} 0x{w[4:6]} 0x{w[2:4]} 0x{w[0:2]}" for w in words)
                        asm = run(["llvm-mc-19", "--disassemble", "-triple=aarch64", f"-mattr={mattr}"], input=data).stdout
                        print(f"block 0x{pc:x}: {n} x {len(words)} = {100 * n * len(words) / insns:.1f}%")
                        print("\n".join(l for l in asm.splitlines() if not l.lstrip().startswith(".")))
                    row = {"features": feat, "encoding": enc, "M": M, "N": N, "K": K, "kernel": kernel,
                           "matmul_insns": insns, "matmul_insns_per_mac": insns / macs,
                           "quant_insns": qinsns_call, "total_insns_per_mac": (insns + qinsns_call) / macs,
                           "mca_cycles_per_mac": cycles / (macs * covered / insns) if covered else None,
                           "mca_coverage": covered / insns if insns else 0.0, "check": [l for l in check.splitlines() if l.startswith("check")]}
                    result["rows"].append(row)
                    print(f"{feat:8s} {enc} M={M:<4d} N={N} K={K}: {row['matmul_insns_per_mac']:.4f} insns/MAC "
                          f"(+ quant {row['total_insns_per_mac']:.4f}), " +
                          (f"llvm-mca {a.mcpu} {row['mca_cycles_per_mac']:.4f} cycles/MAC over "
                           f"{100 * row['mca_coverage']:.0f}% of the instructions" if covered else "no llvm-mca model"),
                          flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
