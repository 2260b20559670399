# Script behind the `coverage` target (cmake -P): SRC, BIN, GCOVR, CTEST, LINE, BRANCH, EXCLUDE
# are given. Steps: clear old counters, run ctest -LE EXCLUDE, report, gate. The report is printed
# even when a test failed (so the numbers are visible), but the target fails in that case too.
file(GLOB_RECURSE old_gcda "${BIN}/*.gcda")
if(old_gcda)
  file(REMOVE ${old_gcda})
endif()
file(MAKE_DIRECTORY "${BIN}/coverage")

if(NOT EXCLUDE)
  set(EXCLUDE gpu)
endif()
message(STATUS "coverage: running ctest -LE ${EXCLUDE}")
execute_process(COMMAND ${CTEST} --output-on-failure -LE "${EXCLUDE}" -j 2
                WORKING_DIRECTORY "${BIN}" RESULT_VARIABLE test_rc)

set(common --root "${SRC}" --config "${SRC}/coverage/gcovr.cfg" --object-directory "${BIN}" "${BIN}")

message(STATUS "coverage: core/ and backend_sim/, lines per file (HTML: ${BIN}/coverage/index.html)")
execute_process(COMMAND ${GCOVR} ${common} --filter "${SRC}/core/" --filter "${SRC}/backend_sim/"
                        --txt --html-details "${BIN}/coverage/index.html" --print-summary
                RESULT_VARIABLE report_rc)
message(STATUS "coverage: core/ and backend_sim/, branches per file")
execute_process(COMMAND ${GCOVR} ${common} --filter "${SRC}/core/" --filter "${SRC}/backend_sim/"
                        --branches --txt)

message(STATUS "coverage: backend_sim/ summary")
execute_process(COMMAND ${GCOVR} ${common} --filter "${SRC}/backend_sim/" --print-summary
                        --txt "${BIN}/coverage/backend_sim.txt")

message(STATUS "coverage: gate on core/ (lines >= ${LINE}%, branches >= ${BRANCH}%)")
execute_process(COMMAND ${GCOVR} ${common} --filter "${SRC}/core/" --print-summary
                        --txt "${BIN}/coverage/core.txt"
                        --fail-under-line ${LINE} --fail-under-branch ${BRANCH}
                RESULT_VARIABLE gate_rc)

if(NOT test_rc EQUAL 0)
  message(FATAL_ERROR "coverage: tests failed (ctest exit ${test_rc})")
endif()
if(NOT report_rc EQUAL 0)
  message(FATAL_ERROR "coverage: gcovr report failed (exit ${report_rc})")
endif()
if(gate_rc EQUAL 2)
  message(FATAL_ERROR "coverage: GATE FAILED: core/ line coverage below ${LINE}% (see ${BIN}/coverage/core.txt)")
elseif(gate_rc EQUAL 4)
  message(FATAL_ERROR "coverage: GATE FAILED: core/ branch coverage below ${BRANCH}% (see ${BIN}/coverage/core.txt)")
elseif(gate_rc EQUAL 6)
  message(FATAL_ERROR "coverage: GATE FAILED: core/ line (< ${LINE}%) and branch (< ${BRANCH}%) coverage")
elseif(NOT gate_rc EQUAL 0)
  message(FATAL_ERROR "coverage: gcovr gate run failed (exit ${gate_rc})")
endif()
message(STATUS "coverage: gate passed (core/ >= ${LINE}% lines, >= ${BRANCH}% branches)")
