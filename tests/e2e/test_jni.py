"""The JNI binding (runtime/bindings/jni: kiln_jni.c and kiln.KilnJni), the one an
Android app builds beside libkiln, run on the host's JVM against the host's libkiln.so:
tests/e2e/apps/jni/Demo.java answers a prompt (streamed pieces equal the answer, which
equals kiln-run's), stops from its listener, and gets a KilnException for a missing
model. Skipped without a JDK (javac, java, jni.h) or a shared libkiln."""

import glob
import os
import shutil
import sys

import pytest

from conftest import MODELS, ROOT, bin_dir, run, tool

JNI = os.path.join(ROOT, "runtime", "bindings", "jni")


def _jdk_include():
    javac = shutil.which("javac")
    if javac is None or shutil.which("java") is None:
        return None
    home = os.path.dirname(os.path.dirname(os.path.realpath(javac)))
    inc = os.path.join(home, "include")
    if os.path.exists(os.path.join(inc, "jni.h")):
        return inc
    found = sorted(glob.glob("/usr/lib/jvm/*/include/jni.h"))
    return os.path.dirname(found[0]) if found else None


def test_jni_binding_answers(tmp_path):
    inc = _jdk_include()
    if inc is None:
        pytest.skip("no JDK (javac, java and jni.h)")
    lib_dir = os.path.join(os.path.dirname(os.path.abspath(bin_dir())), "runtime")
    if not os.path.exists(os.path.join(lib_dir, "libkiln.so")):
        pytest.skip(f"no shared libkiln in {lib_dir} (KILN_BUILD_SHARED)")
    run([sys.executable, os.path.join(MODELS, "generate.py"), "--preset", "tiny-llama", "--out", tmp_path / "ckpt"])
    model = tmp_path / "model.kiln"
    run([tool("kiln-compile"), tmp_path / "ckpt", "-o", model])
    cc = shutil.which("clang-19") or shutil.which("cc")
    run([cc, "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o", tmp_path / "libkiln_jni.so",
         os.path.join(JNI, "kiln_jni.c"), f"-I{inc}", f"-I{os.path.join(inc, 'linux')}",
         f"-I{os.path.join(ROOT, 'runtime', 'include')}", f"-L{lib_dir}", "-lkiln", f"-Wl,-rpath,{lib_dir}"])
    classes = tmp_path / "classes"
    run(["javac", "-d", classes, os.path.join(JNI, "java", "kiln", "KilnJni.java"),
         os.path.join(ROOT, "tests", "e2e", "apps", "jni", "Demo.java")])
    out = run(["java", f"-Djava.library.path={tmp_path}", "-cp", classes, "Demo", model, "Hello", "8"]).stdout
    lines = out.splitlines()
    assert lines[0].startswith("kiln 0."), out
    answer = next(line for line in lines if line.startswith("answer: ["))[len("answer: ["):-1]
    reference = run([tool("kiln-run"), model, "--prompt", "Hello", "--max-new-tokens", "8"]).stdout
    assert answer == reference.rstrip("\n"), (answer, reference)
    assert "streamed equals answer: true" in lines, out
    stopped = next(line for line in lines if line.startswith("stopped: ["))[len("stopped: ["):-1]
    assert stopped and answer.startswith(stopped) and len(stopped) < len(answer), (stopped, answer)
    err = next(line for line in lines if line.startswith("error "))
    assert ".missing" in err and "loading the model" in err, err
    assert not any(line == "no exception" for line in lines)
