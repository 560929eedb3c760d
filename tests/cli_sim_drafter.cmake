# `lockstep sim --spec --drafter`: a sweep with the drafter overridden runs every seed with it (the
# header names it, 0 failed); an unknown drafter, or --drafter without --spec, exits 2 naming the
# flag. (scripts/gpu-run.sh runs the same sweep with --backend cuda, which needs the n-gram one.)
execute_process(COMMAND ${LOCKSTEP} sim --seeds 1..12 --spec --drafter ngram
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR NOT out MATCHES "1\\.\\.12 +0 ")
  message(FATAL_ERROR "sim --spec --drafter ngram sweep failed (${status}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${LOCKSTEP} sim --seed 5 --spec --drafter oracle-mix
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR NOT "${out}${err}" MATCHES "drafter oracle-mix")
  message(FATAL_ERROR "sim --seed 5 --spec --drafter oracle-mix does not run the oracle-mix drafter (${status}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${LOCKSTEP} sim --seed 5 --spec --drafter ngram
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR NOT "${out}${err}" MATCHES "drafter ngram")
  message(FATAL_ERROR "sim --seed 5 --spec --drafter ngram does not run the n-gram drafter (${status}):\n${out}\n${err}")
endif()
foreach(bad "--spec;--drafter;medusa" "--drafter;ngram")
  execute_process(COMMAND ${LOCKSTEP} sim --seed 5 ${bad}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status)
  if(NOT status EQUAL 2 OR NOT err MATCHES "--drafter")
    message(FATAL_ERROR "sim ${bad}: expected exit 2 naming --drafter, got ${status}:\n${err}")
  endif()
endforeach()
