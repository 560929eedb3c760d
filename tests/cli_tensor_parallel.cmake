# `--tp 2` from the command line (issue 18): a simulator sweep at TP 2 passes every checker and
# twin run; a seed recorded at TP 2 replays IDENTICAL at TP 2 and teacher-forced at TP 1 (with
# faults off: a faulted seed's teacher-forced replay agrees below 100% at any degree, TP 1 to
# TP 1 included), and its header names the degree; `generate --tp 2` emits the greedy tokens of TP 1; a degree the model
# cannot shard, and --tp with the stub model, exit 2 naming the reason.
execute_process(COMMAND ${LOCKSTEP} sim --seeds 1..6 --tp 2
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR NOT out MATCHES "1\\.\\.6 +0 ")
  message(FATAL_ERROR "sim --seeds 1..6 --tp 2 failed (${status}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${LOCKSTEP} sim --seeds 1..3 --tp 2 --spec
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR NOT out MATCHES "1\\.\\.3 +0 ")
  message(FATAL_ERROR "sim --seeds 1..3 --tp 2 --spec failed (${status}):\n${out}\n${err}")
endif()
set(trace ${WORKDIR}/cli-tp2.trace)
file(REMOVE ${trace})
execute_process(COMMAND ${LOCKSTEP} sim --seed 7 --tp 2 --faults none --record ${trace}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR NOT out MATCHES "tensor parallel: TP 2" OR NOT out MATCHES "--faults none --tp 2")
  message(FATAL_ERROR "sim --seed 7 --tp 2 --faults none --record failed (${status}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${LOCKSTEP} trace inspect ${trace}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR NOT out MATCHES "batch-invariant, TP 2")
  message(FATAL_ERROR "the TP 2 trace's header does not name the degree (${status}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${LOCKSTEP} replay ${trace} -q
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR NOT out MATCHES "at TP 2 \\(recorded at TP 2\\)" OR NOT out MATCHES "IDENTICAL")
  message(FATAL_ERROR "exact replay of the TP 2 trace failed (${status}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${LOCKSTEP} replay ${trace} -q --tp 1 --mode teacher-forced
                        --json ${WORKDIR}/cli-tp2-replay.json
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR NOT out MATCHES "at TP 1 \\(recorded at TP 2\\)" OR NOT out MATCHES "\\(100\\.00%\\)")
  message(FATAL_ERROR "teacher-forced replay of the TP 2 trace at TP 1 failed (${status}):\n${out}\n${err}")
endif()
# The replay's JSON and the report built from it name the degree it replayed at and the recorded one.
file(READ ${WORKDIR}/cli-tp2-replay.json replay_json)
if(NOT replay_json MATCHES "\"tp_degree\": 1,")
  message(FATAL_ERROR "the replay JSON does not name TP 1:\n${replay_json}")
endif()
execute_process(COMMAND ${LOCKSTEP} report ${trace} -o ${WORKDIR}/cli-tp2.html --json ${WORKDIR}/cli-tp2-report.json
                        --replay-json ${WORKDIR}/cli-tp2-replay.json
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status)
file(READ ${WORKDIR}/cli-tp2-report.json report_json)
if(NOT status EQUAL 0 OR NOT report_json MATCHES "\"tp_degree\": 2," OR NOT report_json MATCHES "\"tp_degree\": 1,")
  message(FATAL_ERROR "report --replay-json of the TP 2 trace (${status}):\n${out}\n${err}\n${report_json}")
endif()
execute_process(COMMAND ${LOCKSTEP} replay ${trace} -q --tp 1
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 2 OR NOT err MATCHES "exact replay refuses --tp 1")
  message(FATAL_ERROR "exact replay at TP 1 of a TP 2 trace: expected exit 2, got ${status}:\n${out}\n${err}")
endif()
execute_process(COMMAND ${LOCKSTEP} generate --prompts ${PROMPTS} -q
                OUTPUT_VARIABLE tp1 ERROR_VARIABLE err RESULT_VARIABLE status)
execute_process(COMMAND ${LOCKSTEP} generate --prompts ${PROMPTS} -q --tp 2
                OUTPUT_VARIABLE tp2 ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR tp2 STREQUAL "" OR NOT tp1 STREQUAL tp2)
  message(FATAL_ERROR "generate --tp 2 differs from TP 1 on the example prompts (${status}):\n${tp1}\n---\n${tp2}\n${err}")
endif()
foreach(bad "generate;--prompts;${PROMPTS};--tp;4|kv heads" "sim;--seed;1;--tp;4|kv heads"
            "sim;--seed;1;--tp;2;--stub-model|stub model" "generate;--prompts;${PROMPTS};--tp;9|--tp")
  string(REPLACE "|" ";" parts "${bad}")
  list(POP_BACK parts why)
  execute_process(COMMAND ${LOCKSTEP} ${parts} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status)
  if(NOT status EQUAL 2 OR NOT err MATCHES "${why}")
    message(FATAL_ERROR "${parts}: expected exit 2 naming '${why}', got ${status}:\n${out}\n${err}")
  endif()
endforeach()
