#include "lib/core/sha256.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <openssl/evp.h>

namespace shoal {

struct Sha256::Ctx {
  EVP_MD_CTX* md = nullptr;
};

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr);
}

Sha256::~Sha256() {
  if (ctx_ && ctx_->md) EVP_MD_CTX_free(ctx_->md);
}

Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::Update(const void* data, size_t size) { EVP_DigestUpdate(ctx_->md, data, size); }

std::string Sha256::FinalHex() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_->md, out, &len);
  EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr);
  static const char* kHex = "0123456789abcdef";
  std::string hex(len * 2, '0');
  for (unsigned i = 0; i < len; ++i) {
    hex[2 * i] = kHex[out[i] >> 4];
    hex[2 * i + 1] = kHex[out[i] & 15];
  }
  return hex;
}

Digest Sha256::Of(const void* data, size_t size) {
  Sha256 h;
  h.Update(data, size);
  return h.Final();
}

Result<Digest> Sha256File(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return MakeError(ErrorCode::kIo, "open " + path + ": " + std::strerror(errno));
  Sha256 h;
  std::vector<char> buf(1 << 20);
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      return MakeError(ErrorCode::kIo, "read " + path + ": " + std::strerror(e));
    }
    if (n == 0) break;
    h.Update(buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return h.Final();
}

}  // namespace shoal
