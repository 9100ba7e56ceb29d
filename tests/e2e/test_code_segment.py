"""The code segment: kernels generated for the artifact's target (codegen/generators),
carried in the artifact as one relocatable ELF object, checksummed, loaded by the
runtime's own loader (runtime/src/code). An artifact for the host runs its generated
kernels and matches the portable artifact; a damaged code segment is refused with a
clear error, never run; an artifact for another CPU is refused by kiln-run and still
inspectable.
"""

import json
import shutil
import os
import platform
import struct
import subprocess

import numpy as np
import pytest

from conftest import MODELS, ROOT, run, tool


@pytest.fixture(scope="module")
def llama(tiny_dir):
    ckpt = tiny_dir / "cs-tiny-llama"
    if not ckpt.exists():
        run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", "tiny-llama", "--out", ckpt])
    host = tiny_dir / "cs-host.kiln"
    run([tool("kiln-compile"), ckpt, "-o", host, "--kv-cache=f32"])
    ids = tiny_dir / "cs-ids.npy"
    np.save(ids, np.array([1, 17, 42, 99, 7, 300, 12, 5], dtype=np.int32))
    return ckpt, host, ids


def _inspect(artifact):
    return json.loads(run([tool("kiln-inspect"), artifact, "--json", "--ops"]).stdout)


def _kiln_run(artifact, ids, *extra):
    return subprocess.run([tool("kiln-run"), artifact, "--input-ids", ids, "--max-new-tokens", "4", *extra],
                          capture_output=True, text=True, errors="replace")


def test_generated_kernels_are_bound_and_match_portable(llama, tiny_dir):
    ckpt, host, ids = llama
    info = _inspect(host)
    code = info["code"]
    assert code["bytes"] > 0 and code["offset"] % 64 == 0 and code["symbols"]
    ops = [op for st in info["stages"] for op in st["op_list"]]
    # RoPE runs in the q|k|v product's epilogue (kiln-fuse-qkv, kiln-fuse-rope): its
    # generated function is one of that linear's further symbols; the fused attention
    # only attends.
    attentions = [op for op in ops if op["kind"] == "QkvAttention"]
    assert attentions and all(op["isa"] == "generated" and not op["portable"] for op in attentions)
    qkv = [op for op in ops if op["kind"] == "Linear" and op["name"].endswith("qkv_proj")]
    assert len(qkv) == len(attentions)
    assert all(any(s.startswith("kiln_uk_rope_") for s in op.get("symbols", [])) for op in qkv)
    assert not any(s.startswith("kiln_uk_rope_") for op in attentions for s in op.get("symbols", []))
    # Every op bound to a generated kernel names functions of the code segment, and
    # every function serves an op.
    generated = [op for op in ops if op["isa"] == "generated"]
    named = {op["symbol"] for op in generated} | {s for op in generated for s in op.get("symbols", [])}
    assert named == set(code["symbols"])
    assert any(op["kind"] == "Embedding" for op in generated)

    portable = tiny_dir / "cs-portable.kiln"
    run([tool("kiln-compile"), ckpt, "-o", portable, "--target=portable", "--kv-cache=f32"])
    assert "code" not in _inspect(portable)
    got, want = tiny_dir / "cs-host.npy", tiny_dir / "cs-portable.npy"
    a = run([tool("kiln-run"), host, "--input-ids", ids, "--max-new-tokens", "4", "--dump-logits", got]).stdout
    b = run([tool("kiln-run"), portable, "--input-ids", ids, "--max-new-tokens", "4", "--dump-logits", want]).stdout
    g, w = np.load(got), np.load(want)
    assert float(np.abs(g - w).max()) <= 1e-4 * float(np.abs(w).max())
    assert a == b


def _patched(src, dst, patch):
    data = bytearray(src.read_bytes())
    patch(data)
    dst.write_bytes(bytes(data))
    return dst


