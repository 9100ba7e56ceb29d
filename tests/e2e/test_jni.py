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


@pytest.fixture(scope="module")
def binding(tmp_path_factory):
    """The binding's native library and classes (Demo, ImageDemo), built once."""
    inc = _jdk_include()
    if inc is None:
        pytest.skip("no JDK (javac, java and jni.h)")
    lib_dir = os.path.join(os.path.dirname(os.path.abspath(bin_dir())), "runtime")
    if not os.path.exists(os.path.join(lib_dir, "libkiln.so")):
        pytest.skip(f"no shared libkiln in {lib_dir} (KILN_BUILD_SHARED)")
    d = tmp_path_factory.mktemp("jni")
    cc = shutil.which("clang-19") or shutil.which("cc")
    run([cc, "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o", d / "libkiln_jni.so",
         os.path.join(JNI, "kiln_jni.c"), f"-I{inc}", f"-I{os.path.join(inc, 'linux')}",
         f"-I{os.path.join(ROOT, 'runtime', 'include')}", f"-L{lib_dir}", "-lkiln", f"-Wl,-rpath,{lib_dir}"])
    apps = os.path.join(ROOT, "tests", "e2e", "apps", "jni")
    run(["javac", "-d", d / "classes", os.path.join(JNI, "java", "kiln", "KilnJni.java"),
         os.path.join(apps, "Demo.java"), os.path.join(apps, "ImageDemo.java")])
    return lambda *args: run(["java", f"-Djava.library.path={d}", "-cp", d / "classes", *map(str, args)]).stdout


def _compiled(tmp_path, preset):
    run([sys.executable, os.path.join(MODELS, "generate.py"), "--preset", preset, "--out", tmp_path / "ckpt"])
    model = tmp_path / "model.kiln"
    run([tool("kiln-compile"), tmp_path / "ckpt", "-o", model])
    return model


def test_jni_binding_answers(binding, tmp_path):
    model = _compiled(tmp_path, "tiny-llama")
    out = binding("Demo", model, "Hello", "8")
    lines = out.splitlines()
    assert lines[0].startswith("kiln 0."), out
    answer = next(line for line in lines if line.startswith("answer: ["))[len("answer: ["):-1]
    reference = run([tool("kiln-run"), model, "--prompt", "Hello", "--max-new-tokens", "8"]).stdout
    assert answer == reference.rstrip("\n"), (answer, reference)
    assert "streamed equals answer: true" in lines, out
    assert "chat equals answer: true" in lines, out
    chat_err = next(line for line in lines if line.startswith("chat error "))
    assert "no chat template" in chat_err, chat_err
    stopped = next(line for line in lines if line.startswith("stopped: ["))[len("stopped: ["):-1]
    assert stopped and answer.startswith(stopped) and len(stopped) < len(answer), (stopped, answer)
    err = next(line for line in lines if line.startswith("error "))
    assert ".missing" in err and "loading the model" in err, err
    assert not any(line == "no exception" for line in lines)


def test_jni_image_from_argb_pixels(binding, tmp_path):
    """ARGB_8888 ints (an Android Bitmap's getPixels) give the answer kiln-run gives for
    the same pixels as a PNG; a short pixel array is an error, not a crash."""
    import numpy as np
    from PIL import Image
    model = _compiled(tmp_path, "tiny-llava")
    y, x = np.mgrid[0:30, 0:40]
    rgb = np.stack([(7 * x + 3 * y) % 256, (5 * x * y) % 256, (x ^ y) * 9 % 256], axis=-1).astype(np.uint8)
    Image.fromarray(rgb).save(tmp_path / "pixels.png")
    out = binding("ImageDemo", model, "What is this?", "6")
    lines = out.splitlines()
    answer = next(line for line in lines if line.startswith("answer: ["))[len("answer: ["):-1]
    reference = run([tool("kiln-run"), model, "--image", tmp_path / "pixels.png", "--prompt", "What is this?",
                     "--max-new-tokens", "6", "--threads", "2"]).stdout
    assert answer == reference.rstrip("\n"), (answer, reference)
    chat = next(line for line in lines if line.startswith("chat: ["))[len("chat: ["):-1]
    reference = run([tool("kiln-run"), model, "--image", tmp_path / "pixels.png", "--system", "Be brief.", "--prompt",
                     "What is this?", "--max-new-tokens", "6", "--threads", "2"]).stdout
    assert chat == reference.rstrip("\n"), (chat, reference)
    err = next(line for line in lines if line.startswith("error "))
    assert "fewer than width x height" in err, err
