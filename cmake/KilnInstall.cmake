# Install rules: `cmake --install BUILD --prefix PREFIX` puts
#   include/kiln/kiln.h, lib/libkiln.a (and libkiln.so with KILN_BUILD_SHARED),
#   bin/ the tools that were built,
#   lib/cmake/Kiln/ the CMake package: find_package(Kiln) gives Kiln::runtime (static)
#     and Kiln::runtime_shared,
#   lib/pkgconfig/kiln.pc (relocatable: paths from the .pc file's own place).
include(CMakePackageConfigHelpers)

set(KILN_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/Kiln")
install(TARGETS kiln_runtime EXPORT KilnTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(TARGET kiln_runtime_shared)
  install(TARGETS kiln_runtime_shared EXPORT KilnTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} NAMELINK_COMPONENT Runtime)
endif()
install(FILES ${KILN_SOURCE_DIR}/runtime/include/kiln/kiln.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln)
# The JNI binding (C and Java sources) that an Android app builds beside the runtime.
install(DIRECTORY ${KILN_SOURCE_DIR}/runtime/bindings/jni DESTINATION ${CMAKE_INSTALL_DATADIR}/kiln)
install(EXPORT KilnTargets NAMESPACE Kiln:: DESTINATION ${KILN_CMAKE_DIR})

foreach(tool kiln-run kiln-inspect kiln-bench kiln-compile kiln-opt)
  if(TARGET ${tool})
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()

configure_package_config_file(${KILN_SOURCE_DIR}/cmake/KilnConfig.cmake.in
  ${KILN_BINARY_DIR}/KilnConfig.cmake INSTALL_DESTINATION ${KILN_CMAKE_DIR})
write_basic_package_version_file(${KILN_BINARY_DIR}/KilnConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${KILN_BINARY_DIR}/KilnConfig.cmake ${KILN_BINARY_DIR}/KilnConfigVersion.cmake
        DESTINATION ${KILN_CMAKE_DIR})

configure_file(${KILN_SOURCE_DIR}/cmake/kiln.pc.in ${KILN_BINARY_DIR}/kiln.pc @ONLY)
install(FILES ${KILN_BINARY_DIR}/kiln.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