def test_corrupt_code_bytes_fail_the_checksum(llama, tiny_dir):
    _, host, ids = llama
    code = _inspect(host)["code"]

    def flip(data):
        data[code["offset"] + code["bytes"] // 2] ^= 0x10

    bad = _patched(host, tiny_dir / "cs-flip.kiln", flip)
    p = _kiln_run(bad, ids)
    assert p.returncode != 0 and "checksum mismatch" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and "Segmentation" not in p.stderr


def test_corrupt_elf_with_a_valid_checksum_is_refused(llama, tiny_dir):
    """The checksum guards against accidents; the loader itself refuses a bad object."""
    _, host, ids = llama
    code = _inspect(host)["code"]
    old = struct.pack("<Q", int(code["checksum"], 16))

    def bad_section_table(data):
        start = code["offset"]
        # e_shoff (offset 0x28 of the ELF header) far past the object.
        data[start + 0x28:start + 0x30] = struct.pack("<Q", 1 << 40)
        obj = bytes(data[start:start + code["bytes"]])
        h = 0xCBF29CE484222325
        for byte in obj:
            h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        at = bytes(data[:code["offset"]]).find(old)
        assert at > 0, "checksum not found in the header"
        data[at:at + 8] = struct.pack("<Q", h)

    bad = _patched(host, tiny_dir / "cs-elf.kiln", bad_section_table)
    p = _kiln_run(bad, ids)
    assert p.returncode != 0, p.stdout
    assert "section header" in p.stderr and "unloadable code segment" in p.stderr, p.stderr


def test_truncated_code_segment_is_refused(llama, tiny_dir):
    _, host, ids = llama
    code = _inspect(host)["code"]
    bad = tiny_dir / "cs-trunc.kiln"
    bad.write_bytes(host.read_bytes()[:code["offset"] + code["bytes"] // 3])
    p = _kiln_run(bad, ids)
    assert p.returncode != 0 and "runs past the end" in p.stderr, p.stderr


def test_artifact_for_another_cpu(llama, tiny_dir):
    ckpt, _, ids = llama
    other = "aarch64-linux-android" if platform.machine() in ("x86_64", "AMD64") else "x86_64-linux-gnu"
    art = tiny_dir / "cs-other.kiln"
    run([tool("kiln-compile"), ckpt, "-o", art, f"--target={other}"])
    p = _kiln_run(art, ids)
    assert p.returncode != 0 and ("this CPU lacks" in p.stderr or "the code segment is for" in p.stderr), p.stderr
    info = _inspect(art)
    assert info["runs_here"] is False and info["code"]["triple"] == other


def _cc():
    for cc in ("clang-19", "clang", "cc"):
        path = shutil.which(cc)
        if path:
            return path
    pytest.skip("no C compiler")


def test_static_library_kernels(llama, tiny_dir):
    """kiln-compile --emit=static-library: the artifact names its kernels by hash and
    carries no code; an app links model.kernels.a and passes its table at load."""
    ckpt, _, _ = llama
    out = tiny_dir / "static"
    out.mkdir(exist_ok=True)
    art = out / "model.kiln"
    run([tool("kiln-compile"), ckpt, "-o", art, "--emit=static-library", "--kv-cache=f32"])  # as cs-host.kiln
    assert (out / "model.kernels.a").exists() and (out / "model.kernels.h").exists()
    info = _inspect(art)
    assert info["code"]["library"] is True and info["runs_here"] is False
    # The in-file artifact of the same compile has the same kernels (same hash).
    infile = tiny_dir / "cs-host.kiln"
    assert _inspect(infile)["code"]["checksum"] == info["code"]["checksum"]

    lib = os.path.join(os.path.dirname(tool("kiln-run")), "..", "runtime", "libkiln.a")
    if not os.path.exists(lib):
        pytest.skip(f"{lib} not built")
    app = out / "app"
    run([_cc(), os.path.join(ROOT, "tests", "e2e", "apps", "static_kernels_app.c"), "-o", app,
         "-I", os.path.join(ROOT, "runtime", "include"), "-I", out, out / "model.kernels.a", lib,
         "-lstdc++", "-lpthread", "-lm"])
    ids = ["1", "17", "42", "99", "7"]
    got = run([app, art, *ids]).stdout.split()
    want = run([tool("kiln-run"), infile, "--input-ids", ",".join(ids), "--max-new-tokens", "6"]).stdout
    line = next(x for x in want.splitlines() if x.startswith("tokens:"))
    assert got == line.split()[1:]

    # Without the library, or with another artifact's: refused, naming the problem.
    p = subprocess.run([app, art, "--none", *ids], capture_output=True, text=True)
    assert p.returncode != 0 and "static library" in p.stderr, p.stderr
    other = out / "other.kiln"
    run([tool("kiln-compile"), ckpt, "-o", other, "--emit=static-library",
         "--target=x86_64-linux-gnu" if platform.machine() in ("x86_64", "AMD64") else "--target=aarch64-linux-gnu"])
    p = subprocess.run([app, other, *ids], capture_output=True, text=True)
    assert p.returncode != 0 and "built for another artifact" in p.stderr, p.stderr
