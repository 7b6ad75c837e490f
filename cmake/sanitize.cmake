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
  # Optimization: -O1 (the usual ASan setting) for everything, whatever the build type, except the Highway kernel
  # files (the sources that include hwy/foreach_target.h, compiled once per SIMD target, EMU128 included): with
  # ASan+UBSan, -O1 takes several minutes per such file (the unrolled, instrumented lane loops), -O0 ~20 s.
  set(FP8REF_SANITIZE_OPT -O1 CACHE STRING "Optimization flag of sanitized builds (empty: the build type's)")
  set(FP8REF_SANITIZE_SIMD_OPT -O0 CACHE STRING "Optimization flag of Highway kernel files in sanitized builds")
  if(FP8REF_SANITIZE_OPT)
    add_compile_options(${FP8REF_SANITIZE_OPT})
  endif()

  function(_fp8ref_sanitize_finish)
    # A consumer of the (static, instrumented) libraries must link the sanitizer runtimes.
    set_property(TARGET fp8ref_core APPEND PROPERTY INTERFACE_LINK_OPTIONS ${FP8REF_SANITIZE_FLAGS})
    # The exhaustive sweeps run in the normal build only: not built here unless asked for by name.
    if(TARGET fp8ref_exhaustive)
      set_property(TARGET fp8ref_exhaustive PROPERTY EXCLUDE_FROM_ALL ON)
    endif()
    if(FP8REF_SANITIZE_SIMD_OPT)
      foreach(target fp8ref fp8ref_core fp8ref_reference)
        get_target_property(sources ${target} SOURCES)
        foreach(src IN LISTS sources)
          file(STRINGS "${src}" hwy LIMIT_COUNT 1 REGEX "#include <hwy/foreach_target.h>")
          if(hwy)
            set_property(SOURCE "${src}" APPEND PROPERTY COMPILE_OPTIONS ${FP8REF_SANITIZE_SIMD_OPT})
          endif()
        endforeach()
      endforeach()
    endif()
  endfunction()
  cmake_language(DEFER CALL _fp8ref_sanitize_finish)  # at the end of the top-level directory: the targets exist

  message(STATUS "fp8ref: sanitizers on: ${FP8REF_SANITIZE_FLAGS}")
endif()
