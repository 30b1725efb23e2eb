# Installs the library, its public headers and a config package usable with
# find_package(cistern CONFIG). The package is relocatable (every path is relative to the
# prefix) and names only what users need: cistern::cistern and Threads. Build-only
# dependencies (fmt, linked as $<BUILD_INTERFACE:...>) never appear in it; CI checks both by
# moving an installed prefix and building tests/consumer against it (.ci/run, step "consumer").
# The installed include directory comes from the target's $<INSTALL_INTERFACE:...> path.
include(CMakePackageConfigHelpers)

set(CISTERN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/cistern
    CACHE STRING "Where the config package is installed, relative to the prefix")

install(TARGETS cistern EXPORT cisternTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/cistern DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp")
install(EXPORT cisternTargets NAMESPACE cistern:: FILE cisternTargets.cmake
        DESTINATION ${CISTERN_INSTALL_CMAKEDIR})
configure_package_config_file(cmake/cisternConfig.cmake.in
        ${PROJECT_BINARY_DIR}/cisternConfig.cmake
        INSTALL_DESTINATION ${CISTERN_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cisternConfigVersion.cmake
        COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cisternConfig.cmake ${PROJECT_BINARY_DIR}/cisternConfigVersion.cmake
        DESTINATION ${CISTERN_INSTALL_CMAKEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE ${PROJECT_SOURCE_DIR}/NOTICE
        DESTINATION ${CMAKE_INSTALL_DOCDIR} OPTIONAL)
