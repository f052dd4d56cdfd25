#pragma once
// Content digests ("sha256:<64 hex>"), the identity of every blob and manifest shoal handles.

#include <compare>
#include <string>
#include <string_view>

#include "lib/core/error.h"

namespace shoal {

// A validated digest. Only sha256 is supported for content; other well-formed algorithms parse
// to kUnsupported so that the shim can answer precisely.
class Digest {
 public:
  // Parses "sha256:<64 lowercase hex>". Errors: kInvalidArgument for malformed text (with the
  // reason), kUnsupported for a well-formed digest of another algorithm (e.g. sha512).
  static Result<Digest> Parse(std::string_view text);
  // Wraps 64 lowercase hex characters already known to be valid (e.g. from Sha256::FinalHex).
  static Digest FromSha256Hex(std::string hex);

  const std::string& hex() const { return hex_; }
  std::string str() const { return "sha256:" + hex_; }

  auto operator<=>(const Digest&) const = default;

 private:
  explicit Digest(std::string hex) : hex_(std::move(hex)) {}
  std::string hex_;  // 64 lowercase hex characters
};

}  // namespace shoal

template <>
struct std::hash<shoal::Digest> {
  size_t operator()(const shoal::Digest& d) const noexcept {
    return std::hash<std::string>()(d.hex());
  }
};
