# Installs the build into a scratch prefix, then configures, builds and runs
# tests/package_consumer against it: find_package(lockstep) and linking the executor and the
# recorder must work from an install alone. -DBUILD_DIR, -DSOURCE_DIR, -DWORKDIR.
set(prefix ${WORKDIR}/package_prefix)
set(consumer ${WORKDIR}/package_consumer_build)
file(REMOVE_RECURSE ${prefix} ${consumer})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix}
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()
foreach(expected bin/lockstep lib/cmake/lockstep/lockstepConfig.cmake include/lockstep/core/executor.h
                 include/lockstep/trace/recorder.h)
  if(NOT EXISTS ${prefix}/${expected})
    message(FATAL_ERROR "the install lacks ${expected}")
  endif()
endforeach()
file(GLOB module ${prefix}/lib/python*/site-packages/lockstep/_lockstep*.so)
if(PYTHON_MODULE AND NOT module)
  message(FATAL_ERROR "the install lacks the Python module")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package_consumer -B ${consumer} -G Ninja
                        -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${prefix}
                        -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_C_COMPILER=${C_COMPILER}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the consumer against ${prefix} failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${consumer} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the consumer failed (${rc})")
endif()
execute_process(COMMAND ${consumer}/consumer ${consumer}/consumer.trace RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the consumer failed (${rc})")
endif()
