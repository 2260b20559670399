# Coverage (TPF_COVERAGE=ON; included by the top-level CMakeLists.txt). Defines the `coverage`
# target: run every test that needs no GPU under gcov (but those labelled full, torchrun or
# selftest: TPF_COV_EXCLUDE), print gcovr's per-file table and summary
# for core/ and backend_sim/, write an HTML report to <build>/coverage/index.html, then gate on
# core/ alone (>= 95% lines, >= 90% branches). See coverage/README.md.
find_program(TPF_GCOVR gcovr)
if(NOT TPF_GCOVR)
  message(WARNING "gcovr not found (apt-get install -y gcovr): the coverage target will fail")
  set(TPF_GCOVR gcovr)
endif()
if(NOT CMAKE_C_COMPILER_ID STREQUAL "GNU")
  message(WARNING "coverage expects gcc (gcov); ${CMAKE_C_COMPILER_ID} may not produce gcov data")
endif()
# The simulator runs core and backend code on many threads at once: plain gcov counters then race
# and gcov reports negative counts ("branch 1 taken -4"), which gcovr refuses. Atomic updates.
foreach(t tpf_core tpf_backend_sim)
  if(TARGET ${t})
    target_compile_options(${t} PRIVATE -fprofile-update=atomic)
  endif()
endforeach()
set(TPF_COV_LINE 95 CACHE STRING "coverage gate: minimum line coverage of core/ (percent)")
set(TPF_COV_BRANCH 90 CACHE STRING "coverage gate: minimum branch coverage of core/ (percent)")
# The labels the coverage run leaves out (ctest -LE): gpu; full, the long sweeps whose quick
# variants run instead (conformance_sim_quick, cli_options_quick); torchrun, the Python tests
# under torchrun; selftest, conformance_sim_quick's operations with its judge tested. Measured:
# without the last three, core/'s line and branch counts are the same (make test-sim runs them).
set(TPF_COV_EXCLUDE "gpu|full|torchrun|selftest" CACHE STRING "coverage run: ctest -LE regex of the labels left out")
add_custom_target(coverage
  COMMAND ${CMAKE_COMMAND} -DSRC=${PROJECT_SOURCE_DIR} -DBIN=${PROJECT_BINARY_DIR}
          -DGCOVR=${TPF_GCOVR} -DCTEST=${CMAKE_CTEST_COMMAND} -DLINE=${TPF_COV_LINE}
          -DBRANCH=${TPF_COV_BRANCH} "-DEXCLUDE=${TPF_COV_EXCLUDE}"
          -P ${PROJECT_SOURCE_DIR}/coverage/coverage_run.cmake
  WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
  USES_TERMINAL
  VERBATIM
  COMMENT "tests under gcov, then gcovr (core/ and backend_sim/), gate on core/")
