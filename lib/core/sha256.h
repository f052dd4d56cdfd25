#pragma once
// Incremental SHA-256 through OpenSSL's EVP interface (uses SHA-NI where the CPU has it).

#include <cstddef>
#include <memory>
#include <string>

#include "lib/core/digest.h"

namespace shoal {

// Not thread-safe; one hasher per stream.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;

  void Update(const void* data, size_t size);
  // Finishes the hash and returns its 64 lowercase hex characters. The hasher is then reset.
  std::string FinalHex();
  // FinalHex wrapped as a Digest.
  Digest Final() { return Digest::FromSha256Hex(FinalHex()); }

  // One-shot helper.
  static Digest Of(const void* data, size_t size);
  static Digest Of(const std::string& data) { return Of(data.data(), data.size()); }

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

// Hashes a whole file. Errors: kIo naming the path.
Result<Digest> Sha256File(const std::string& path);

}  // namespace shoal
