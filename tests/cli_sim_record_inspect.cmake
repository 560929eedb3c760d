# A seed whose workload forces retraction (seed 7 with page pressure: swap retractions): record it,
# replay it (identical), and find the retract and recover events with hist_token_length in
# `lockstep trace inspect`.
set(trace ${WORKDIR}/cli-sim-7.trace)
file(REMOVE ${trace})
execute_process(COMMAND ${LOCKSTEP} sim --seed 7 --faults page-pressure --record ${trace}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR NOT out MATCHES "checkers: all passed" OR NOT out MATCHES "twin run: same fingerprint")
  message(FATAL_ERROR "sim failed (${status}):\n${out}\n${err}")
endif()
if(NOT out MATCHES "retractions: [1-9][0-9]* swap")
  message(FATAL_ERROR "seed 7 with page pressure no longer retracts by swap:\n${out}")
endif()
execute_process(COMMAND ${LOCKSTEP} replay ${trace} --quiet OUTPUT_VARIABLE out RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR NOT out MATCHES "IDENTICAL")
  message(FATAL_ERROR "replay of the recorded seed was not identical (${status}):\n${out}")
endif()
execute_process(COMMAND ${LOCKSTEP} trace inspect ${trace} --steps 0:100000 OUTPUT_VARIABLE out RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR NOT out MATCHES "event retract request [0-9]+ \\(swap\\)"
   OR NOT out MATCHES "event recover request [0-9]+ \\(swap\\) hist_token_length [0-9]+")
  message(FATAL_ERROR "trace inspect shows no retract/recover with hist_token_length:\n${out}")
endif()
# The header's weight digest with its form: a recording writes the blocks form (format version 5).
if(NOT out MATCHES "format v5" OR NOT out MATCHES "\\(digest [0-9a-f]+, blocks form\\)")
  message(FATAL_ERROR "trace inspect shows no version-5 header with a blocks digest:\n${out}")
endif()
# The recovered request's timeline shows its recovery row: override and hist.
string(REGEX MATCH "event recover request ([0-9]+)" _ "${out}")
execute_process(COMMAND ${LOCKSTEP} trace inspect ${trace} --request ${CMAKE_MATCH_1} OUTPUT_VARIABLE out)
if(NOT out MATCHES "override [0-9]+ hist [0-9]+")
  message(FATAL_ERROR "the recovered request's timeline lacks its recovery row:\n${out}")
endif()
# A bad trace path or a corrupt trace is a clear error with exit status 2.
file(WRITE ${WORKDIR}/not-a-trace.trace "this is not a trace")
execute_process(COMMAND ${LOCKSTEP} replay ${WORKDIR}/not-a-trace.trace ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 2 OR NOT err MATCHES "unusable trace")
  message(FATAL_ERROR "a corrupt trace was not refused with status 2: ${status} ${err}")
endif()
