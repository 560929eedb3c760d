# `lockstep generate` with speculative decoding on the CPU reference: greedy prompts (two of them
# repetitive, so the n-gram drafter proposes drafts that are accepted) give the same tokens at
# --verify-width 4 --drafter ngram as at W = 1; the recorded trace names the drafter and replays
# identical; a bad --drafter, or a drafter at W = 1, is a clear error. (scripts/gpu-run.sh runs
# the same on --backend cuda.)
set(prompts ${WORKDIR}/spec-prompts.jsonl)
file(WRITE ${prompts}
"{\"id\": 1, \"prompt\": [7, 8, 9, 10, 7, 8, 9, 10, 7, 8, 9, 10, 7, 8], \"max_new_tokens\": 40}
{\"id\": 2, \"prompt\": [300, 337, 374, 411, 448, 485, 322, 359], \"max_new_tokens\": 32}
{\"id\": 3, \"prompt\": [5, 5, 5, 5, 5, 5, 5, 5], \"max_new_tokens\": 48}
{\"id\": 4, \"prompt\": [42], \"max_new_tokens\": 24}
")
set(trace ${WORKDIR}/cli-spec.trace)
file(REMOVE ${trace})
execute_process(COMMAND ${LOCKSTEP} generate --prompts ${prompts} --quiet
                OUTPUT_VARIABLE plain ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "lockstep generate (W = 1) failed (${status}): ${err}")
endif()
execute_process(COMMAND ${LOCKSTEP} generate --prompts ${prompts} --verify-width 4 --drafter ngram
                        --record ${trace}
                OUTPUT_VARIABLE spec ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "lockstep generate (W = 4, ngram) failed (${status}): ${err}")
endif()
if(NOT plain STREQUAL spec)
  message(FATAL_ERROR "greedy tokens differ with speculative decoding:\n${plain}\n---\n${spec}")
endif()
if(NOT err MATCHES "W 4, drafter ngram")
  message(FATAL_ERROR "the summary does not name W and the drafter: ${err}")
endif()
execute_process(COMMAND ${LOCKSTEP} trace inspect ${trace} OUTPUT_VARIABLE out RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR NOT out MATCHES "W 4, prefill chunk [0-9]+; drafter ngram")
  message(FATAL_ERROR "the trace header does not record W 4 and the ngram drafter:\n${out}")
endif()
execute_process(COMMAND ${LOCKSTEP} replay ${trace} --quiet OUTPUT_VARIABLE out RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR NOT out MATCHES "IDENTICAL")
  message(FATAL_ERROR "replay of the speculative trace was not identical (${status}):\n${out}")
endif()
execute_process(COMMAND ${LOCKSTEP} generate --prompts ${prompts} --verify-width 4 --drafter oracle
                ERROR_VARIABLE err RESULT_VARIABLE status)
if(status EQUAL 0 OR NOT err MATCHES "drafter")
  message(FATAL_ERROR "an unknown drafter was not refused: ${status} ${err}")
endif()
execute_process(COMMAND ${LOCKSTEP} generate --prompts ${prompts} --drafter ngram
                ERROR_VARIABLE err RESULT_VARIABLE status)
if(status EQUAL 0 OR NOT err MATCHES "needs --verify-width 2 or more")
  message(FATAL_ERROR "a drafter at W = 1 was not refused: ${status} ${err}")
endif()
