#pragma once
// What pull_auth "client" remembers (docs/security.md, "Private images (built)"): which
// repositories anonymous clients may pull, which credentials the upstream accepted for which
// repository, and which manifests and blobs belong to which repository. Only hashes of
// credentials are kept. Network-thread only (not thread-safe); the time is passed in, so tests
// use their own clock.

#include <chrono>
#include <cstddef>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "lib/core/digest.h"
#include "lib/upstream/credentials.h"

namespace shoal::agent {

// Lifetimes and bounds of the verdicts.
struct PullAuthOptions {
  std::chrono::seconds public_ttl{600};   // an anonymous pull worked: the repository is public
  std::chrono::seconds private_ttl{60};   // an anonymous pull was refused
  std::chrono::seconds granted_ttl{60};   // the upstream accepted these credentials here
  std::chrono::seconds refused_ttl{10};   // the upstream refused them
  size_t max_verdicts = 10'000;           // per kind (repositories, credential verdicts)
  size_t max_digests = 200'000;           // repository contents, over all repositories
};

// A repository-keyed verdict cache, bounded; see the file comment.
class PullAuthCache {
 public:
  using Clock = std::chrono::steady_clock;

  explicit PullAuthCache(PullAuthOptions options = {}) : options_(options) {}

  // Whether anonymous clients may pull `repo` ("registry/repository"): true (public), false
  // (private), nothing when unknown or expired.
  std::optional<bool> Public(const std::string& repo, Clock::time_point now) const;
  // The last anonymous verdict, expired or not (for when the upstream cannot be asked).
  std::optional<bool> LastPublic(const std::string& repo) const;
  // Remembers the anonymous verdict for public_ttl or private_ttl.
  void NotePublic(const std::string& repo, bool is_public, Clock::time_point now);

  // The upstream's verdict on the credentials with key `cred` (CredentialKey) for `repo`: true
  // (granted), false (refused), nothing when unknown or expired.
  std::optional<bool> Granted(const std::string& cred, const std::string& repo,
                              Clock::time_point now) const;
  // The last verdict on these credentials for repo, expired or not.
  std::optional<bool> LastGranted(const std::string& cred, const std::string& repo) const;
  // Remembers a verdict for granted_ttl or refused_ttl.
  void NoteGranted(const std::string& cred, const std::string& repo, bool granted,
                   Clock::time_point now);

  // Records that `digests` (manifests, configs, layers) belong to `repo`. When more than
  // max_digests are held, the repositories recorded longest ago are forgotten first.
  void NoteContents(const std::string& repo, const std::vector<Digest>& digests);
  // Whether `digest` was recorded for `repo`.
  bool Contains(const std::string& repo, const Digest& digest) const;

  // Entries held, for tests and the log: anonymous verdicts, credential verdicts, digests.
  size_t public_verdicts() const { return public_.size(); }
  size_t credential_verdicts() const { return granted_.size(); }
  size_t digests() const { return digest_count_; }

  // The key of a client's credentials: hex SHA-256 of "user\0password" (neither is kept).
  static std::string CredentialKey(const upstream::BasicAuth& auth);

 private:
  struct Verdict {
    bool yes = false;
    Clock::time_point expires;
  };
  // Inserts into a bounded map: expired entries go first, then the one expiring soonest.
  void Put(std::map<std::string, Verdict>& map, const std::string& key, Verdict v,
           Clock::time_point now);

  PullAuthOptions options_;
  std::map<std::string, Verdict> public_;   // key: repo
  std::map<std::string, Verdict> granted_;  // key: cred + " " + repo
  std::unordered_map<std::string, std::unordered_set<Digest>> contents_;  // key: repo
  std::deque<std::string> contents_order_;  // repositories by first record, oldest first
  size_t digest_count_ = 0;
};

}  // namespace shoal::agent
