# Runs one libFuzzer target for a bounded time over a fresh scratch copy of its seed corpus (cmake -P; see
# tests/fuzz/CMakeLists.txt). Fails when the fuzzer finds a crash, a sanitizer report, a leak, a timeout or an
# out-of-memory input; the input is saved as ${ARTIFACTS}<kind>-<sha1>.
foreach(v FUZZER SEEDS WORK ARTIFACTS SECONDS RSS_MB)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_fuzzer.cmake: -D${v}=... missing")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
file(GLOB seeds "${SEEDS}/*")
if(NOT seeds)
  message(FATAL_ERROR "run_fuzzer.cmake: no seeds in ${SEEDS}")
endif()
file(COPY ${seeds} DESTINATION "${WORK}")
get_filename_component(artifact_dir "${ARTIFACTS}" DIRECTORY)
file(MAKE_DIRECTORY "${artifact_dir}")

set(args -max_total_time=${SECONDS} -rss_limit_mb=${RSS_MB} -timeout=10 -max_len=8192
         -print_final_stats=1 -artifact_prefix=${ARTIFACTS})
if(DEFINED DICT AND EXISTS "${DICT}")
  list(APPEND args -dict=${DICT})
endif()
execute_process(COMMAND "${FUZZER}" ${args} "${WORK}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (exit ${rc}); the input is in ${artifact_dir}. "
                      "Reproduce: ${FUZZER} <input>")
endif()
