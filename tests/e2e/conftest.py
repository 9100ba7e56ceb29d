"""End-to-end tests: checkpoints are generated, compiled with kiln-compile, run with
kiln-run, and compared with the PyTorch references of tests/models.

The binaries come from $KILN_BIN_DIR (default: build/host/bin of this checkout)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "models")
if MODELS not in sys.path:
    sys.path.insert(0, MODELS)

import torch  # noqa: E402

torch.set_num_threads(1)


def bin_dir() -> str:
    return os.environ.get("KILN_BIN_DIR", os.path.join(ROOT, "build", "host", "bin"))


def tool(name: str) -> str:
    path = os.path.join(bin_dir(), name)
    if not os.path.exists(path):
        pytest.skip(f"{path} not built (set KILN_BIN_DIR)")
    return path


def libkiln():
    """The host's libkiln.so through ctypes, kiln_model_load and kiln_model_release
    declared (skips when the shared library was not built)."""
    import ctypes
    path = os.path.join(os.path.dirname(os.path.abspath(bin_dir())), "runtime", "libkiln.so")
    if not os.path.exists(path):
        pytest.skip(f"{path} not built (KILN_BUILD_SHARED)")
    so = ctypes.CDLL(path)
    so.kiln_model_load.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    so.kiln_model_release.argtypes = [ctypes.c_void_p]
    return so


def run(cmd, **kw) -> subprocess.CompletedProcess:
    """Runs a command, failing the test with its output when it exits non-zero."""
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", **kw)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {p.returncode}\n"
                             f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e")


def calibrated_tiny_llava(root):
    """A generated tiny-llava checkpoint in root/tiny-llava with a calibration.jsonl of four
    random images beside it (kiln-compile finds it without --calibration), for budgets and
    tiers, which measure the model."""
    import json
    import numpy as np
    from PIL import Image
    d = root / "tiny-llava"
    run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", "tiny-llava", "--out", d])
    rng = np.random.default_rng(5)
    lines = []
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).resize((40, 40)).save(d / f"calib{i}.png")
        lines.append(json.dumps({"image": f"calib{i}.png", "prompt": "What is in the picture?", "answer": "a part"}))
    (d / "calibration.jsonl").write_text("\n".join(lines) + "\n")
    return d
