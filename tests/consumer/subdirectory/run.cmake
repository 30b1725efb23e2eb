# Configures, builds and runs tests/consumer/subdirectory (cistern as a subproject, the library
# only) in BINARY_DIR; the ctests consumer_subdirectory and consumer_fetchcontent run it:
#   cmake -DCISTERN_SOURCE_DIR=... -DBINARY_DIR=... -DGENERATOR=Ninja -DCXX_COMPILER=g++
#         [-DMODE=fetchcontent] -P tests/consumer/subdirectory/run.cmake
# MODE subdirectory (the default) adds the source tree with add_subdirectory; MODE fetchcontent
# packs what a source release of the library holds (the top-level CMakeLists.txt, cmake/,
# include/, src/ and the license) into BINARY_DIR/cistern-src.tar.gz and has FetchContent fetch it
# by URL, checked by its SHA-256.
# The build's parallelism is CMake's default, or CMAKE_BUILD_PARALLEL_LEVEL from the environment.
foreach(variable CISTERN_SOURCE_DIR BINARY_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${variable})
    message(FATAL_ERROR "run.cmake: -D${variable}=... is needed")
  endif()
endforeach()
if(NOT DEFINED MODE)
  set(MODE subdirectory)
endif()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "consumer_${MODE}: ${what} failed (${status})")
  endif()
endfunction()

if(MODE STREQUAL "subdirectory")
  set(source "-DCISTERN_SOURCE_DIR=${CISTERN_SOURCE_DIR}")
elseif(MODE STREQUAL "fetchcontent")
  file(MAKE_DIRECTORY "${BINARY_DIR}")
  set(archive "${BINARY_DIR}/cistern-src.tar.gz")
  run_step(pack "${CMAKE_COMMAND}" -E chdir "${CISTERN_SOURCE_DIR}"
           "${CMAKE_COMMAND}" -E tar czf "${archive}" CMakeLists.txt LICENSE NOTICE cmake include src)
  file(SHA256 "${archive}" sha256)
  set(source "-DCISTERN_ARCHIVE=${archive}" "-DCISTERN_ARCHIVE_SHA256=${sha256}")
else()
  message(FATAL_ERROR "run.cmake: MODE is subdirectory or fetchcontent, not '${MODE}'")
endif()
run_step(configure "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}" -B "${BINARY_DIR}"
         -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
         ${source})
run_step(build "${CMAKE_COMMAND}" --build "${BINARY_DIR}")
run_step(run "${BINARY_DIR}/consumer")
