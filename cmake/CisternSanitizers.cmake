# -DCISTERN_SANITIZE=address,undefined or -DCISTERN_SANITIZE=thread builds everything with sanitizers.
if(CISTERN_SANITIZE)
  if(CISTERN_SANITIZE MATCHES "thread" AND CISTERN_SANITIZE MATCHES "address")
    message(FATAL_ERROR "CISTERN_SANITIZE: thread cannot be combined with address")
  endif()
  set(_cistern_san_flags -fsanitize=${CISTERN_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_compile_options(${_cistern_san_flags})
  add_link_options(${_cistern_san_flags})
  message(STATUS "cistern: building with sanitizers: ${CISTERN_SANITIZE}")
endif()

# The fuzz build (-DCISTERN_BUILD_FUZZERS=ON) gives every library coverage counters, so that
# libFuzzer sees the readers' and the allocator's branches, not only the harness's. Objects so
# built need libFuzzer's runtime (or a sanitizer's) at link time: build only the fuzz targets
# there, or combine with -DCISTERN_SANITIZE=address,undefined.
if(CISTERN_BUILD_FUZZERS)
  add_compile_options(-fsanitize=fuzzer-no-link)
  message(STATUS "cistern: instrumenting every target for libFuzzer (fuzzer-no-link)")
endif()
