# Runs `lockstep generate` twice on the bundled prompts: both runs must print generated tokens
# and be byte-identical.
foreach(run 1 2)
  execute_process(COMMAND ${LOCKSTEP} generate --prompts ${PROMPTS} --quiet
                  OUTPUT_VARIABLE out${run} ERROR_VARIABLE err RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "lockstep generate failed (${status}): ${err}")
  endif()
endforeach()
if(NOT out1 STREQUAL out2)
  message(FATAL_ERROR "two runs differ:\n${out1}\n---\n${out2}")
endif()
if(NOT out1 MATCHES "\"tokens\":\\[[0-9]+")
  message(FATAL_ERROR "no generated tokens in:\n${out1}")
endif()
# A bad flag is an error with a message, not a crash.
execute_process(COMMAND ${LOCKSTEP} generate --prompts ${PROMPTS} --no-such-flag
                ERROR_VARIABLE err RESULT_VARIABLE status)
if(status EQUAL 0 OR NOT err MATCHES "no-such-flag")
  message(FATAL_ERROR "an unknown flag was not reported: ${status} ${err}")
endif()
