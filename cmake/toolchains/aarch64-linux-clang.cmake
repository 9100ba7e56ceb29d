# Cross-compile the runtime for 64-bit Arm Linux with Debian's clang-19 and lld.
# Tests run through qemu-aarch64 (ctest uses CMAKE_CROSSCOMPILING_EMULATOR).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(KILN_CROSS_TRIPLE aarch64-linux-gnu)
find_program(CMAKE_C_COMPILER NAMES clang-19 REQUIRED)
find_program(CMAKE_CXX_COMPILER NAMES clang++-19 REQUIRED)
set(CMAKE_C_COMPILER_TARGET ${KILN_CROSS_TRIPLE})
set(CMAKE_CXX_COMPILER_TARGET ${KILN_CROSS_TRIPLE})
set(CMAKE_EXE_LINKER_FLAGS_INIT "-fuse-ld=lld")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "-fuse-ld=lld")
set(CMAKE_MODULE_LINKER_FLAGS_INIT "-fuse-ld=lld")

# The cross toolchain's sysroot, and Debian's multiarch directories for arm64
# -dev packages (the runtime needs none).
set(CMAKE_FIND_ROOT_PATH /usr/${KILN_CROSS_TRIPLE} /)
set(CMAKE_LIBRARY_ARCHITECTURE ${KILN_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# KILN_QEMU_AARCH64 may name another emulator (one that runs SME2, say).
if(DEFINED ENV{KILN_QEMU_AARCH64})
  set(_kiln_qemu "$ENV{KILN_QEMU_AARCH64}")
else()
  find_program(_kiln_qemu qemu-aarch64)
endif()
if(_kiln_qemu)
  # The cross toolchain's sysroot holds a whole glibc (libc6-arm64-cross) beside the
  # system's multiarch arm64 glibc in /lib/aarch64-linux-gnu (libc6:arm64, where any
  # arm64 package is installed), often of another Debian revision. With -L alone the sysroot's
  # ld.so searches the multiarch directory first, loads the other libc.so.6, and the
  # mismatched pair hangs in pthread_create. LD_LIBRARY_PATH=/lib (the sysroot's lib under
  # -L) keeps the program on the sysroot's libc.
  set(CMAKE_CROSSCOMPILING_EMULATOR "${_kiln_qemu};-cpu;max;-L;/usr/${KILN_CROSS_TRIPLE};-E;LD_LIBRARY_PATH=/lib")
endif()
