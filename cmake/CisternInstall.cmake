# Installs the library, its public headers and a config package usable with
# find_package(cistern CONFIG).
include(CMakePackageConfigHelpers)

install(TARGETS cistern EXPORT cisternTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/cistern DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp")
install(EXPORT cisternTargets NAMESPACE cistern:: FILE cisternTargets.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cistern)
configure_package_config_file(cmake/cisternConfig.cmake.in
        ${PROJECT_BINARY_DIR}/cisternConfig.cmake
        INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cistern)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cisternConfigVersion.cmake
        COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cisternConfig.cmake ${PROJECT_BINARY_DIR}/cisternConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cistern)
