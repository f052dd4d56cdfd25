#pragma once
// Content digests ("sha256:<64 hex>", "sha512:<128 hex>"), the identity of every blob and
// manifest shoal handles.

#include <compare>
#include <string>
#include <string_view>

#include "lib/core/error.h"

namespace shoal {

// The hash functions of the OCI image spec's registered algorithms.
enum class DigestAlgorithm { kSha256, kSha512 };

// "sha256" or "sha512", as written before the ":" of a digest.
std::string_view DigestAlgorithmName(DigestAlgorithm algorithm);

// A validated digest of a registered algorithm (sha256 or sha512); others parse to kUnsupported
// so that the shim can answer precisely.
class Digest {
 public:
  // Parses "sha256:<64 lowercase hex>" or "sha512:<128 lowercase hex>". Errors:
  // kInvalidArgument for malformed text (with the reason), kUnsupported for a well-formed digest
  // of another algorithm (e.g. md5).
  static Result<Digest> Parse(std::string_view text);
  // Wraps 64 lowercase hex characters already known to be valid (e.g. from Sha256::FinalHex).
  static Digest FromSha256Hex(std::string hex);
  // Wraps hex characters of the algorithm's length already known to be valid.
  static Digest FromHex(DigestAlgorithm algorithm, std::string hex);

  DigestAlgorithm algorithm() const { return algorithm_; }
  // The encoded part after the ":" (lowercase hex).
  const std::string& hex() const { return hex_; }
  std::string str() const { return std::string(DigestAlgorithmName(algorithm_)) + ":" + hex_; }

  auto operator<=>(const Digest&) const = default;

 private:
  Digest(DigestAlgorithm algorithm, std::string hex)
      : algorithm_(algorithm), hex_(std::move(hex)) {}
  DigestAlgorithm algorithm_;
  std::string hex_;  // 64 (sha256) or 128 (sha512) lowercase hex characters
};

}  // namespace shoal

template <>
struct std::hash<shoal::Digest> {
  size_t operator()(const shoal::Digest& d) const noexcept {
    return std::hash<std::string>()(d.hex());
  }
};
