#include "lib/auth/tokens.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <spdlog/spdlog.h>

namespace shoal::auth {
namespace {

constexpr size_t kMinToken = 16;
constexpr size_t kMaxToken = 512;
constexpr size_t kMaxFile = 64 * 1024;
constexpr std::string_view kAnnounceLabel = "shoal announce";

std::array<unsigned char, 32> HashOf(std::string_view s) {
  std::array<unsigned char, 32> out{};
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), out.data());
  return out;
}

FileStamp StampOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return FileStamp{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                   static_cast<uint64_t>(st.st_size),
                   static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

bool IsTokenChar(char c) { return c > 0x20 && c < 0x7f; }

}  // namespace

Result<std::vector<std::string>> ReadTokens(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return MakeError(ErrorCode::kIo, "token file " + path + " cannot be read");
  std::string text;
  text.resize(kMaxFile + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (in.bad()) return MakeError(ErrorCode::kIo, "token file " + path + " cannot be read");
  if (text.size() > kMaxFile) {
    return MakeError(ErrorCode::kInvalidArgument, "token file " + path + " is larger than " +
                                                      std::to_string(kMaxFile) + " bytes");
  }
  std::vector<std::string> tokens;
  std::istringstream lines(text);
  std::string line;
  for (size_t n = 1; std::getline(lines, line); ++n) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) {
      line.pop_back();
    }
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    std::string_view token = std::string_view(line).substr(start);
    std::string where = "token file " + path + " line " + std::to_string(n);
    if (!std::all_of(token.begin(), token.end(), IsTokenChar)) {
      return MakeError(ErrorCode::kInvalidArgument,
                       where + ": a token is printable ASCII without spaces");
    }
    if (token.size() < kMinToken || token.size() > kMaxToken) {
      return MakeError(ErrorCode::kInvalidArgument,
                       where + ": a token has " + std::to_string(kMinToken) + " to " +
                           std::to_string(kMaxToken) + " characters, this one " +
                           std::to_string(token.size()));
    }
    tokens.emplace_back(token);
  }
  if (tokens.empty()) {
    return MakeError(ErrorCode::kInvalidArgument, "token file " + path + " holds no token");
  }
  return tokens;
}

std::string AnnounceKey(std::string_view token) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(kAnnounceLabel.data()), kAnnounceLabel.size(), mac,
       &len);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < 16 && i < len; ++i) {
    out += kHex[mac[i] >> 4];
    out += kHex[mac[i] & 15];
  }
  return out;
}

Result<ClientToken> ClientToken::Open(std::string path) {
  ClientToken t;
  t.stamp_ = StampOf(path);
  auto tokens = ReadTokens(path);
  if (!tokens) return tokens.error();
  t.path_ = std::move(path);
  t.token_ = tokens.value().front();
  t.checked_ = std::chrono::steady_clock::now();
  return t;
}

const std::string& ClientToken::Current(std::chrono::milliseconds recheck) {
  auto now = std::chrono::steady_clock::now();
  if (now - checked_ < recheck) return token_;
  checked_ = now;
  FileStamp stamp = StampOf(path_);
  if (stamp == stamp_) return token_;
  auto tokens = ReadTokens(path_);
  if (!tokens) {
    if (!warned_) spdlog::warn("{}; still presenting the previous token", tokens.error().message);
    warned_ = true;
    return token_;
  }
  stamp_ = stamp;
  warned_ = false;
  if (tokens.value().front() != token_) {
    token_ = tokens.value().front();
    ++generation_;
    spdlog::info("token file {} changed: presenting its new token", path_);
  }
  return token_;
}

Result<TokenSet> TokenSet::Load(std::string path) {
  TokenSet set;
  set.stamp_ = StampOf(path);
  auto tokens = ReadTokens(path);
  if (!tokens) return tokens.error();
  set.path_ = std::move(path);
  set.Take(std::move(tokens.value()));
  return set;
}

void TokenSet::Take(std::vector<std::string> tokens) {
  hashes_.clear();
  key_hashes_.clear();
  derived_.clear();
  static constexpr std::string_view kDerivedLabel = "shoal derived secret v1";
  for (const std::string& t : tokens) {
    hashes_.push_back(HashOf(t));
    key_hashes_.push_back(HashOf(AnnounceKey(t)));
    Hash d{};
    unsigned int len = 0;
    HMAC(EVP_sha256(), t.data(), static_cast<int>(t.size()),
         reinterpret_cast<const unsigned char*>(kDerivedLabel.data()), kDerivedLabel.size(),
         d.data(), &len);
    derived_.push_back(d);
  }
  for (std::string& t : tokens) OPENSSL_cleanse(t.data(), t.size());
}

bool TokenSet::Matches(const std::vector<Hash>& known, std::string_view presented) {
  if (presented.empty()) return false;
  Hash h = HashOf(presented);
  bool found = false;
  // Every entry is compared (no early exit), each in constant time.
  for (const Hash& k : known) found |= CRYPTO_memcmp(h.data(), k.data(), h.size()) == 0;
  return found;
}

bool TokenSet::Accepts(std::string_view token) const { return Matches(hashes_, token); }

bool TokenSet::AcceptsAnnounceKey(std::string_view key) const { return Matches(key_hashes_, key); }

bool TokenSet::Reload() {
  FileStamp stamp = StampOf(path_);
  if (stamp == stamp_) return false;
  auto tokens = ReadTokens(path_);
  if (!tokens) {
    spdlog::error("{}; keeping the {} tokens read before", tokens.error().message, hashes_.size());
    stamp_ = stamp;  // said once per change of the file
    return false;
  }
  stamp_ = stamp;
  std::vector<Hash> before = hashes_;
  Take(std::move(tokens.value()));
  bool changed = before != hashes_;
  if (changed) spdlog::info("token file {} re-read: {} tokens", path_, hashes_.size());
  return changed;
}

}  // namespace shoal::auth
