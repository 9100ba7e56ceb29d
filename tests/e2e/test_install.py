"""Installing the runtime (issue 19, item 8): `cmake --install` into a clean prefix, then
a tiny C app (tests/install/app) built against it with find_package(Kiln) (static and
shared), with pkg-config, and with add_subdirectory of the source tree (which builds the
runtime only); each build answers a prompt with a compiled tiny model."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import MODELS, ROOT, bin_dir, run, tool

APP = os.path.join(ROOT, "tests", "install", "app")


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    build = os.path.dirname(os.path.abspath(bin_dir()))
    if not os.path.exists(os.path.join(build, "cmake_install.cmake")):
        pytest.skip(f"{build} is not a CMake build directory")
    out = tmp_path_factory.mktemp("install") / "prefix"
    run(["cmake", "--install", build, "--prefix", str(out)])
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("install-model")
    run([sys.executable, os.path.join(MODELS, "generate.py"), "--preset", "tiny-llama", "--out", str(d / "ckpt")])
    run([tool("kiln-compile"), str(d / "ckpt"), "-o", str(d / "model.kiln")])
    return d / "model.kiln"


def answers(app, model, env=None):
    p = run([str(app), str(model), "Hello"], env=env)
    assert p.stdout.startswith("kiln 0."), p.stdout
    assert "model LlamaForCausalLM, 2 layers" in p.stdout
    assert "generated " in p.stdout and "time to first token" in p.stdout, p.stdout


def test_prefix_layout(prefix):
    for f in ("include/kiln/kiln.h", "lib/libkiln.a", "lib/libkiln.so", "lib/cmake/Kiln/KilnConfig.cmake",
              "lib/cmake/Kiln/KilnConfigVersion.cmake", "lib/cmake/Kiln/KilnTargets.cmake", "lib/pkgconfig/kiln.pc",
              "bin/kiln-run", "bin/kiln-inspect", "bin/kiln-bench", "share/kiln/jni/kiln_jni.c",
              "share/kiln/jni/java/kiln/KilnJni.java"):
        assert (prefix / f).exists(), f
    # The shared library exports the C API and nothing else (no C++ or FlatBuffers symbols).
    nm = run(["nm", "-D", "--defined-only", str(prefix / "lib" / "libkiln.so")]).stdout.split("\n")
    names = [line.split()[-1] for line in nm if line.strip()]
    assert names and all(n.startswith("kiln_") for n in names), [n for n in names if not n.startswith("kiln_")]


@pytest.mark.parametrize("shared", [False, True])
def test_find_package(prefix, model, tmp_path, shared):
    build = tmp_path / "build"
    run(["cmake", "-G", "Ninja", "-S", APP, "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}",
         "-DCMAKE_C_COMPILER=clang-19", f"-DAPP_SHARED={'ON' if shared else 'OFF'}"])
    run(["cmake", "--build", str(build)])
    app = build / "app"
    linked = run(["ldd", str(app)]).stdout
    assert ("libkiln.so" in linked) == shared, linked
    answers(app, model)


def test_pkg_config(prefix, model, tmp_path):
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    flags = run(["pkg-config", "--cflags", "--libs", "kiln"], env=env).stdout.split()
    app = tmp_path / "app"
    run(["clang-19", os.path.join(APP, "app.c"), *flags, "-o", str(app)])
    answers(app, model, env=dict(os.environ, LD_LIBRARY_PATH=str(prefix / "lib")))
    # Static: libkiln.a and what it needs (Libs.private).
    static = run(["pkg-config", "--static", "--cflags", "--libs", "kiln"], env=env).stdout.split()
    static = ["-Wl,-Bstatic" if f == "-lkiln" else f for f in static]
    static.insert(static.index("-Wl,-Bstatic") + 1, "-lkiln")
    static.insert(static.index("-lkiln") + 1, "-Wl,-Bdynamic")
    app_static = tmp_path / "app-static"
    run(["clang-19", os.path.join(APP, "app.c"), *static, "-o", str(app_static)])
    assert "libkiln.so" not in run(["ldd", str(app_static)]).stdout
    answers(app_static, model)


def test_add_subdirectory_builds_the_runtime_only(model, tmp_path):
    build = tmp_path / "build"
    p = run(["cmake", "-G", "Ninja", "-S", APP, "-B", str(build), f"-DKILN_SOURCE={ROOT}",
             "-DCMAKE_C_COMPILER=clang-19", "-DCMAKE_CXX_COMPILER=clang++-19"])
    assert "compiler=OFF tests=OFF" in p.stdout, p.stdout
    run(["cmake", "--build", str(build)])
    built = {f for _, _, files in os.walk(build) for f in files}
    assert "kiln-compile" not in built and "kiln-run" not in built and "libkiln.so" not in built
    answers(build / "app", model)


def test_integration_doc_example_builds_and_answers(prefix, tmp_path):
    """docs/integration.md's C example, as written, linked with the install's
    pkg-config flags, answers about an image with a tiny LLaVA-layout model."""
    text = open(os.path.join(ROOT, "docs", "integration.md")).read()
    example = text.split("```c\n", 1)[1].split("```", 1)[0]
    src = tmp_path / "example.c"
    src.write_text(example + """
int main(int argc, char** argv) {
  static uint8_t rgb[48 * 32 * 3];
  for (size_t i = 0; i < sizeof rgb; ++i) rgb[i] = (uint8_t)(i * 7);
  return answer(argv[1], rgb, 48, 32);
}
""")
    ckpt = tmp_path / "llava"
    run([sys.executable, os.path.join(MODELS, "generate.py"), "--preset", "tiny-llava", "--out", str(ckpt)])
    model = tmp_path / "llava.kiln"
    run([tool("kiln-compile"), str(ckpt), "-o", str(model)])
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    flags = run(["pkg-config", "--cflags", "--libs", "kiln"], env=env).stdout.split()
    app = tmp_path / "example"
    run(["clang-19", "-std=c11", "-Wall", "-Werror", "-Wno-unused-parameter", str(src), *flags, "-o", str(app)])
    p = run([str(app), str(model)], env=dict(os.environ, LD_LIBRARY_PATH=str(prefix / "lib")))
    assert p.stdout.strip(), "no answer streamed"
