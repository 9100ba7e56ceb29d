# Shared by scripts/test and scripts/demo: configure and build Kiln with Ninja.
# Source it; it defines kiln_build_host and kiln_build_aarch64.

KILN_ROOT=${KILN_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
KILN_BUILD_ROOT=${KILN_BUILD_ROOT:-$KILN_ROOT/build}
KILN_PYTHON=${KILN_PYTHON:-/usr/bin/python3}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}

# kiln_configure DIR [cmake args...]: configure once; later runs only rebuild.
kiln_configure() {
  local dir=$1; shift
  if [[ ! -f "$dir/build.ninja" ]]; then
    cmake -G Ninja -S "$KILN_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=Release \
      -DPython3_EXECUTABLE="$KILN_PYTHON" "$@"
  fi
}

kiln_build_host() {
  kiln_configure "$KILN_BUILD_ROOT/host" \
    -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19
  cmake --build "$KILN_BUILD_ROOT/host"
}

kiln_build_aarch64() {
  kiln_configure "$KILN_BUILD_ROOT/aarch64" -DKILN_BUILD_COMPILER=OFF \
    -DCMAKE_TOOLCHAIN_FILE="$KILN_ROOT/cmake/toolchains/aarch64-linux-clang.cmake"
  cmake --build "$KILN_BUILD_ROOT/aarch64"
}
