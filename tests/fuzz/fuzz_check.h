#pragma once
// Invariant checks for fuzz targets. A failed check prints what broke and aborts, which both
// libFuzzer and the replay runner report as a crash with the input that caused it.

#include <cstdio>
#include <cstdlib>
#include <string>
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

// Replaces every `from` in text with `to`, left to right, never inside what it put in (seeds use
// placeholders such as "@KEY@" for values a target makes at start).
inline void ReplaceAll(std::string& text, std::string_view from, std::string_view to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
}

// A fresh directory /tmp/<prefix>-XXXXXX for a target's files (token files); aborts on failure.
inline std::string MakeTempDir(std::string_view prefix) {
  std::string tmpl = "/tmp/" + std::string(prefix) + "-XXXXXX";
  const char* dir = ::mkdtemp(tmpl.data());
  FUZZ_CHECK(dir != nullptr);
  return dir;
}

// True if every byte is printable ASCII: error messages may echo hostile input only escaped.
inline bool IsPrintable(std::string_view text) {
  for (char c : text) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace shoal::fuzz
