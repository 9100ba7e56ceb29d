"""Issue 12 hardening: what kiln-compile writes (and refuses to write), and kiln-run's
argument checks. Tiny checkpoints only: every test takes well under a second or two."""

import json
import os
import re
import resource
import signal
import stat
import struct
import subprocess
import sys
import time

import pytest

from conftest import MODELS, run, tool


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("hardening") / "tiny-llama"
    run([sys.executable, os.path.join(MODELS, "generate.py"), "--preset", "tiny-llama", "--out", str(d)])
    return d


@pytest.fixture(scope="module")
def artifact(ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("hardening-artifact") / "model.kiln"
    run([tool("kiln-compile"), str(ckpt), "-o", str(out)])
    return out


def compile_(ckpt, out, *extra):
    return subprocess.run([tool("kiln-compile"), str(ckpt), "-o", str(out), *extra],
                          capture_output=True, text=True, timeout=120)


def litter(d):
    return sorted(n for n in os.listdir(d) if ".tmp-" in n)


# ---- defect 10: -o onto something that is not a regular file ----------------------

def test_output_fifo_is_refused(ckpt, tmp_path):
    out = tmp_path / "fifo.kiln"
    os.mkfifo(out)
    p = compile_(ckpt, out)
    assert p.returncode == 1, p.stderr
    assert "exists and is not a regular file" in p.stderr
    assert stat.S_ISFIFO(os.lstat(out).st_mode)


def test_output_symlink_is_refused(ckpt, tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me")
    out = tmp_path / "link.kiln"
    os.symlink(target, out)
    p = compile_(ckpt, out)
    assert p.returncode == 1, p.stderr
    assert "exists and is not a regular file" in p.stderr
    assert os.path.islink(out) and target.read_text() == "keep me"


def test_output_device_is_refused(ckpt, tmp_path):
    out = tmp_path / "null.kiln"
    try:
        os.mknod(out, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a private /dev/null
    except PermissionError:
        pytest.skip("creating a device node needs root")
    p = compile_(ckpt, out)
    assert p.returncode == 1, p.stderr
    assert stat.S_ISCHR(os.lstat(out).st_mode)
    assert not litter(tmp_path)


# ---- defect 11: temporary files and outputs checked before writing ----------------

def test_unwritable_report_writes_no_artifact(ckpt, tmp_path):
    out = tmp_path / "model.kiln"
    p = compile_(ckpt, out, "--report", str(tmp_path / "no-such-dir" / "report.json"))
    assert p.returncode == 1
    assert "--report" in p.stderr and "does not exist" in p.stderr
    assert not out.exists()
    assert not litter(tmp_path)


def test_stale_temp_files_are_removed(ckpt, tmp_path):
    out = tmp_path / "model.kiln"
    stale = tmp_path / "model.kiln.tmp-a1b2c3d4"
    stale.write_bytes(b"\0" * 4096)  # what a SIGKILL-ed writer of the old naming left
    other = tmp_path / "other.kiln.tmp-a1b2c3d4"  # not this output's: left alone
    other.write_bytes(b"x")
    run([tool("kiln-compile"), str(ckpt), "-o", str(out)])
    assert out.exists() and not stale.exists() and other.exists()


def test_live_temp_file_is_kept(ckpt, tmp_path):
    """A temporary file another kiln-compile still writes (it holds a lock) stays."""
    import fcntl
    out = tmp_path / "model.kiln"
    live = tmp_path / "model.kiln.tmp-e5f6a7b8"
    with open(live, "wb") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        run([tool("kiln-compile"), str(ckpt), "-o", str(out)])
        assert live.exists()


def test_sigkill_leaves_no_temp_file(ckpt, tmp_path):
    """kiln-compile is SIGKILL-ed the moment a temporary file shows up beside the
    output (or at a few points of its run): whatever it leaves, the next run to the
    same output leaves no temporary file behind. (On Linux none shows up at all: the
    artifact is an anonymous O_TMPFILE until it takes its name.)"""
    out = tmp_path / "model.kiln"
    for delay in (None, 0.02, 0.05, 0.1):
        p = subprocess.Popen([tool("kiln-compile"), str(ckpt), "-o", str(out)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        start = time.monotonic()
        while p.poll() is None:
            if (delay is None and litter(tmp_path)) or (delay is not None and time.monotonic() - start >= delay):
                p.send_signal(signal.SIGKILL)
                break
        p.wait()
    run([tool("kiln-compile"), str(ckpt), "-o", str(out)])
    assert not litter(tmp_path)


# ---- defect 7: a cross-compiled artifact is still verified and written ------------

def test_cross_compile_is_written(ckpt, tmp_path):
    out = tmp_path / "arm.kiln"
    p = compile_(ckpt, out, "--target=aarch64-linux-android", "--cpu-features=+dotprod,+i8mm")
    assert p.returncode == 0, p.stderr
    assert out.exists()


# ---- defect 8: argmax over NaN logits ---------------------------------------------

def test_nan_logits_are_not_token_zero(artifact, tmp_path):
    """An artifact whose final norm is NaN (patched after compiling: kiln-compile
    refuses NaN weights) makes every logit NaN; greedy decoding must not answer
    token 0 over and over."""
    info = json.loads(run([tool("kiln-inspect"), str(artifact), "--json"]).stdout)
    entry = next(e for e in info["precision"] if e["tensor"] == "model.norm.weight")
    assert entry["encoding"] == "f32"
    bad = tmp_path / "nan.kiln"
    data = bytearray(artifact.read_bytes())
    off = entry["offset"]
    data[off:off + entry["bytes"]] = struct.pack("<f", float("nan")) * (entry["bytes"] // 4)
    bad.write_bytes(bytes(data))
    for n in ("1", "4"):
        p = subprocess.run([tool("kiln-run"), str(bad), "--input-ids", "1,2,3", "--max-new-tokens", n],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode != 0, p.stdout
        assert "every logit of the first token is NaN" in p.stderr, p.stderr


# ---- defect 12: kiln-run arguments ------------------------------------------------

def kiln_run(artifact, *args, **kw):
    return subprocess.run([tool("kiln-run"), str(artifact), *args], capture_output=True, text=True,
                          timeout=60, **kw)


def test_empty_prompt_is_a_prompt(artifact):
    p = kiln_run(artifact, "--prompt", "", "--max-new-tokens", "2")
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("args,message", [
    (["--context", "-5"], "--context must be a positive number of tokens, got -5"),
    (["--context", "0"], "--context must be a positive number of tokens, got 0"),
    (["--max-new-tokens", "-3"], "--max-new-tokens must be positive, got -3"),
    (["--temperature", "-1"], "--temperature must be finite and >= 0 (0 = greedy), got -1"),
    (["--temperature", "inf"], "--temperature must be finite and >= 0"),
    (["--top-p", "7"], "--top-p must be in (0, 1] (1 = off), got 7"),
    (["--top-p", "0"], "--top-p must be in (0, 1] (1 = off), got 0"),
    (["--top-k", "-2"], "--top-k must be >= 0 (0 = off), got -2"),
    (["--threads", "-1"], "--threads must be >= 1 (or 0 for the default), got -1"),
])
def test_bad_numbers_are_rejected(artifact, args, message):
    p = kiln_run(artifact, "--prompt", "hi", *args)
    assert p.returncode == 2
    assert message in p.stderr


def test_huge_max_new_tokens_is_capped(artifact):
    """2^31-1 new tokens used to reserve 8 GB up front: capped at the context."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    p = kiln_run(artifact, "--prompt", "hi", "--context", "64", "--max-new-tokens", "2147483647",
                 preexec_fn=limit)
    # Random weights never say EOS: generation runs until the context is full, which
    # is the error it ends with (as for any --max-new-tokens beyond the room left).
    assert "out of memory" not in p.stderr
    assert p.returncode == 0 or "context is full" in p.stderr, p.stderr


# ---- every tool's --version ---------------------------------------------------------

@pytest.mark.parametrize("name", ["kiln-compile", "kiln-run", "kiln-inspect", "kiln-opt"])
def test_version_names_the_tool_and_kiln(name):
    """--version prints the tool's name and Kiln's version (kiln-compile printed LLVM's;
    kiln-run and kiln-inspect failed with "model is required")."""
    p = subprocess.run([tool(name), "--version"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    first = p.stdout.strip().splitlines()[0]
    assert re.match(rf"{name} \d+\.\d+\.\d+", first), p.stdout


# ---- kiln-compile options checked before any work -------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--memory-budget=3XB"], "--memory-budget '3XB' is not a size"),
    (["--bits-per-weight=-2"], "--bits-per-weight must be positive"),
])
def test_bad_budget_is_rejected_before_any_work(ckpt, tmp_path, args, message):
    """A budget that is not a size used to be found out after calibration (minutes)."""
    out = tmp_path / "model.kiln"
    t0 = time.monotonic()
    p = compile_(ckpt, out, *args)
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert time.monotonic() - t0 < 10
    assert not out.exists() and litter(tmp_path) == []


def test_precision_override_matching_no_weight_warns(ckpt, tmp_path):
    """Overrides match whole names: 'mlp=...' decides nothing, and says so; one shadowed by
    an earlier match too. The artifact is still written (a warning, not an error)."""
    out = tmp_path / "model.kiln"
    p = compile_(ckpt, out, "--precision=mlp=int4_g32", "--precision=.*=int8", "--precision=.*q_proj.*=int4_g32")
    assert p.returncode == 0, p.stderr
    assert "--precision 'mlp=int4_g32' matches no weight" in p.stderr
    assert "--precision '.*q_proj.*=int4_g32' matches no weight" in p.stderr
    assert "--precision '.*=int8' matches no weight" not in p.stderr
    assert out.exists()


def test_text_emits_go_to_the_output_file(ckpt, tmp_path):
    """--emit=ir and the kernels' text go to -o when given (they were printed to stdout and
    -o was ignored); without -o to stdout; a failed compile leaves no file."""
    for emit, marker in (("ir", "kiln.weight @"), ("kernels-asm", ".text")):
        out = tmp_path / f"out.{emit}"
        p = subprocess.run([tool("kiln-compile"), str(ckpt), f"--emit={emit}", "-o", str(out)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert p.stdout == ""
        assert marker in out.read_text()
    p = subprocess.run([tool("kiln-compile"), str(ckpt), "--emit=ir"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "kiln.weight @" in p.stdout
    missing = tmp_path / "missing.mlir"
    p = subprocess.run([tool("kiln-compile"), str(tmp_path / "no-such-checkpoint"), "--emit=ir", "-o", str(missing)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and not missing.exists()


def test_compile_input_may_be_a_file(ckpt, tmp_path):
    """A checkpoint's config.json stands for its directory and a lowered .mlir module is
    --from-ir's input (it used to say "checkpoint directory ... does not exist"); any other
    file is named as a file."""
    by_dir, by_config = tmp_path / "dir.kiln", tmp_path / "config.kiln"
    run([tool("kiln-compile"), str(ckpt), "-o", str(by_dir)])
    run([tool("kiln-compile"), str(ckpt / "config.json"), "-o", str(by_config)])
    assert by_dir.read_bytes() == by_config.read_bytes()
    planned = tmp_path / "planned.mlir"
    run([tool("kiln-compile"), str(ckpt), "--emit=planned-ir", "--mlir-print-debuginfo", "-o", str(planned)])
    by_ir, by_flag = tmp_path / "ir.kiln", tmp_path / "flag.kiln"
    run([tool("kiln-compile"), str(planned), "-o", str(by_ir)])
    run([tool("kiln-compile"), "--from-ir", str(planned), "-o", str(by_flag)])
    assert by_ir.read_bytes() == by_flag.read_bytes()
    p = subprocess.run([tool("kiln-compile"), str(ckpt / "tokenizer.json"), "-o", str(tmp_path / "x.kiln")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "is a file, not a checkpoint directory" in p.stderr, p.stderr
    assert not (tmp_path / "x.kiln").exists()


@pytest.mark.parametrize("name,args,suggestion", [
    ("kiln-run", ["--promt", "hi"], "did you mean --prompt (not --promt)?"),
    ("kiln-run", ["--prompt", "hi", "--max-new-token", "3"], "did you mean --max-new-tokens"),
    ("kiln-inspect", ["--jsn"], "did you mean --json (not --jsn)?"),
    ("kiln-run", ["--prompt", "hi", "--max-new-tokens", "abc"], None),
])
def test_usage_errors_exit_2_with_a_suggestion(artifact, name, args, suggestion):
    """Usage errors exit 2 (CLI11's own codes 105-109 leaked out) and an unknown option
    names the nearest known one."""
    p = subprocess.run([tool(name), str(artifact), *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert f"{name}: error:" in p.stderr
    if suggestion:
        assert suggestion in p.stderr, p.stderr


@pytest.mark.parametrize("name", ["kiln-run", "kiln-inspect"])
def test_missing_model_is_a_usage_error(name):
    p = subprocess.run([tool(name)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "model is required" in p.stderr, (p.returncode, p.stderr)


def test_compile_usage_error_exits_2(ckpt, tmp_path):
    p = compile_(ckpt, tmp_path / "model.kiln", "--precison=.*=int8")
    assert p.returncode == 2 and "Did you mean '--precision" in p.stderr, (p.returncode, p.stderr)
