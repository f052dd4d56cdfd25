#include "tracker/blobs/blob_table.h"

#include <algorithm>
#include <bit>
#include <iterator>
#include <optional>

#include <fmt/format.h>

namespace shoal::tracker {
namespace {

BlobError Fail(BlobErrc code, std::string message) { return BlobError{code, std::move(message)}; }

std::string ChunkName(const Digest& digest, uint32_t k) {
  return "chunk " + std::to_string(k) + " of " + digest.str();
}

}  // namespace

std::string_view ChunkStateName(ChunkState state) {
  switch (state) {
    case ChunkState::kNone:
      return "none";
    case ChunkState::kLeased:
      return "leased";
    case ChunkState::kReady:
      return "ready";
  }
  return "none";
}

std::string_view WaitReasonName(WaitReason reason) {
  switch (reason) {
    case WaitReason::kLeased:
      return "leased";
    case WaitReason::kClusterCap:
      return "cluster_cap";
    case WaitReason::kAgentCap:
      return "agent_cap";
    case WaitReason::kBlobCap:
      return "blob_cap";
    case WaitReason::kUnleased:
      return "unleased";
    case WaitReason::kHeadStart:
      return "head_start";
  }
  return "leased";
}

BlobTable::BlobTable(BlobTableOptions options, uint64_t seed)
    : options_(std::move(options)), rng_(seed) {
  options_.max_blobs = std::max<size_t>(options_.max_blobs, 1);
  options_.max_chunks_per_blob = std::max<uint32_t>(options_.max_chunks_per_blob, 1);
  options_.max_chunks = std::max<size_t>(options_.max_chunks, options_.max_chunks_per_blob);
  options_.max_upstream_fetchers = std::max<uint32_t>(options_.max_upstream_fetchers, 1);
  if (options_.base_upstream_fetchers == 0)
    options_.base_upstream_fetchers = options_.max_upstream_fetchers;
  options_.base_upstream_fetchers =
      std::min(options_.base_upstream_fetchers, options_.max_upstream_fetchers);
  limit_ = options_.base_upstream_fetchers;
}

uint32_t BlobTable::blob_lease_limit() const {
  const uint64_t scaled =
      uint64_t{options_.max_leases_per_blob} * limit_ / options_.base_upstream_fetchers;
  return static_cast<uint32_t>(
      std::min<uint64_t>(std::max<uint64_t>(scaled, options_.max_leases_per_blob), limit_));
}

void BlobTable::Adapt(const Blob& blob, uint32_t k, const LeaseRecord& lease, TimePoint now) {
  const uint64_t length = blob.layout.chunk_length(k);
  // Ramp chunks and a blob's short last chunk are mostly the registry's latency: they say
  // little about the link.
  if (options_.fast_lease_rate == 0 || length < blob.layout.chunk_size) return;
  const double seconds = std::max(std::chrono::duration<double>(now - lease.granted).count(), 1e-3);
  // A dead band between half the rate and the rate: many leases end at about the same time, and
  // lowering the limit for every one just below the rate made it swing between the base and
  // the max (shoal-sim, 250 nodes at 10 Gbit/s).
  const double rate = static_cast<double>(length) / seconds;
  const auto fast = static_cast<double>(options_.fast_lease_rate);
  if (rate >= fast) {
    limit_ = std::min(limit_ + 1, options_.max_upstream_fetchers);
  } else if (rate < fast / 2) {
    limit_ = std::max(limit_ - 1, options_.base_upstream_fetchers);
  }
}

BlobResult<swarm::ChunkLayout> BlobTable::LayoutFor(uint64_t size) const {
  swarm::ChunkLayout layout{size, options_.chunk_size, options_.piece_size, 0};
  if (options_.target_chunks > 0 && options_.min_chunk_size < layout.chunk_size) {
    // Rounded down, so the blob has at least target_chunks full chunks (rounding up, as this did
    // until session 6, gave a 256.3 MiB layer 4 MiB chunks where 2 MiB were meant).
    uint64_t want = std::bit_floor(std::max<uint64_t>(size / options_.target_chunks, 1));
    want = std::max(want, options_.min_chunk_size);
    if (want < layout.chunk_size) {
      layout.chunk_size = want;
      layout.piece_size = static_cast<uint32_t>(std::min<uint64_t>(
          options_.piece_size, std::max<uint64_t>(uint64_t{16} << 10, want / 8)));
    }
  }
  if (options_.first_chunk_size < layout.chunk_size)
    layout.first_chunk_size = options_.first_chunk_size;
  Status valid = layout.Validate();
  if (!valid) {
    return Fail(BlobErrc::kInvalid, "blob size " + std::to_string(size) +
                                        " does not fit the chunk layout: " + valid.error().message);
  }
  if (layout.chunk_count() > options_.max_chunks_per_blob) {
    return Fail(
        BlobErrc::kInvalid,
        fmt::format("blob size {} needs {} chunks of {} bytes, more than this tracker's "
                    "limit of {} per blob",
                    size, layout.chunk_count(), layout.chunk_size, options_.max_chunks_per_blob));
  }
  return layout;
}

BlobResult<BlobView> BlobTable::Ensure(const Digest& digest, const BlobSource& source,
                                       TimePoint now) {
  ExpireLeases(now);
  auto blob = EnsureBlob(digest, source, now);
  if (!blob) return blob.error();
  return ViewOf(*blob.value());
}

BlobResult<BlobView> BlobTable::Find(const Digest& digest, TimePoint now) {
  ExpireLeases(now);
  Blob* blob = Touch(digest);
  if (blob == nullptr) {
    return Fail(BlobErrc::kNotFound, "blob " + digest.str() + " is not known to this tracker");
  }
  return ViewOf(*blob);
}

BlobResult<LeaseAnswer> BlobTable::Lease(const Digest& digest, uint32_t k, std::string_view agent,
                                         const BlobSource& source, TimePoint now, bool may_grant) {
  ExpireLeases(now);
  auto checked = CheckChunk(digest, source, k);
  if (!checked) return checked.error();
  auto ensured = EnsureBlob(digest, source, now);
  if (!ensured) return ensured.error();
  Blob& blob = *ensured.value();
  Chunk& chunk = blob.chunks[k];

  LeaseAnswer answer;
  answer.layout = blob.layout;
  answer.chunk = k;
  if (KeepReady(digest, blob, chunk)) {
    answer.kind = LeaseAnswer::Kind::kReady;
    answer.published = chunk.published;
    return answer;
  }
  auto grant = [&](const LeaseRecord& lease) { return Granted(answer, blob, k, lease); };
  auto wait = [&](WaitReason reason, TimePoint at) { return Waiting(answer, reason, at); };
  if (!may_grant) {
    if (chunk.lease) return wait(WaitReason::kLeased, chunk.lease->expiry->first);
    return wait(WaitReason::kUnleased, TimePoint::max());
  }
  if (chunk.lease) {
    if (chunk.lease->agent == agent) {
      // The agent asks again for what it holds (a retried request, a restarted fetch).
      SetExpiry(digest, k, *chunk.lease, now + options_.lease_ttl);
      return grant(*chunk.lease);
    }
    return wait(WaitReason::kLeased, chunk.lease->expiry->first);
  }
  // A freed slot anywhere can change a cap answer, so a waiter re-checks at the first expiry.
  TimePoint first_expiry = expiries_.empty() ? TimePoint::max() : expiries_.begin()->first;
  std::string agent_key(agent);
  auto held = agent_leases_.find(agent_key);
  if (held != agent_leases_.end() && held->second >= options_.max_leases_per_agent) {
    return wait(WaitReason::kAgentCap, first_expiry);
  }
  if (totals_.leases >= limit_) return wait(WaitReason::kClusterCap, first_expiry);
  if (blob.leases >= blob_lease_limit()) return wait(WaitReason::kBlobCap, first_expiry);
  if (auto until = HeadStartUntil(blob, k, now)) return wait(WaitReason::kHeadStart, *until);
  return grant(Grant(digest, blob, k, agent, now));
}

std::optional<TimePoint> BlobTable::HeadStartUntil(const Blob& blob, uint32_t k,
                                                   TimePoint now) const {
  if (k == 0 || options_.head_start.count() <= 0) return std::nullopt;
  const Chunk& first = blob.chunks[0];
  if (!first.lease || first.published) return std::nullopt;
  TimePoint until = first.lease->granted + options_.head_start;
  if (now >= until) return std::nullopt;
  return until;
}

LeaseAnswer BlobTable::Granted(LeaseAnswer answer, const Blob& blob, uint32_t k,
                               const LeaseRecord& lease) const {
  answer.kind = LeaseAnswer::Kind::kGranted;
  answer.chunk = k;
  answer.lease_id = lease.id;
  answer.ttl = options_.lease_ttl;
  answer.begin = blob.layout.chunk_begin(k);
  answer.length = blob.layout.chunk_length(k);
  return answer;
}

LeaseAnswer BlobTable::Waiting(LeaseAnswer answer, WaitReason reason, TimePoint recheck_at) const {
  answer.kind = LeaseAnswer::Kind::kWait;
  answer.reason = reason;
  answer.retry_after = options_.retry_after;
  answer.recheck_at = recheck_at;
  return answer;
}

BlobTable::LeaseRecord& BlobTable::Grant(const Digest& digest, Blob& blob, uint32_t k,
                                         std::string_view agent, TimePoint now) {
  Chunk& chunk = blob.chunks[k];
  chunk.lease = std::make_unique<LeaseRecord>();
  chunk.lease->id = NewLeaseId();
  chunk.lease->agent = std::string(agent);
  chunk.lease->granted = now;
  chunk.lease->expiry = expiries_.emplace(now + options_.lease_ttl, LeaseKey{digest, k});
  ++agent_leases_[chunk.lease->agent];
  ++blob.leases;
  ++totals_.leases;
  Emit(BlobEvent::kGranted, digest);
  return *chunk.lease;
}

BlobResult<LeaseAnswer> BlobTable::Work(const Digest& digest, std::string_view agent,
                                        const BlobSource& source, TimePoint now) {
  ExpireLeases(now);
  auto ensured = EnsureBlob(digest, source, now);
  if (!ensured) return ensured.error();
  Blob& blob = *ensured.value();
  LeaseAnswer answer;
  answer.layout = blob.layout;
  auto grant = [&](uint32_t k, const LeaseRecord& lease) {
    return Granted(answer, blob, k, lease);
  };
  auto wait = [&](WaitReason reason, TimePoint at) { return Waiting(answer, reason, at); };
  for (Chunk& chunk : blob.chunks) KeepReady(digest, blob, chunk);
  if (blob.ready == blob.chunks.size()) {
    answer.kind = LeaseAnswer::Kind::kDone;
    return answer;
  }
  // One pass: the agent's own lease, the lowest free chunk, the earliest expiry on this blob.
  std::optional<uint32_t> free;
  TimePoint blob_expiry = TimePoint::max();
  for (uint32_t k = 0; k < blob.chunks.size(); ++k) {
    Chunk& chunk = blob.chunks[k];
    if (chunk.lease) {
      if (chunk.lease->agent == agent) {
        SetExpiry(digest, k, *chunk.lease, now + options_.lease_ttl);
        return grant(k, *chunk.lease);
      }
      blob_expiry = std::min(blob_expiry, chunk.lease->expiry->first);
    } else if (!chunk.published && !free) {
      free = k;
    }
  }
  TimePoint first_expiry = expiries_.empty() ? TimePoint::max() : expiries_.begin()->first;
  auto held = agent_leases_.find(std::string(agent));
  if (held != agent_leases_.end() && held->second >= options_.max_leases_per_agent) {
    return wait(WaitReason::kAgentCap, first_expiry);
  }
  if (totals_.leases >= limit_) return wait(WaitReason::kClusterCap, first_expiry);
  if (blob.leases >= blob_lease_limit()) return wait(WaitReason::kBlobCap, blob_expiry);
  if (!free) return wait(WaitReason::kLeased, blob_expiry);
  if (auto until = HeadStartUntil(blob, *free, now)) return wait(WaitReason::kHeadStart, *until);
  return grant(*free, Grant(digest, blob, *free, agent, now));
}

BlobResult<std::chrono::milliseconds> BlobTable::Renew(const Digest& digest, uint32_t k,
                                                       std::string_view agent,
                                                       std::string_view lease_id, uint64_t bytes,
                                                       TimePoint now) {
  ExpireLeases(now);
  Blob* blob = Touch(digest);
  if (blob == nullptr) {
    return Fail(BlobErrc::kConflict, "lease lost: this tracker has no table for " + digest.str() +
                                         " (it restarted, or the lease expired and the table "
                                         "was evicted)");
  }
  auto found = ChunkOf(digest, *blob, k);
  if (!found) return found.error();
  Chunk& chunk = *found.value();
  if (!chunk.lease) {
    if (chunk.published) {
      return Fail(BlobErrc::kConflict, "lease lost: " + ChunkName(digest, k) +
                                           " is ready (published by agent \"" +
                                           chunk.published->agent + "\")");
    }
    return Fail(BlobErrc::kConflict,
                "lease lost: " + ChunkName(digest, k) + " has no live lease (it expired)");
  }
  if (chunk.lease->id != lease_id) {
    return Fail(BlobErrc::kConflict, "lease lost: " + ChunkName(digest, k) +
                                         " was leased again (to agent \"" + chunk.lease->agent +
                                         "\") after lease " + std::string(lease_id) + " expired");
  }
  if (chunk.lease->agent != agent) {
    return Fail(BlobErrc::kConflict, "lease lost: lease " + std::string(lease_id) + " of " +
                                         ChunkName(digest, k) + " is held by agent \"" +
                                         chunk.lease->agent + "\", not \"" + std::string(agent) +
                                         "\"");
  }
  SetExpiry(digest, k, *chunk.lease, now + options_.lease_ttl);
  chunk.lease->bytes = bytes;
  return options_.lease_ttl;
}

BlobResult<PublishAnswer> BlobTable::Publish(const Digest& digest, uint32_t k,
                                             std::string_view agent, std::string_view lease_id,
                                             const BlobSource& source, std::string_view metainfo,
                                             TimePoint now) {
  ExpireLeases(now);
  // Validate everything before creating a table, so a bad request leaves no trace.
  auto checked = CheckChunk(digest, source, k);
  if (!checked) return checked.error();
  const swarm::ChunkLayout& layout = checked.value();
  auto parsed = swarm::ParseChunkTorrent(metainfo, layout.chunk_length(k), layout.piece_size_of(k),
                                         options_.root_cert);
  if (!parsed) {
    return Fail(BlobErrc::kInvalid,
                "metainfo of " + ChunkName(digest, k) + ": " + parsed.error().message);
  }
  auto ensured = EnsureBlob(digest, source, now);
  if (!ensured) return ensured.error();
  Blob& blob = *ensured.value();
  Chunk& chunk = blob.chunks[k];

  if (chunk.lease && chunk.lease->id != lease_id) {
    // Only the lease holder publishes a leased chunk: anybody else could otherwise end its
    // fetch and put their own torrent in its place.
    return Fail(BlobErrc::kForbidden, ChunkName(digest, k) + " is leased to agent \"" +
                                          chunk.lease->agent +
                                          "\": only the lease holder may publish it");
  }
  PublishAnswer answer;
  if (chunk.published) {
    // First publication wins: peers may already be downloading that torrent.
    answer.kept_existing = chunk.published->info_hash != parsed.value().info_hash;
    answer.published = chunk.published;
    return answer;
  }
  auto published = std::make_shared<PublishedChunk>();
  published->metainfo = std::move(parsed.value().metainfo);
  published->info_hash = parsed.value().info_hash;
  published->agent = std::string(agent);
  published->published_at = now;
  chunk.published = published;
  ++blob.ready;
  ++totals_.ready;
  if (blob.ready == blob.chunks.size() && !blob.completed) blob.completed = now;
  if (chunk.lease) {
    answer.released_lease = !lease_id.empty() && chunk.lease->id == lease_id;
    if (answer.released_lease) {
      // The holder fetched it from upstream: the bytes crossed the NAT once.
      blob.upstream_bytes += blob.layout.chunk_length(k);
      totals_.upstream_bytes += blob.layout.chunk_length(k);
      Adapt(blob, k, *chunk.lease, now);
    }
    EndLease(digest, blob, chunk, BlobEvent::kReleased);
  }
  Emit(BlobEvent::kPublished, digest);
  answer.newly_ready = true;
  answer.published = std::move(published);
  return answer;
}

BlobResult<void> BlobTable::Release(const Digest& digest, uint32_t k, std::string_view agent,
                                    std::string_view lease_id, TimePoint now) {
  ExpireLeases(now);
  Blob* blob = Touch(digest);
  if (blob == nullptr) {
    return Fail(BlobErrc::kConflict, "agent \"" + std::string(agent) + "\" holds no lease on " +
                                         digest.str() + ": this tracker has no table for it");
  }
  auto found = ChunkOf(digest, *blob, k);
  if (!found) return found.error();
  Chunk& chunk = *found.value();
  if (!chunk.lease || chunk.lease->id != lease_id || chunk.lease->agent != agent) {
    std::string now_held =
        chunk.lease ? "it is leased to agent \"" + chunk.lease->agent + "\" under another id"
                    : std::string(chunk.published ? "it is ready" : "it has no live lease");
    if (chunk.lease && chunk.lease->id == lease_id) {
      now_held = "that lease is held by agent \"" + chunk.lease->agent + "\"";
    }
    return Fail(BlobErrc::kConflict, "agent \"" + std::string(agent) + "\" does not hold lease " +
                                         std::string(lease_id) + " of " + ChunkName(digest, k) +
                                         ": " + now_held);
  }
  EndLease(digest, *blob, chunk, BlobEvent::kReleased);
  return boost::outcome_v2::success();
}

BlobResult<BadReportAnswer> BlobTable::ReportBad(const Digest& digest, uint32_t k,
                                                 const swarm::Sha1& info_hash,
                                                 std::string_view reporter, TimePoint now) {
  ExpireLeases(now);
  Blob* blob = Touch(digest);
  if (blob == nullptr) return BadReportAnswer{};
  auto found = ChunkOf(digest, *blob, k);
  if (!found) return found.error();
  Chunk& chunk = *found.value();
  if (!chunk.published || chunk.published->info_hash != info_hash) return BadReportAnswer{};
  // KeepReady drops a chunk whose swarm lost its seeders: one report is then enough.
  if (!KeepReady(digest, *blob, chunk)) return BadReportAnswer{true, 1, 1};
  const uint32_t needed = std::max<uint32_t>(1, options_.bad_report_quorum);
  auto& seen = blob->bad_reporters[k];
  if (std::find(seen.begin(), seen.end(), reporter) == seen.end()) seen.emplace_back(reporter);
  const auto reporters = static_cast<uint32_t>(seen.size());
  if (reporters < needed) return BadReportAnswer{false, reporters, needed};
  Unpublish(digest, *blob, chunk);
  return BadReportAnswer{true, reporters, needed};
}

bool BlobTable::KeepReady(const Digest& digest, Blob& blob, Chunk& chunk) {
  if (!chunk.published) return false;
  if (!seeders_lost_) return true;
  std::optional<TimePoint> lost = seeders_lost_(chunk.published->info_hash);
  if (!lost || *lost < chunk.published->published_at) return true;
  Unpublish(digest, blob, chunk);
  return false;
}

void BlobTable::Unpublish(const Digest& digest, Blob& blob, Chunk& chunk) {
  chunk.published.reset();
  blob.bad_reporters.erase(static_cast<uint32_t>(&chunk - blob.chunks.data()));
  --blob.ready;
  --totals_.ready;
  Emit(BlobEvent::kDropped, digest);
}

size_t BlobTable::ExpireLeases(TimePoint now) {
  size_t expired = 0;
  while (!expiries_.empty() && expiries_.begin()->first <= now) {
    LeaseKey key = expiries_.begin()->second;  // a copy: EndLease erases the entry
    Blob& blob = blobs_.at(key.digest);
    EndLease(key.digest, blob, blob.chunks[key.chunk], BlobEvent::kExpired);
    ++expired;
  }
  return expired;
}

std::vector<LeaseSummary> BlobTable::ActiveLeases(size_t limit) const {
  std::vector<LeaseSummary> out;
  for (auto it = expiries_.begin(); it != expiries_.end() && out.size() < limit; ++it) {
    const Blob& blob = blobs_.at(it->second.digest);
    const LeaseRecord& lease = *blob.chunks[it->second.chunk].lease;
    out.push_back(LeaseSummary{it->second.digest, it->second.chunk,
                               blob.layout.chunk_length(it->second.chunk), lease.agent, lease.bytes,
                               lease.granted, it->first});
  }
  return out;
}

std::vector<BlobSummary> BlobTable::RecentBlobs(size_t limit) const {
  std::vector<BlobSummary> out;
  for (auto it = lru_.begin(); it != lru_.end() && out.size() < limit; ++it) {
    out.push_back(SummaryOf(*it, blobs_.at(*it)));
  }
  return out;
}

std::optional<BlobSummary> BlobTable::Summary(const Digest& digest) const {
  auto it = blobs_.find(digest);
  if (it == blobs_.end()) return std::nullopt;
  return SummaryOf(digest, it->second);
}

BlobSummary BlobTable::SummaryOf(const Digest& digest, const Blob& blob) {
  BlobSummary b{digest,
                blob.source,
                static_cast<uint32_t>(blob.chunks.size()),
                blob.ready,
                blob.leases,
                blob.upstream_bytes,
                blob.created,
                blob.completed,
                false,
                {},
                {}};
  b.ready_info_hashes.reserve(blob.ready);
  b.ready_lengths.reserve(blob.ready);
  b.chunk0_ready = !blob.chunks.empty() && blob.chunks[0].published != nullptr;
  for (uint32_t k = 0; k < blob.chunks.size(); ++k) {
    if (!blob.chunks[k].published) continue;
    b.ready_info_hashes.push_back(blob.chunks[k].published->info_hash);
    b.ready_lengths.push_back(blob.layout.chunk_length(k));
  }
  return b;
}

BlobResult<swarm::ChunkLayout> BlobTable::CheckChunk(const Digest& digest, const BlobSource& source,
                                                     uint32_t k) const {
  swarm::ChunkLayout layout;
  if (auto known = blobs_.find(digest); known != blobs_.end()) {
    if (known->second.source.size != source.size) {
      return Fail(BlobErrc::kConflict,
                  fmt::format("blob {} is known with size {}, not {}", digest.str(),
                              known->second.source.size, source.size));
    }
    layout = known->second.layout;
  } else {
    auto fresh = LayoutFor(source.size);
    if (!fresh) return fresh.error();
    layout = fresh.value();
  }
  if (k >= layout.chunk_count()) {
    return Fail(BlobErrc::kInvalid, fmt::format("chunk index {} is out of range: {} has {} chunks",
                                                k, digest.str(), layout.chunk_count()));
  }
  return layout;
}

BlobResult<BlobTable::Blob*> BlobTable::EnsureBlob(const Digest& digest, const BlobSource& source,
                                                   TimePoint now) {
  if (Blob* blob = Touch(digest)) {
    if (blob->source.size != source.size) {
      return Fail(BlobErrc::kConflict, fmt::format("blob {} is known with size {}, not {}",
                                                   digest.str(), blob->source.size, source.size));
    }
    // Fill in a source the first writer did not know.
    if (blob->source.registry.empty()) blob->source.registry = source.registry;
    if (blob->source.repository.empty()) blob->source.repository = source.repository;
    return blob;
  }
  auto layout = LayoutFor(source.size);
  if (!layout) return layout.error();
  auto room = MakeRoom(digest, layout.value().chunk_count());
  if (!room) return room.error();
  lru_.push_front(digest);
  Blob& blob = blobs_[digest];
  blob.source = source;
  blob.layout = layout.value();
  blob.chunks.resize(blob.layout.chunk_count());
  blob.created = now;
  blob.lru = lru_.begin();
  ++totals_.blobs;
  totals_.chunks += blob.chunks.size();
  return &blob;
}

BlobTable::Blob* BlobTable::Touch(const Digest& digest) {
  auto it = blobs_.find(digest);
  if (it == blobs_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return &it->second;
}

BlobResult<BlobTable::Chunk*> BlobTable::ChunkOf(const Digest& digest, Blob& blob, uint32_t k) {
  if (k >= blob.chunks.size()) {
    return Fail(BlobErrc::kInvalid, fmt::format("chunk index {} is out of range: {} has {} chunks",
                                                k, digest.str(), blob.chunks.size()));
  }
  return &blob.chunks[k];
}

BlobResult<void> BlobTable::MakeRoom(const Digest& digest, uint32_t chunks) {
  while (blobs_.size() >= options_.max_blobs || totals_.chunks + chunks > options_.max_chunks) {
    // Tables with leases are skipped; there are at most max_upstream_fetchers of them, so the
    // scan is short.
    auto victim = lru_.rbegin();
    while (victim != lru_.rend() && blobs_.at(*victim).leases > 0) ++victim;
    if (victim == lru_.rend()) {
      return Fail(BlobErrc::kFull,
                  fmt::format("tracker is full: {} blob tables with {} chunks (limits: {} tables, "
                              "{} chunks) and every table holds an active lease; not tracking {}",
                              blobs_.size(), totals_.chunks, options_.max_blobs,
                              options_.max_chunks, digest.str()));
    }
    Digest gone = *victim;
    auto it = blobs_.find(gone);
    totals_.chunks -= it->second.chunks.size();
    totals_.ready -= it->second.ready;
    --totals_.blobs;
    lru_.erase(std::prev(victim.base()));
    blobs_.erase(it);
    Emit(BlobEvent::kEvicted, gone);
  }
  return boost::outcome_v2::success();
}

void BlobTable::EndLease(const Digest& digest, Blob& blob, Chunk& chunk, BlobEvent event) {
  auto held = agent_leases_.find(chunk.lease->agent);
  if (held != agent_leases_.end() && --held->second == 0) agent_leases_.erase(held);
  expiries_.erase(chunk.lease->expiry);
  chunk.lease.reset();
  --blob.leases;
  --totals_.leases;
  Emit(event, digest);
}

void BlobTable::SetExpiry(const Digest& digest, uint32_t k, LeaseRecord& lease, TimePoint expires) {
  expiries_.erase(lease.expiry);
  lease.expiry = expiries_.emplace(expires, LeaseKey{digest, k});
}

BlobView BlobTable::ViewOf(const Blob& blob) {
  BlobView view;
  view.source = blob.source;
  view.layout = blob.layout;
  view.chunks.reserve(blob.chunks.size());
  for (const Chunk& c : blob.chunks) {
    ChunkView cv;
    if (c.published) {
      cv.state = ChunkState::kReady;
      cv.published = c.published;
    } else if (c.lease) {
      cv.state = ChunkState::kLeased;
    }
    view.chunks.push_back(std::move(cv));
  }
  return view;
}

std::string BlobTable::NewLeaseId() { return fmt::format("{:016x}{:016x}", rng_(), rng_()); }

}  // namespace shoal::tracker
