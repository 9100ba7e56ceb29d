# Shared by scripts/test and scripts/demo: configure and build Kiln with Ninja.
# Source it; it defines kiln_build_host, kiln_build_aarch64 and kiln_build_asan.

KILN_ROOT=${KILN_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
KILN_BUILD_ROOT=${KILN_BUILD_ROOT:-$KILN_ROOT/build}
KILN_PYTHON=${KILN_PYTHON:-/usr/bin/python3}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}

# kiln_configure DIR [cmake args...]: (re)configure; cheap when nothing changed.
kiln_configure() {
  local dir=$1; shift
  cmake -G Ninja -S "$KILN_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=Release \
    -DPython3_EXECUTABLE="$KILN_PYTHON" "$@" > "$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; return 1; }
}

# The full build: compiler, tools, runtime, tests.
kiln_build_host() {
  mkdir -p "$KILN_BUILD_ROOT"
  kiln_configure "$KILN_BUILD_ROOT/host" \
    -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19
  cmake --build "$KILN_BUILD_ROOT/host"
}

# The runtime for 64-bit Arm, its tests run under qemu-aarch64; test artifacts come
# from the host build.
kiln_build_aarch64() {
  mkdir -p "$KILN_BUILD_ROOT"
  kiln_configure "$KILN_BUILD_ROOT/aarch64" -DKILN_BUILD_COMPILER=OFF \
    -DCMAKE_TOOLCHAIN_FILE="$KILN_ROOT/cmake/toolchains/aarch64-linux-clang.cmake" \
    -DKILN_TEST_ARTIFACTS_DIR="$KILN_BUILD_ROOT/host/tests/unit/artifacts"
  cmake --build "$KILN_BUILD_ROOT/aarch64"
}

# The runtime and its tests with AddressSanitizer and UndefinedBehaviorSanitizer.
kiln_build_asan() {
  mkdir -p "$KILN_BUILD_ROOT"
  kiln_configure "$KILN_BUILD_ROOT/asan" -DKILN_BUILD_COMPILER=OFF -DKILN_SANITIZE=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 \
    -DKILN_TEST_ARTIFACTS_DIR="$KILN_BUILD_ROOT/host/tests/unit/artifacts"
  cmake --build "$KILN_BUILD_ROOT/asan"
}
