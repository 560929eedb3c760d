# `cmake --install build --prefix DIR`: the `lockstep` binary, the libraries an application links
# (executor, scheduler, recorder/reader, replay, backends by name; the CUDA backend where built),
# their headers under include/lockstep, a CMake package config (find_package(lockstep) →
# lockstep::core, lockstep::trace, ...), and the Python module (python/CMakeLists.txt).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(lockstep_installed_libs lockstep_core lockstep_scheduler lockstep_trace lockstep_replay
                            lockstep_backends lockstep_warnings)
set(lockstep_export_names core scheduler trace replay backends warnings)
set(LOCKSTEP_EXPORT_KERNELS OFF)
if(TARGET lockstep_kernels)
  list(APPEND lockstep_installed_libs lockstep_kernels)
  list(APPEND lockstep_export_names kernels)
  set(LOCKSTEP_EXPORT_KERNELS ON)
endif()
foreach(target name IN ZIP_LISTS lockstep_installed_libs lockstep_export_names)
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
endforeach()

# The libraries' include directories are the source tree (and, for the trace, the build tree's
# generated header) while building; installed, the headers live under include/lockstep.
set(lockstep_install_includes "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/lockstep>")
foreach(target lockstep_core lockstep_replay lockstep_backends lockstep_kernels)
  if(TARGET ${target})
    set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES
                          "$<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>;${lockstep_install_includes}")
  endif()
endforeach()
set_target_properties(lockstep_trace PROPERTIES INTERFACE_INCLUDE_DIRECTORIES
  "$<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>;$<BUILD_INTERFACE:${PROJECT_BINARY_DIR}>;${lockstep_install_includes}")

install(TARGETS ${lockstep_installed_libs} EXPORT lockstepTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS lockstep RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
foreach(dir core trace replay backends)
  install(DIRECTORY ${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/lockstep/${dir}
          FILES_MATCHING PATTERN "*.h")
endforeach()
if(LOCKSTEP_EXPORT_KERNELS)
  install(FILES kernels/cuda_backend.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/lockstep/kernels)
  get_filename_component(LOCKSTEP_CUDA_TOOLKIT_ROOT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
endif()

set(lockstep_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/lockstep)
install(EXPORT lockstepTargets NAMESPACE lockstep:: DESTINATION ${lockstep_cmake_dir})
configure_package_config_file(cmake/lockstepConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/lockstepConfig.cmake
                              INSTALL_DESTINATION ${lockstep_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/lockstepConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/lockstepConfig.cmake ${PROJECT_BINARY_DIR}/lockstepConfigVersion.cmake
        DESTINATION ${lockstep_cmake_dir})
