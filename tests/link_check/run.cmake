# Builds tests/link_check against INCLUDE_DIR and passes when, and only when, the link fails with
# an undefined reference to user_sum: a program that mixes the configurations must not link.
file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}" -DCMAKE_BUILD_TYPE=Release
                        -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCUTRAIN_INCLUDE_DIR=${INCLUDE_DIR}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the link check failed:\n${out}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "a program mixing the CUDA and non-CUDA configurations linked: cutrain's headers are not in "
                      "the inline namespace of core/abi.hpp (run scripts/apply-abi-namespace)")
endif()
if(NOT out MATCHES "undefined (reference to|symbol).*user_sum")
  message(FATAL_ERROR "the link check failed, but not with an undefined reference to user_sum:\n${out}")
endif()
message(STATUS "mixing the configurations fails to link, as it should")
