# GoogleTest: the installed package on the host; built from Debian's sources
# (/usr/src/googletest) when cross-compiling, so the test binaries match the target.
include(GoogleTest)

set(KILN_GTEST_SOURCE_DIR "/usr/src/googletest" CACHE PATH "GoogleTest sources for cross builds")

if(NOT CMAKE_CROSSCOMPILING)
  find_package(GTest CONFIG QUIET)
endif()

if(TARGET GTest::gtest_main)
  message(STATUS "GoogleTest: installed package")
elseif(EXISTS "${KILN_GTEST_SOURCE_DIR}/CMakeLists.txt")
  message(STATUS "GoogleTest: building from ${KILN_GTEST_SOURCE_DIR}")
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  add_subdirectory("${KILN_GTEST_SOURCE_DIR}" "${CMAKE_BINARY_DIR}/_deps/googletest" EXCLUDE_FROM_ALL)
  # googletest's own CMake defines the GTest::gtest and GTest::gtest_main aliases.
else()
  message(FATAL_ERROR "GoogleTest not found: install googletest and libgtest-dev "
                      "(scripts/setup does), or pass -DKILN_BUILD_TESTS=OFF")
endif()

# kiln_add_gtest(<name> SOURCES ... LIBS ...): one GoogleTest executable whose cases
# are registered with ctest one by one (run under the cross emulator when set).
# Cases that read vectors made by a ctest fixture name it in FIXTURES (one name:
# gtest_discover_tests flattens lists in PROPERTIES).
# LABEL adds a ctest label beside "unit" (e.g. kernels-diff).
function(kiln_add_gtest name)
  cmake_parse_arguments(ARG "" "FIXTURES;LABEL" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest_main)
  if(ARG_FIXTURES)
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 120 TEST_LIST ${name}_CASES PROPERTIES
      LABELS unit FIXTURES_REQUIRED "${ARG_FIXTURES}")
  else()
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 120 TEST_LIST ${name}_CASES PROPERTIES LABELS unit)
  endif()
  if(ARG_LABEL)
    # A second label cannot travel through gtest_discover_tests' PROPERTIES (it
    # splits lists); ctest reads this file after the discovered cases.
    set(labels_file "${CMAKE_CURRENT_BINARY_DIR}/${name}_labels.cmake")
    file(WRITE "${labels_file}"
         "if(${name}_CASES)\n  set_tests_properties(\${${name}_CASES} PROPERTIES LABELS \"unit;${ARG_LABEL}\")\nendif()\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${labels_file}")
  endif()
endfunction()
