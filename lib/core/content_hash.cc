#include "lib/core/content_hash.h"

#include <openssl/evp.h>

namespace shoal {
namespace {

const EVP_MD* Md(DigestAlgorithm algorithm) {
  return algorithm == DigestAlgorithm::kSha512 ? EVP_sha512() : EVP_sha256();
}

}  // namespace

struct ContentHash::Ctx {
  EVP_MD_CTX* md = nullptr;
  ~Ctx() {
    if (md) EVP_MD_CTX_free(md);
  }
};

ContentHash::ContentHash(DigestAlgorithm algorithm)
    : algorithm_(algorithm), ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx_->md, Md(algorithm_), nullptr);
}

ContentHash::~ContentHash() = default;
ContentHash::ContentHash(ContentHash&&) noexcept = default;
ContentHash& ContentHash::operator=(ContentHash&&) noexcept = default;

void ContentHash::Update(const void* data, size_t size) { EVP_DigestUpdate(ctx_->md, data, size); }

Digest ContentHash::Final() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_->md, out, &len);
  EVP_DigestInit_ex(ctx_->md, Md(algorithm_), nullptr);
  static const char* kHex = "0123456789abcdef";
  std::string hex(len * 2, '0');
  for (unsigned i = 0; i < len; ++i) {
    hex[2 * i] = kHex[out[i] >> 4];
    hex[2 * i + 1] = kHex[out[i] & 15];
  }
  return Digest::FromHex(algorithm_, std::move(hex));
}

Digest ContentHash::Of(DigestAlgorithm algorithm, std::string_view data) {
  ContentHash h(algorithm);
  h.Update(data.data(), data.size());
  return h.Final();
}

}  // namespace shoal
