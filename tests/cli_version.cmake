# `lockstep --version`: exit 0 and one line, the build id a trace header records as its writer
# (`trace inspect`'s "written by"), then the backends of this build.
execute_process(COMMAND ${LOCKSTEP} --version OUTPUT_VARIABLE out RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR NOT out MATCHES "^(lockstep [0-9.]+ \\(git [0-9a-z-]+\\)); backends: cpu")
  message(FATAL_ERROR "lockstep --version (${status}):\n${out}")
endif()
set(build_id "${CMAKE_MATCH_1}")
set(trace ${WORKDIR}/cli_version.trace)
execute_process(COMMAND ${LOCKSTEP} sim --seed 3 --no-twin --record ${trace}
                OUTPUT_QUIET RESULT_VARIABLE status)
execute_process(COMMAND ${LOCKSTEP} trace inspect ${trace} --steps 0:1
                OUTPUT_VARIABLE inspected RESULT_VARIABLE inspect_status)
string(FIND "${inspected}" "written by ${build_id}\n" at)
if(NOT status EQUAL 0 OR NOT inspect_status EQUAL 0 OR at EQUAL -1)
  message(FATAL_ERROR "the trace's writer is not '${build_id}' (${status}, ${inspect_status}):\n"
                      "${inspected}")
endif()
