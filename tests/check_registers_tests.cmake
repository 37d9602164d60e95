# cmake -DEXE=<Catch2 test binary> -P check_registers_tests.cmake
# Fails when the binary lists no tests. catch_discover_tests treats a binary that cannot start
# (a missing libcuda.so.1) as one with no tests, and CTest then passes with 0 tests from it.
execute_process(COMMAND "${EXE}" --list-test-names-only OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
string(REGEX MATCHALL "[^\n]+" names "${out}")
list(LENGTH names n)
if(n EQUAL 0)
  message(FATAL_ERROR "${EXE} registers no tests (exit status ${rc}): ${err}")
endif()
message(STATUS "${EXE}: ${n} tests")
