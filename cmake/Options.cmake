# Every build option of adaps, in one place.
#
#   ADAPS_CUDA      AUTO (default): build the CUDA target when a toolkit is found.
#                   ON: build it, and fail at configure time when no toolkit is found.
#                   OFF: never build it.
#   ADAPS_CUDA_PTXAS_VERBOSE  OFF (default); ON: ptxas prints each kernel's registers, shared
#                   memory and spills (-Xptxas=-v) when it compiles adaps_cuda
#                   (bench/gpu-prepare.sh turns it on and fails on any spill).
#   ADAPS_SANITIZE  "" (default), "address,undefined" or "thread".
#   ADAPS_BUILD_TESTS   build the GoogleTest suites (ON).
#   ADAPS_BUILD_BENCH   build the Google Benchmark programs (ON).
#   ADAPS_NATIVE    tune for the build machine (-march=native); OFF keeps binaries portable.
#                   The hot loops dispatch to AVX2 at run time either way.

set(ADAPS_CUDA "AUTO" CACHE STRING "Build CUDA kernels: AUTO, ON or OFF")
set_property(CACHE ADAPS_CUDA PROPERTY STRINGS AUTO ON OFF)
option(ADAPS_CUDA_PTXAS_VERBOSE "ptxas resource usage of the CUDA kernels (-Xptxas=-v)" OFF)
set(ADAPS_SANITIZE "" CACHE STRING "Sanitizers: empty, address,undefined or thread")
option(ADAPS_BUILD_TESTS "Build tests" ON)
option(ADAPS_BUILD_BENCH "Build benchmarks" ON)
option(ADAPS_NATIVE "Compile with -march=native" OFF)
# The debug assertions (ADAPS_DCHECK_*, common/transport.h) run in Debug builds and in every
# build that has the tests, so the suites exercise them; they cost a thread-id comparison.
if(ADAPS_BUILD_TESTS OR CMAKE_BUILD_TYPE STREQUAL "Debug")
  add_compile_definitions(ADAPS_DCHECKS=1)
endif()
# ADAPS_FUZZ builds the libFuzzer binaries of tests/fuzz (needs clang); every build has the
# corpus replays as tests either way.
option(ADAPS_FUZZ "Build libFuzzer targets (clang only)" OFF)
if(ADAPS_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "ADAPS_FUZZ=ON needs clang (e.g. CXX=clang++-14)")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link,address,undefined>)
  add_link_options(-fsanitize=address,undefined)
  set(ADAPS_BUILD_BENCH OFF CACHE BOOL "" FORCE)
endif()

string(TOUPPER "${ADAPS_CUDA}" ADAPS_CUDA)
if(NOT ADAPS_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "ADAPS_CUDA must be AUTO, ON or OFF (got '${ADAPS_CUDA}')")
endif()

set(ADAPS_WITH_CUDA OFF)
if(NOT ADAPS_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(ADAPS_WITH_CUDA ON)
    message(STATUS "adaps: CUDA toolkit found (${CMAKE_CUDA_COMPILER}); building the CUDA target")
  elseif(ADAPS_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ADAPS_CUDA=ON but no CUDA toolkit was found "
                        "(looked for nvcc on PATH and in /usr/local/cuda/bin)")
  else()
    message(STATUS "adaps: no CUDA toolkit found; CUDA target not built")
  endif()
endif()

if(ADAPS_SANITIZE)
  if(ADAPS_SANITIZE STREQUAL "address,undefined" OR ADAPS_SANITIZE STREQUAL "undefined,address")
    set(_adaps_san_flags -fsanitize=address,undefined -fno-sanitize-recover=undefined
                         -fno-omit-frame-pointer)
  elseif(ADAPS_SANITIZE STREQUAL "thread")
    set(_adaps_san_flags -fsanitize=thread -fno-omit-frame-pointer)
  else()
    message(FATAL_ERROR "ADAPS_SANITIZE must be empty, 'address,undefined' or 'thread' "
                        "(got '${ADAPS_SANITIZE}')")
  endif()
  foreach(flag IN LISTS _adaps_san_flags)
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:${flag}>)
  endforeach()
  add_link_options(${_adaps_san_flags})
endif()

if(ADAPS_NATIVE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-march=native>)
endif()
