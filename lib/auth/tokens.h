#pragma once
// The cluster's bearer tokens. A server (the tracker) accepts any token listed in a token file
// for a role; a client (agent, shoalctl) presents the one in its token file. Both re-read their
// file when it changes, as a Kubernetes Secret volume is updated in place: tokens rotate without
// a restart (add the new one to the server's list, move the clients, drop the old one).
// Token file: one token per line, blank lines and lines starting with '#' ignored; a token is
// 16 to 512 printable non-space ASCII characters. Tokens are never logged.

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/error.h"

namespace shoal::auth {

// Every token in the file at path (at least one). Errors: kIo when unreadable,
// kInvalidArgument naming the file and the line (never the token) when a line is not a token.
Result<std::vector<std::string>> ReadTokens(const std::string& path);

// The key an agent puts in its announce URLs for token (libtorrent sends no headers):
// 32 hex characters of HMAC-SHA256(token, "shoal announce"). A leaked key admits announces and
// scrapes only, not the tracker's API.
std::string AnnounceKey(std::string_view token);

// A file's identity and version (device, inode, size, mtime), to notice a change.
struct FileStamp {
  uint64_t dev = 0, ino = 0, size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

// The token a client presents, from its file. Not thread-safe.
class ClientToken {
 public:
  // Reads path (its first token). Errors: as ReadTokens.
  static Result<ClientToken> Open(std::string path);
  // The token now: the file is checked again when `recheck` has passed since the last check; a
  // file that became invalid keeps the last good token (logged once).
  const std::string& Current(std::chrono::milliseconds recheck = std::chrono::seconds(2));
  // Bumped every time Current returned a new token.
  uint64_t generation() const { return generation_; }

 private:
  std::string path_;
  std::string token_;
  FileStamp stamp_;
  std::chrono::steady_clock::time_point checked_{};
  uint64_t generation_ = 0;
  bool warned_ = false;
};

// The tokens a server accepts for one role, kept as SHA-256 hashes and compared in constant
// time. Not thread-safe.
class TokenSet {
 public:
  // Reads path. Errors: as ReadTokens.
  static Result<TokenSet> Load(std::string path);
  // Whether token is one of the set.
  bool Accepts(std::string_view token) const;
  // Whether key is the AnnounceKey of one of the set.
  bool AcceptsAnnounceKey(std::string_view key) const;
  // Re-reads the file when it changed. A file that became unreadable or invalid keeps the old
  // set (logged). Returns whether the set changed.
  bool Reload();
  size_t size() const { return hashes_.size(); }
  // A 32-byte secret per token, in file order, derived alike on every host holding the file
  // (HMAC-SHA256 of a fixed label under the token): keys for MACs that every tracker replica
  // must verify, such as UDP connection ids. The first is the current token's.
  const std::vector<std::array<unsigned char, 32>>& derived_secrets() const { return derived_; }
  const std::string& path() const { return path_; }

 private:
  using Hash = std::array<unsigned char, 32>;
  void Take(std::vector<std::string> tokens);
  // Whether presented hashes to one of known (all compared, in constant time).
  static bool Matches(const std::vector<Hash>& known, std::string_view presented);

  std::string path_;
  FileStamp stamp_;
  std::vector<Hash> hashes_;
  std::vector<Hash> key_hashes_;  // SHA-256 of each token's announce key
  std::vector<Hash> derived_;     // derived_secrets()
};

}  // namespace shoal::auth
