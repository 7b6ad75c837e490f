# fp8ref — sanitizer and fuzzing builds (issue 3, "Tests"). Included by the top-level CMakeLists.txt after the
# options and before find_package() and any target, so that the flags below reach every target of the project.
#
#   FP8REF_SANITIZE=ON   everything is compiled and linked with AddressSanitizer + UndefinedBehaviorSanitizer,
#                        and the first UB report is fatal (-fno-sanitize-recover). Works with g++ and clang++.
#   FP8REF_FUZZ=ON       clang++ only; implies FP8REF_SANITIZE. Everything is also compiled with
#                        -fsanitize=fuzzer-no-link (coverage for libFuzzer), and tests/fuzz builds one libFuzzer
#                        target per reader with ctest tests fuzz_<target> (label "fuzz").
#
# OpenMP: with clang++ the project uses clang's own runtime (libomp, Debian package libomp-dev), which works under
# ASan; the parallel regions really run in parallel under the sanitizers. (clang's -fopenmp=libgomp would compile
# every `#pragma omp` away.) libdnnl still brings GCC's libgomp into the process for its own threads.
#
# The static libraries need the sanitizer runtimes at link time, so the sanitizer link flags are also put on the
# exported fp8ref_core target (INTERFACE_LINK_OPTIONS): a find_package(fp8ref) consumer of a sanitized install
# links them too (and must use the same compiler).

set(FP8REF_SANITIZE_ACTIVE OFF)
set(FP8REF_SANITIZE_FLAGS "")
if(FP8REF_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "FP8REF_FUZZ=ON needs clang++ (libFuzzer); this is ${CMAKE_CXX_COMPILER_ID} "
                        "${CMAKE_CXX_COMPILER}. Configure a fresh build directory with CC=clang CXX=clang++.")
  endif()
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_FLAGS "-fsanitize=fuzzer,address,undefined")
  check_cxx_source_compiles([[
    #include <cstddef>
    #include <cstdint>
    extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }]] FP8REF_HAVE_LIBFUZZER)
  unset(CMAKE_REQUIRED_FLAGS)
  if(NOT FP8REF_HAVE_LIBFUZZER)
    message(FATAL_ERROR "FP8REF_FUZZ=ON: ${CMAKE_CXX_COMPILER} cannot link -fsanitize=fuzzer "
                        "(on Debian: apt-get install libclang-rt-14-dev)")
  endif()
endif()

if(FP8REF_SANITIZE OR FP8REF_FUZZ)
  set(FP8REF_SANITIZE_ACTIVE ON)
  set(FP8REF_SANITIZE_FLAGS -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_compile_options(${FP8REF_SANITIZE_FLAGS})
  add_link_options(${FP8REF_SANITIZE_FLAGS})
  if(FP8REF_FUZZ)
    add_compile_options(-fsanitize=fuzzer-no-link)
  endif()
  add_compile_options(-g1)  # line tables: file:line in the reports
  # Highway's portable fallback target (EMU128) emulates each vector op lane by lane; under ASan+UBSan the
  # instrumented, unrolled lane loops take minutes to compile per kernel file. No x86 CPU that runs this build
  # dispatches to it, so sanitized x86 builds assume x86-64-v2 (SSE4.2, no FMA: the numerics do not change),
  # which leaves EMU128 out of the compiled targets; SSE4, AVX2 and AVX3 are still compiled and dispatched.
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    add_compile_options(-march=x86-64-v2)
  endif()

  function(_fp8ref_sanitize_export)
    set_property(TARGET fp8ref_core APPEND PROPERTY INTERFACE_LINK_OPTIONS ${FP8REF_SANITIZE_FLAGS})
  endfunction()
  cmake_language(DEFER CALL _fp8ref_sanitize_export)  # at the end of the top-level directory: the target exists

  message(STATUS "fp8ref: sanitizers on: ${FP8REF_SANITIZE_FLAGS}")
endif()
