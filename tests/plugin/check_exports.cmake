# Checks that the plug-in library exports exactly the functions plugin.h declares, nothing more
# (hidden visibility and the version script keep the cistern library and its C++ symbols local).
#   cmake -DLIBRARY=libcistern_plugin.so -DHEADER=include/cistern/plugin.h -DNM=nm -P check_exports.cmake
execute_process(COMMAND ${NM} -D --defined-only ${LIBRARY} OUTPUT_VARIABLE nm_output
                RESULT_VARIABLE nm_result)
if(NOT nm_result EQUAL 0)
  message(FATAL_ERROR "${NM} -D failed on ${LIBRARY}")
endif()
string(REGEX MATCHALL "[0-9a-fA-F]+ [A-Za-z] [^\n]+" lines "${nm_output}")
set(exported "")
foreach(line IN LISTS lines)
  string(REGEX REPLACE "^[0-9a-fA-F]+ [A-Za-z] " "" symbol "${line}")
  list(APPEND exported "${symbol}")
endforeach()
list(SORT exported)

file(READ ${HEADER} header)
string(REGEX MATCHALL "CISTERN_PLUGIN_API [^;(]*[ *](cistern_[a-z_]+)\\(" declarations "${header}")
set(declared "")
foreach(declaration IN LISTS declarations)
  string(REGEX REPLACE ".*[ *](cistern_[a-z_]+)\\($" "\\1" name "${declaration}")
  list(APPEND declared "${name}")
endforeach()
list(SORT declared)
list(LENGTH declared count)

if(NOT exported STREQUAL declared)
  message(FATAL_ERROR "exported symbols differ from plugin.h\n  exported: ${exported}\n"
                      "  declared: ${declared}")
endif()
if(count LESS 20)
  message(FATAL_ERROR "only ${count} declarations found in ${HEADER}: the pattern is stale")
endif()
message(STATUS "${count} symbols exported, exactly those of plugin.h")
