#include "lib/core/digest.h"

#include <algorithm>

namespace shoal {
namespace {

bool IsLowerHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// OCI image-spec: algorithm = component (separator component)*, component = [a-z0-9]+,
// separator = [+._-]; encoded = [a-zA-Z0-9=_-]+.
bool IsAlgorithm(std::string_view s) {
  if (s.empty()) return false;
  bool prev_sep = true;
  for (char c : s) {
    bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    bool sep = c == '+' || c == '.' || c == '_' || c == '-';
    if (!alnum && !sep) return false;
    if (sep && prev_sep) return false;
    prev_sep = sep;
  }
  return !prev_sep;
}

bool IsEncoded(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '=' ||
           c == '_' || c == '-';
  });
}

}  // namespace

std::string_view DigestAlgorithmName(DigestAlgorithm algorithm) {
  return algorithm == DigestAlgorithm::kSha512 ? "sha512" : "sha256";
}

Result<Digest> Digest::Parse(std::string_view text) {
  auto quoted = [&] { return "\"" + std::string(text.substr(0, 100)) + "\""; };
  auto colon = text.find(':');
  if (colon == std::string_view::npos) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "digest " + quoted() + " has no algorithm prefix (want sha256:<hex>)");
  }
  std::string_view algo = text.substr(0, colon);
  std::string_view enc = text.substr(colon + 1);
  if (!IsAlgorithm(algo) || !IsEncoded(enc)) {
    return MakeError(ErrorCode::kInvalidArgument, "digest " + quoted() + " is malformed");
  }
  DigestAlgorithm algorithm;
  size_t hex_length;
  if (algo == "sha256") {
    algorithm = DigestAlgorithm::kSha256;
    hex_length = 64;
  } else if (algo == "sha512") {
    algorithm = DigestAlgorithm::kSha512;
    hex_length = 128;
  } else {
    return MakeError(ErrorCode::kUnsupported, "digest algorithm \"" +
                                                  std::string(algo.substr(0, 20)) +
                                                  "\" is not supported (only sha256 and sha512)");
  }
  if (enc.size() != hex_length || !IsLowerHex(enc)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "digest " + quoted() + " must have " + std::to_string(hex_length) +
                         " lowercase hex characters after " + std::string(algo) + ":");
  }
  return Digest(algorithm, std::string(enc));
}

Digest Digest::FromSha256Hex(std::string hex) {
  return Digest(DigestAlgorithm::kSha256, std::move(hex));
}

Digest Digest::FromHex(DigestAlgorithm algorithm, std::string hex) {
  return Digest(algorithm, std::move(hex));
}

}  // namespace shoal
