#include "tracker/manifests/manifest_cache.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "lib/core/content_hash.h"

namespace shoal::tracker {
namespace {

// Makes room in `map` for `key` (bounded by `max`): drops the entries past `ttl` first and, if
// none, an arbitrary one (a dropped entry only costs one more upstream request).
template <typename Map>
void MakeRoom(Map& map, const std::string& key, size_t max, TimePoint now,
              std::chrono::milliseconds ttl) {
  if (map.size() < max || map.find(key) != map.end()) return;
  std::erase_if(map, [&](const auto& e) { return now - e.second.fetched >= ttl; });
  if (map.size() >= max) map.erase(map.begin());
}

}  // namespace

std::string ManifestCache::ManifestKey(std::string_view registry, std::string_view repository,
                                       std::string_view reference, bool digest_ref) {
  std::string key;
  key.reserve(registry.size() + repository.size() + reference.size() + 2);
  key.append(registry).append("/").append(repository).append(digest_ref ? "@" : ":");
  key.append(reference);
  return key;
}

ManifestAnswer ManifestCache::Resolve(const std::string& key, const Digest* digest,
                                      const std::string& agent, TimePoint now) {
  ManifestAnswer answer;
  if (digest != nullptr) {
    if (auto found = Find(*digest)) {
      NoteUse(manifests_.at(*digest), key, now);
      answer.kind = ManifestAnswer::Kind::kFound;
      answer.manifest = std::move(found);
      return answer;
    }
  } else if (auto tag = tags_.find(key); tag != tags_.end()) {
    if (now - tag->second.fetched < options_.tag_ttl) {
      if (auto found = Find(tag->second.digest)) {
        NoteUse(manifests_.at(tag->second.digest), key, now);
        answer.kind = ManifestAnswer::Kind::kFound;
        answer.manifest = std::move(found);
        answer.age =
            std::chrono::duration_cast<std::chrono::milliseconds>(now - tag->second.fetched);
        return answer;
      }
    } else {
      tags_.erase(tag);
    }
  }
  if (auto m = missing_.find(key); m != missing_.end()) {
    if (now - m->second.fetched < options_.missing_ttl) {
      answer.kind = ManifestAnswer::Kind::kMissing;
      answer.missing = m->second.message;
      answer.age = std::chrono::duration_cast<std::chrono::milliseconds>(now - m->second.fetched);
      return answer;
    }
    missing_.erase(m);
  }
  auto lease = leases_.find(key);
  if (lease != leases_.end() && lease->second.agent != agent && now < lease->second.expires) {
    answer.kind = ManifestAnswer::Kind::kWait;
    answer.recheck_at = lease->second.expires;
    return answer;
  }
  answer.kind = ManifestAnswer::Kind::kFetch;
  answer.lease_ttl = options_.lease_ttl;
  if (lease != leases_.end()) {
    answer.took_over = lease->second.agent != agent;
    if (answer.took_over || lease->second.id.empty()) lease->second.id = NewLeaseId();
    lease->second.agent = agent;
    lease->second.expires = now + options_.lease_ttl;
    answer.lease_id = lease->second.id;
  } else if (leases_.size() < options_.max_leases) {
    answer.lease_id = NewLeaseId();
    leases_.emplace(key, Lease{agent, answer.lease_id, now + options_.lease_ttl});
  }
  // With max_leases reached the asker fetches without a lease (and cannot publish): no
  // single-flight, but never a request that waits on nobody.
  return answer;
}

std::string ManifestCache::NewLeaseId() { return fmt::format("{:016x}{:016x}", rng_(), rng_()); }

bool ManifestCache::Holds(const std::string& key, const std::string& agent,
                          const std::string& lease_id) const {
  auto lease = leases_.find(key);
  return lease != leases_.end() && !lease_id.empty() && lease->second.id == lease_id &&
         lease->second.agent == agent;
}

PublishErrc ManifestCache::Publish(const Digest& digest, std::string media_type, std::string body,
                                   const std::string& lease_key, bool is_tag,
                                   const std::string& agent, const std::string& lease_id,
                                   TimePoint now) {
  // Only the agent that holds the fetch lease may bind a tag (or store under a reference):
  // anybody else could otherwise point a victim's tag at their own image for every node.
  if (!Holds(lease_key, agent, lease_id)) return PublishErrc::kNotLeaseHolder;
  if (body.size() > options_.max_manifest_bytes) return PublishErrc::kTooLarge;
  if (body.empty() || media_type.empty() || media_type.size() > 256) return PublishErrc::kInvalid;
  // Agents verify what they get, but a cache that stores wrong bytes would make every node
  // fall back to upstream: check before storing.
  if (!ContentHash::Matches(digest, body)) return PublishErrc::kDigestMismatch;
  auto manifest = std::make_shared<CachedManifest>();
  manifest->digest = digest;
  manifest->media_type = std::move(media_type);
  manifest->body = std::move(body);
  Store(std::move(manifest), lease_key, now);
  if (is_tag && !lease_key.empty()) {
    MakeRoom(tags_, lease_key, options_.max_tags, now, options_.tag_ttl);
    tags_.insert_or_assign(lease_key, Tag{digest, now});
  }
  if (!lease_key.empty()) {
    leases_.erase(lease_key);
    missing_.erase(lease_key);
  }
  return PublishErrc::kOk;
}

bool ManifestCache::Release(const std::string& key, const std::string& agent,
                            const std::string& lease_id) {
  if (!Holds(key, agent, lease_id)) return false;
  leases_.erase(key);
  return true;
}

bool ManifestCache::ReleaseMissing(const std::string& key, const std::string& agent,
                                   const std::string& lease_id, std::string message,
                                   TimePoint now) {
  // Only the lease holder's "not found" is remembered: anybody's would make the cluster answer
  // 404 for an image that exists.
  bool dropped = Release(key, agent, lease_id);
  if (!dropped || options_.missing_ttl.count() <= 0) return dropped;
  MakeRoom(missing_, key, options_.max_tags, now, options_.missing_ttl);
  missing_.insert_or_assign(key, Missing{std::move(message), now});
  return dropped;
}

std::optional<std::pair<std::string, std::string>> ManifestCache::LeaseOf(
    const std::string& key) const {
  auto lease = leases_.find(key);
  if (lease == leases_.end()) return std::nullopt;
  return std::make_pair(lease->second.agent, lease->second.id);
}

std::shared_ptr<const CachedManifest> ManifestCache::Find(const Digest& digest) {
  auto it = manifests_.find(digest);
  if (it == manifests_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.manifest;
}

std::shared_ptr<const CachedManifest> ManifestCache::Peek(const Digest& digest) const {
  auto it = manifests_.find(digest);
  return it == manifests_.end() ? nullptr : it->second.manifest;
}

std::vector<RecentManifest> ManifestCache::Recent(size_t limit) const {
  std::vector<RecentManifest> out;
  for (auto it = lru_.begin(); it != lru_.end() && out.size() < limit; ++it) {
    const Entry& e = manifests_.at(*it);
    out.push_back(RecentManifest{e.manifest, e.keys, e.stored, e.last_used});
  }
  return out;
}

void ManifestCache::NoteUse(Entry& entry, const std::string& key, TimePoint now) {
  entry.last_used = now;
  if (key.empty()) return;
  auto& keys = entry.keys;
  auto it = std::find(keys.begin(), keys.end(), key);
  if (it != keys.end()) {
    std::rotate(keys.begin(), it, it + 1);
    return;
  }
  if (keys.size() == kKeysPerManifest) keys.pop_back();
  keys.insert(keys.begin(), key);
}

size_t ManifestCache::Sweep(TimePoint now) {
  size_t expired = std::erase_if(leases_, [&](const auto& l) { return now >= l.second.expires; });
  std::erase_if(tags_, [&](const auto& t) { return now - t.second.fetched >= options_.tag_ttl; });
  std::erase_if(missing_,
                [&](const auto& m) { return now - m.second.fetched >= options_.missing_ttl; });
  return expired;
}

ManifestTotals ManifestCache::totals() const {
  return ManifestTotals{manifests_.size(), bytes_, tags_.size(), leases_.size(), missing_.size()};
}

void ManifestCache::Store(std::shared_ptr<const CachedManifest> manifest, const std::string& key,
                          TimePoint now) {
  const Digest digest = manifest->digest;
  if (auto it = manifests_.find(digest); it != manifests_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);  // same digest, same bytes
    NoteUse(it->second, key, now);
    return;
  }
  bytes_ += manifest->body.size();
  lru_.push_front(digest);
  auto stored = manifests_.emplace(digest, Entry{std::move(manifest), lru_.begin(), {}, now, now});
  NoteUse(stored.first->second, key, now);
  EvictOverBounds();
}

void ManifestCache::EvictOverBounds() {
  // The newest entry (front) is never evicted: it was stored because an agent needs it now.
  while (lru_.size() > 1 &&
         (manifests_.size() > options_.max_manifests || bytes_ > options_.max_bytes)) {
    const Digest& victim = lru_.back();
    auto it = manifests_.find(victim);
    bytes_ -= it->second.manifest->body.size();
    manifests_.erase(it);
    lru_.pop_back();
  }
}

}  // namespace shoal::tracker
