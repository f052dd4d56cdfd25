#include "agent/pull_auth.h"

#include "lib/core/sha256.h"

namespace shoal::agent {

std::optional<bool> PullAuthCache::Public(const std::string& repo, Clock::time_point now) const {
  auto it = public_.find(repo);
  if (it == public_.end() || now >= it->second.expires) return std::nullopt;
  return it->second.yes;
}

std::optional<bool> PullAuthCache::LastPublic(const std::string& repo) const {
  auto it = public_.find(repo);
  if (it == public_.end()) return std::nullopt;
  return it->second.yes;
}

std::optional<bool> PullAuthCache::LastGranted(const std::string& cred,
                                               const std::string& repo) const {
  auto it = granted_.find(cred + " " + repo);
  if (it == granted_.end()) return std::nullopt;
  return it->second.yes;
}

void PullAuthCache::NotePublic(const std::string& repo, bool is_public, Clock::time_point now) {
  Put(public_, repo,
      Verdict{is_public, now + (is_public ? options_.public_ttl : options_.private_ttl)}, now);
}

std::optional<bool> PullAuthCache::Granted(const std::string& cred, const std::string& repo,
                                           Clock::time_point now) const {
  auto it = granted_.find(cred + " " + repo);
  if (it == granted_.end() || now >= it->second.expires) return std::nullopt;
  return it->second.yes;
}

void PullAuthCache::NoteGranted(const std::string& cred, const std::string& repo, bool granted,
                                Clock::time_point now) {
  Put(granted_, cred + " " + repo,
      Verdict{granted, now + (granted ? options_.granted_ttl : options_.refused_ttl)}, now);
}

void PullAuthCache::Put(std::map<std::string, Verdict>& map, const std::string& key, Verdict v,
                        Clock::time_point now) {
  if (map.size() >= options_.max_verdicts && map.find(key) == map.end()) {
    for (auto it = map.begin(); it != map.end();) {
      it = now >= it->second.expires ? map.erase(it) : std::next(it);
    }
    while (!map.empty() && map.size() >= options_.max_verdicts) {
      auto soonest = map.begin();
      for (auto it = map.begin(); it != map.end(); ++it) {
        if (it->second.expires < soonest->second.expires) soonest = it;
      }
      map.erase(soonest);
    }
  }
  map[key] = v;
}

void PullAuthCache::NoteContents(const std::string& repo, const std::vector<Digest>& digests) {
  auto [it, fresh] = contents_.try_emplace(repo);
  if (fresh) contents_order_.push_back(repo);
  for (const auto& d : digests) {
    if (it->second.insert(d).second) ++digest_count_;
  }
  // Forget whole repositories, oldest first, but never the one just recorded.
  while (digest_count_ > options_.max_digests && contents_order_.size() > 1) {
    const std::string oldest = contents_order_.front();
    contents_order_.pop_front();
    if (oldest == repo) {
      contents_order_.push_back(oldest);
      continue;
    }
    auto old = contents_.find(oldest);
    if (old == contents_.end()) continue;
    digest_count_ -= old->second.size();
    contents_.erase(old);
  }
}

bool PullAuthCache::Contains(const std::string& repo, const Digest& digest) const {
  auto it = contents_.find(repo);
  return it != contents_.end() && it->second.count(digest) > 0;
}

std::string PullAuthCache::CredentialKey(const upstream::BasicAuth& auth) {
  Sha256 h;
  h.Update(auth.username.data(), auth.username.size());
  h.Update("", 1);
  h.Update(auth.password.data(), auth.password.size());
  return h.FinalHex();
}

}  // namespace shoal::agent
