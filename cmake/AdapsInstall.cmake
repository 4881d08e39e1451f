# Installation of the worker library for external trainers, included from
# worker/CMakeLists.txt:
#   - adaps_worker_shared: libadaps_worker.so, the same sources as the static adaps_worker,
#     with the static internals (adaps_net, adaps_common, schemas) linked in and hidden
#     (--exclude-libs, cmake/adaps_worker.map), so only adaps::Worker and the C API are
#     exported.
#   - headers under include/adaps/, a CMake package (find_package(adaps) -> adaps::worker),
#     pkg-config file adaps.pc, and the executables adaps-scheduler/-server/-worker.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

add_library(adaps_worker_shared SHARED ${ADAPS_WORKER_SOURCES})
target_include_directories(adaps_worker_shared PRIVATE ${PROJECT_SOURCE_DIR})
target_include_directories(adaps_worker_shared PUBLIC
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/worker/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(adaps_worker_shared PUBLIC absl::status absl::statusor absl::time
                      absl::span absl::strings
                      PRIVATE adaps_net adaps_metrics)
adaps_worker_cuda(adaps_worker_shared)
target_link_options(adaps_worker_shared PRIVATE -Wl,--exclude-libs,ALL -Wl,--no-undefined
                    -Wl,--version-script=${PROJECT_SOURCE_DIR}/cmake/adaps_worker.map)
set_property(TARGET adaps_worker_shared APPEND PROPERTY LINK_DEPENDS
             ${PROJECT_SOURCE_DIR}/cmake/adaps_worker.map)
set_target_properties(adaps_worker_shared PROPERTIES
  OUTPUT_NAME adaps_worker
  EXPORT_NAME worker
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR})
adaps_set_warnings(adaps_worker_shared)
add_library(adaps::worker ALIAS adaps_worker_shared)

install(TARGETS adaps_worker_shared EXPORT adapsTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/worker/include/adaps/worker.h
              ${PROJECT_SOURCE_DIR}/worker/include/adaps/adaps_c.h
              ${PROJECT_SOURCE_DIR}/worker/include/adaps/local_steps.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/adaps)
install(TARGETS adaps-scheduler adaps-server adaps-worker adaps-keygen
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(ADAPS_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/adaps)
install(EXPORT adapsTargets NAMESPACE adaps:: DESTINATION ${ADAPS_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/adapsConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/adapsConfig.cmake INSTALL_DESTINATION ${ADAPS_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/adapsConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/adapsConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/adapsConfigVersion.cmake
        DESTINATION ${ADAPS_CMAKE_DIR})

# pkg-config: the prefix is found from the .pc file's own place, so `cmake --install
# --prefix` anywhere gives a working file.
file(RELATIVE_PATH ADAPS_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
configure_file(${PROJECT_SOURCE_DIR}/cmake/adaps.pc.in ${CMAKE_CURRENT_BINARY_DIR}/adaps.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/adaps.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
