# Progress off a terminal (ctest captures stderr, as a CI log does): `sim --seeds` prints a line a
# tenth of the sweep, not a carriage-return redraw per seed; `generate` and `replay` print no
# carriage return either. Their results are unchanged.
execute_process(COMMAND ${LOCKSTEP} sim --seeds 1..200 --stub-model --no-twin
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR NOT out MATCHES "1\\.\\.200 +0 ")
  message(FATAL_ERROR "the sweep failed (${status}):\n${out}\n${err}")
endif()
string(FIND "${err}" "\r" cr)
if(NOT cr EQUAL -1)
  message(FATAL_ERROR "sim --seeds drew its progress with carriage returns off a terminal:\n${err}")
endif()
string(REGEX MATCHALL "[^\n]+" lines "${err}")
list(LENGTH lines count)
if(count GREATER 11 OR count LESS 2 OR NOT err MATCHES "200/200 seeds, 0 failed")
  message(FATAL_ERROR "expected at most 11 progress lines ending at 200/200, got ${count}:\n${err}")
endif()
set(trace ${WORKDIR}/cli_progress.trace)
execute_process(COMMAND ${LOCKSTEP} generate --prompts ${PROMPTS} --record ${trace}
                        -o ${WORKDIR}/cli_progress.jsonl
                ERROR_VARIABLE err RESULT_VARIABLE status)
string(FIND "${err}" "\r" cr)
if(NOT status EQUAL 0 OR NOT cr EQUAL -1 OR NOT err MATCHES "generate: [0-9]+ requests")
  message(FATAL_ERROR "generate (${status}) off a terminal:\n${err}")
endif()
execute_process(COMMAND ${LOCKSTEP} replay ${trace} ERROR_VARIABLE err OUTPUT_VARIABLE out
                RESULT_VARIABLE status)
string(FIND "${err}${out}" "\r" cr)
if(NOT status EQUAL 0 OR NOT cr EQUAL -1 OR NOT out MATCHES "IDENTICAL")
  message(FATAL_ERROR "replay (${status}) off a terminal:\n${out}\n${err}")
endif()
