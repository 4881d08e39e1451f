# Third-party dependencies, all from Debian 12 packages (see deploy/install-deps.sh).
find_package(Threads REQUIRED)
find_package(absl REQUIRED)
find_package(spdlog REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)
# FindPkgConfig (CMake 3.25) turns libzmq's "-isystem /usr/include/mit-krb5" into an include
# directory of PkgConfig::ZMQ on the configure that runs pkg-config, but into a compile option on
# every later configure (those build the target from the cache): the compile commands differ, so
# the second configure of a build directory (deploy/run-local.sh, then tests/run-all.sh) rebuilt
# everything. The target is set from the cached values, the same on every configure.
set_target_properties(PkgConfig::ZMQ PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "$CACHE{ZMQ_INCLUDE_DIRS}"
  INTERFACE_COMPILE_OPTIONS "$CACHE{ZMQ_CFLAGS_OTHER}")
find_package(cppzmq QUIET)
find_package(FlatBuffers QUIET)
find_program(FLATC flatc REQUIRED)
find_package(Eigen3 3.3 QUIET NO_MODULE)
# Live metrics (common/metrics.h): Debian's prometheus-cpp-dev, core + pull (the exposer).
find_package(prometheus-cpp REQUIRED COMPONENTS core pull)
if(ADAPS_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(ADAPS_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
