#pragma once
// Incremental hashing in a digest's own algorithm (SHA-256 or SHA-512) through OpenSSL's EVP
// interface: what verifies blobs and manifests named by a digest of either algorithm.

#include <cstddef>
#include <memory>
#include <string_view>

#include "lib/core/digest.h"

namespace shoal {

// Not thread-safe; one hasher per stream.
class ContentHash {
 public:
  explicit ContentHash(DigestAlgorithm algorithm = DigestAlgorithm::kSha256);
  ~ContentHash();
  ContentHash(ContentHash&&) noexcept;
  ContentHash& operator=(ContentHash&&) noexcept;

  DigestAlgorithm algorithm() const { return algorithm_; }
  void Update(const void* data, size_t size);
  // Finishes the hash and returns it as a digest of this algorithm. The hasher is then reset.
  Digest Final();

  // One-shot: the digest of data in the given algorithm.
  static Digest Of(DigestAlgorithm algorithm, std::string_view data);
  // Whether data hashes to digest, in digest's own algorithm.
  static bool Matches(const Digest& digest, std::string_view data) {
    return Of(digest.algorithm(), data) == digest;
  }

 private:
  struct Ctx;
  DigestAlgorithm algorithm_;
  std::unique_ptr<Ctx> ctx_;
};

}  // namespace shoal
