# Warning and sanitizer flags shared by every Kiln target.

if(CMAKE_C_COMPILER_ID MATCHES "Clang|GNU")
  add_compile_options(-Wall -Wextra -Wno-unused-parameter)
endif()

if(KILN_SANITIZE)
  set(_kiln_san -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_compile_options(${_kiln_san})
  add_link_options(${_kiln_san})
endif()

# KILN_BUILD_FUZZERS: every target gets libFuzzer's coverage instrumentation plus ASan
# and UBSan; only the fuzz_* executables link libFuzzer itself (KILN_FUZZER_LINK_FLAGS,
# tests/fuzz/CMakeLists.txt), so that the rest still links with its own main().
if(KILN_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "KILN_BUILD_FUZZERS needs clang (libFuzzer), e.g. -DCMAKE_CXX_COMPILER=clang++-19")
  endif()
  set(_kiln_fuzz_san -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_compile_options(-fsanitize=fuzzer-no-link ${_kiln_fuzz_san})
  add_link_options(${_kiln_fuzz_san})
  set(KILN_FUZZER_LINK_FLAGS -fsanitize=fuzzer)
endif()

# kiln_runtime_target(<target>): flags for code that ships inside an app. No
# exceptions or RTTI cross the C ABI; the runtime reports every failure by status.
# A section per function and per object, so that an app linking libkiln.a with
# --gc-sections keeps only what it reaches (the calibration entry points, say).
# MinSizeRel optimises the runtime for size with -Oz where the compiler has it (clang;
# GCC 12), a tenth smaller than -Os for arm64.
include(CheckCXXCompilerFlag)
check_cxx_compiler_flag(-Oz KILN_CXX_HAS_OZ)
function(kiln_runtime_target target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-fno-exceptions -fno-rtti>
    -fvisibility=hidden -ffunction-sections -fdata-sections)
  if(KILN_CXX_HAS_OZ)
    target_compile_options(${target} PRIVATE $<$<CONFIG:MinSizeRel>:-Oz>)
  endif()
  # The runtime throws no exceptions: its unwind tables serve crash reporters,
  # debuggers and profilers only (on arm64 about 29 KB of a MinSizeRel libkiln.so).
  if(NOT KILN_RUNTIME_UNWIND_TABLES)
    target_compile_options(${target} PRIVATE -fno-unwind-tables -fno-asynchronous-unwind-tables)
  endif()
endfunction()
