# Configures, builds and runs tests/consumer/subdirectory (cistern as a subproject, the library
# only) in BINARY_DIR; the ctest consumer_subdirectory runs it:
#   cmake -DCISTERN_SOURCE_DIR=... -DBINARY_DIR=... -DGENERATOR=Ninja -DCXX_COMPILER=g++
#         -P tests/consumer/subdirectory/run.cmake
# The build's parallelism is CMake's default, or CMAKE_BUILD_PARALLEL_LEVEL from the environment.
foreach(variable CISTERN_SOURCE_DIR BINARY_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${variable})
    message(FATAL_ERROR "run.cmake: -D${variable}=... is needed")
  endif()
endforeach()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "consumer_subdirectory: ${what} failed (${status})")
  endif()
endfunction()

run_step(configure "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}" -B "${BINARY_DIR}"
         -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
         "-DCISTERN_SOURCE_DIR=${CISTERN_SOURCE_DIR}")
run_step(build "${CMAKE_COMMAND}" --build "${BINARY_DIR}")
run_step(run "${BINARY_DIR}/consumer")
