// FP8REF_TEST_ASAN: 1 in a build under AddressSanitizer (`make sanitize`: clang's __has_feature, GCC's
// __SANITIZE_ADDRESS__), else 0. Tests that are slow under the sanitizer run a smaller but still complete sample
// there (the sanitizer checks memory, not values; the Release run keeps the full sample).
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define FP8REF_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FP8REF_TEST_ASAN 1
#endif
#endif
#ifndef FP8REF_TEST_ASAN
#define FP8REF_TEST_ASAN 0
#endif
