#pragma once
// Why(r): r's error as text (its ToString(), else its message) for a check's message, or ""
// when r holds a value. Under doctest's -s (report successes) a *_MESSAGE's text is built for
// passing checks too, and .error() on a Result that holds a value terminates the test binary;
// Why(r) is safe either way.

#include <string>

namespace shoal {  // found by ADL through Result's Error

template <class R>
std::string Why(const R& r) {
  if (r.has_value()) return std::string();
  if constexpr (requires { r.error().ToString(); }) {
    return r.error().ToString();
  } else {
    return std::string(r.error().message);
  }
}

}  // namespace shoal
