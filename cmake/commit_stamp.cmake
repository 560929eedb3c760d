# Run at build time (cmake -P, by the lockstep_commit_stamp target): writes OUTPUT, a header with
# the commit the sources are at, "-dirty" when tracked files differ from it. The file is rewritten
# only when its text changes, so a build at an unchanged commit recompiles nothing.
#   -DSOURCE_DIR=<repository> -DOUTPUT=<header> -DVERSION=<project version>
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY "${SOURCE_DIR}"
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                RESULT_VARIABLE rev_parse_status)
if(NOT rev_parse_status EQUAL 0 OR NOT commit)
  set(commit "unknown")  # not a git checkout (a source tarball)
else()
  # Untracked files are left out: they are not built unless a tracked file names them.
  execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY "${SOURCE_DIR}"
                  OUTPUT_VARIABLE changes ERROR_QUIET)
  if(changes)
    string(APPEND commit "-dirty")
  endif()
endif()
file(CONFIGURE OUTPUT "${OUTPUT}" CONTENT [[
// Written by cmake/commit_stamp.cmake at build time: the commit of the sources built.
#pragma once
#define LOCKSTEP_VERSION "@VERSION@"
#define LOCKSTEP_GIT_COMMIT "@commit@"
#define LOCKSTEP_BUILD_ID "lockstep @VERSION@ (git @commit@)"
]] @ONLY)
