# `lockstep replay --localise` (issue 15) on the CPU reference: a trace recorded by `lockstep`
# with --record-activations replays IDENTICAL with nothing to localise; replayed by
# lockstep_planted_cpu (layer 1's output perturbed, tests/planted/perturb_layer_output.h) it
# diverges and --localise names layer 1 mlp_out, in exact and teacher-forced mode and in --json;
# a trace without digests is compared with a second replay; bad flag combinations exit 2 naming
# the flag; a divergence on a trace another build wrote (2cbf2ac's fixture) names both builds,
# one on this build's trace does not. (scripts/gpu-run.sh: tests/gpu/localise_gpu_test.cpp does
# CUDA.)
function(run name)
  execute_process(COMMAND ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status)
  set(${name}_out "${out}" PARENT_SCOPE)
  set(${name}_err "${err}" PARENT_SCOPE)
  set(${name}_status "${status}" PARENT_SCOPE)
endfunction()
function(expect name status pattern)
  if(NOT "${${name}_status}" STREQUAL "${status}" OR NOT "${${name}_out}${${name}_err}" MATCHES "${pattern}")
    message(FATAL_ERROR "${name}: expected exit ${status} and /${pattern}/, got ${${name}_status}:\n"
                        "${${name}_out}\n${${name}_err}")
  endif()
endfunction()

set(trace ${WORKDIR}/cli-localise.trace)
set(plain ${WORKDIR}/cli-localise-plain.trace)
file(REMOVE ${trace} ${plain})
run(record ${LOCKSTEP} generate --prompts ${PROMPTS} --record ${trace} --record-activations --quiet)
expect(record 0 "")
run(record_plain ${LOCKSTEP} generate --prompts ${PROMPTS} --record ${plain} --quiet)
expect(record_plain 0 "")
if(NOT record_out STREQUAL record_plain_out)
  message(FATAL_ERROR "--record-activations changed the tokens:\n${record_out}\n---\n${record_plain_out}")
endif()

run(inspect ${LOCKSTEP} trace inspect ${trace} --steps 0:1)
expect(inspect 0 "activation digests: every step")

# The production build: nothing diverges, nothing to localise.
run(same ${LOCKSTEP} replay ${trace} --localise --quiet)
expect(same 0 "IDENTICAL.*localise: nothing to localise")

# The planted build against the recorded digests: layer 1's output, token row 0, and no earlier
# tensor (layer 0's all agree).
run(planted ${PLANTED} replay ${trace} --localise --quiet --json ${WORKDIR}/cli-localise.json)
expect(planted 1 "DIVERGED at step [0-9]+.*against recorded activation digests.*first difference: layer 1 mlp_out, row 0 \\(op row 0")
expect(planted 1 "digest: recorded [0-9a-f]+, replayed [0-9a-f]+")
file(READ ${WORKDIR}/cli-localise.json json)
string(JSON tensor GET "${json}" localisation tensor)
string(JSON verdict GET "${json}" localisation verdict)
if(NOT tensor STREQUAL "layer 1 mlp_out" OR NOT verdict STREQUAL "differs")
  message(FATAL_ERROR "--json localisation: tensor '${tensor}', verdict '${verdict}'\n${json}")
endif()
# `lockstep report --replay-json` reads a result that carries a localisation.
run(report ${LOCKSTEP} report ${trace} -o ${WORKDIR}/cli-localise.html --replay-json ${WORKDIR}/cli-localise.json)
expect(report 0 "")
run(planted_tf ${PLANTED} replay ${trace} --mode teacher-forced --localise --quiet)
expect(planted_tf 1 "first difference: layer 1 mlp_out, row 0")

# No recorded digests: a second replay on the recording's backend (the same planted build here,
# so the two agree bit for bit: the divergence is between the recording and this build).
run(second ${PLANTED} replay ${plain} --localise --quiet)
expect(second 1 "against a replay on cpu \\(bits compared\\).*IDENTICAL: every layer's tensors agree bit for bit")

# Refusals, exit 2, naming the flag.
run(no_record ${LOCKSTEP} generate --prompts ${PROMPTS} --record-activations --quiet)
expect(no_record 2 "--record-activations records into a trace: add --record")
run(no_record_sim ${LOCKSTEP} sim --seed 3 --record-activations)
expect(no_record_sim 2 "--record-activations records into a trace: add --record")
run(tp2 ${LOCKSTEP} generate --prompts ${PROMPTS} --record ${WORKDIR}/cli-localise-tp2.trace
    --record-activations --tp 2 --quiet)
expect(tp2 2 "not captured at tensor-parallel degree 2")
run(hybrid ${LOCKSTEP} sim --seed 3 --model tiny-hybrid --record ${WORKDIR}/cli-localise-hybrid.trace
    --record-activations)
expect(hybrid 2 "has Mamba layers, which the capture does not cover")
run(against_alone ${LOCKSTEP} replay ${trace} --localise-against cpu --quiet)
expect(against_alone 2 "--localise-against cpu names the other side of --localise")
run(isolate ${LOCKSTEP} replay ${trace} --localise --isolate 1 --quiet)
expect(isolate 2 "--localise with --isolate 1")
if(HAVE_CUDA)
  run(cross_exact ${LOCKSTEP} replay ${plain} --localise --localise-against cuda --quiet)
  expect(cross_exact 2 "needs --mode teacher-forced")
  run(digests_other ${LOCKSTEP} replay ${trace} --backend cuda --localise --quiet)
  expect(digests_other 2 "the recorded activation digests are the cpu backend's")
endif()

# The simulator records them too, and its trace localises nothing on the production build.
set(sim_trace ${WORKDIR}/cli-localise-sim.trace)
file(REMOVE ${sim_trace})
run(sim ${LOCKSTEP} sim --seed 3 --requests 6 --record ${sim_trace} --record-activations)
expect(sim 0 "recorded")
run(sim_replay ${LOCKSTEP} replay ${sim_trace} --localise --quiet)
expect(sim_replay 0 "IDENTICAL.*nothing to localise")
run(sim_planted ${PLANTED} replay ${sim_trace} --localise --quiet)
expect(sim_planted 1 "first difference: layer 1 mlp_out")

# Which build wrote a trace, when a verdict is not identical: the planted build is this build
# (no note on this build's trace), the fixture was written by 2cbf2ac.
if("${sim_planted_out}" MATCHES "note: recorded by")
  message(FATAL_ERROR "a note of another build on this build's trace:\n${sim_planted_out}")
endif()
run(other_build ${PLANTED} replay ${OTHER_BUILD_TRACE} --quiet)
expect(other_build 1 "DIVERGED.*note: recorded by lockstep 0.1.0 \\(git 2cbf2accc536\\), replayed by lockstep")
