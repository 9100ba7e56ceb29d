# MLIR/LLVM 19 for the compiler side. Include directories are never set globally:
# compiler-side directories call kiln_use_mlir() so the runtime's compile lines stay
# free of LLVM and MLIR headers.

find_package(MLIR REQUIRED CONFIG HINTS /usr/lib/llvm-19/lib/cmake/mlir)
if(NOT LLVM_VERSION_MAJOR EQUAL 19)
  message(FATAL_ERROR "Kiln needs MLIR/LLVM 19, found ${LLVM_PACKAGE_VERSION} at ${MLIR_DIR}; "
                      "install libmlir-19-dev (scripts/setup does) or set MLIR_DIR")
endif()
message(STATUS "MLIR ${LLVM_PACKAGE_VERSION} from ${MLIR_DIR}")

list(APPEND CMAKE_MODULE_PATH "${MLIR_CMAKE_DIR}" "${LLVM_CMAKE_DIR}")

if(NOT IS_ABSOLUTE "${MLIR_TABLEGEN_EXE}")
  find_program(_kiln_mlir_tblgen NAMES mlir-tblgen mlir-tblgen-19
    HINTS "${LLVM_TOOLS_BINARY_DIR}" REQUIRED)
  set(MLIR_TABLEGEN_EXE "${_kiln_mlir_tblgen}")
endif()

set(LLVM_RUNTIME_OUTPUT_INTDIR "${CMAKE_BINARY_DIR}/bin")
set(LLVM_LIBRARY_OUTPUT_INTDIR "${CMAKE_BINARY_DIR}/lib")
set(MLIR_BINARY_DIR "${CMAKE_BINARY_DIR}")

include(TableGen)
include(AddLLVM)
include(AddMLIR)

separate_arguments(KILN_LLVM_DEFINITIONS NATIVE_COMMAND "${LLVM_DEFINITIONS}")

find_program(KILN_FILECHECK FileCheck HINTS "${LLVM_TOOLS_BINARY_DIR}" REQUIRED)
find_program(KILN_LIT NAMES lit lit.py llvm-lit
  HINTS "${LLVM_TOOLS_BINARY_DIR}/../build/utils/lit" /usr/lib/llvm-19/build/utils/lit)

# kiln_use_mlir(): MLIR/LLVM headers and definitions for the calling directory only.
macro(kiln_use_mlir)
  include_directories(SYSTEM ${LLVM_INCLUDE_DIRS} ${MLIR_INCLUDE_DIRS})
  include_directories(${KILN_SOURCE_DIR} ${KILN_BINARY_DIR})
  add_definitions(${KILN_LLVM_DEFINITIONS})
endmacro()
