#pragma once
// Invariant checks for fuzz targets. A failed check prints what broke and aborts, which both
// libFuzzer and the replay runner report as a crash with the input that caused it.

#include <cstdio>
#include <cstdlib>
#include <string_view>

// Aborts with the condition's text when cond is false. Works in every build type.
#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

namespace shoal::fuzz {

// True if every byte is printable ASCII: error messages may echo hostile input only escaped.
inline bool IsPrintable(std::string_view text) {
  for (char c : text) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace shoal::fuzz
