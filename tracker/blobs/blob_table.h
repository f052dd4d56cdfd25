#pragma once
// The tracker's chunk tables: for each blob digest its chunk layout, where it comes from
// upstream, and per chunk either nothing, an upstream lease (one agent fetches that chunk from
// the registry) or published metainfo (a private v1 chunk torrent, lib/swarm/chunk_torrent.h).
// At most upstream_limit() leases are active over the whole table: base_upstream_fetchers, raised
// toward max_upstream_fetchers while leases run fast (see BlobTableOptions). Soft state like the
// swarm table: after a restart agents re-publish the chunks they hold. No network here; callers
// pass "now" into every call, so tests control time.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/outcome/result.hpp>

#include "lib/core/digest.h"
#include "lib/swarm/chunk_torrent.h"
#include "tracker/swarms/swarm_table.h"

namespace shoal::tracker {

struct BlobTableOptions {
  // The layout of a new table (validated by the caller): full chunks of chunk_size bytes with
  // pieces of piece_size. With target_chunks > 0 a smaller blob gets smaller chunks: the power of
  // two at or below size / target_chunks, at least min_chunk_size, with pieces of an eighth of
  // a chunk (at most piece_size), so a blob of any size has enough chunks to spread over the
  // swarm and its last chunk is a small tail. first_chunk_size > 0 adds the ramp of
  // ChunkLayout (small first chunks, so the swarm starts sharing a blob at once).
  uint64_t chunk_size = 64ull << 20;
  uint32_t piece_size = 4u << 20;
  uint32_t target_chunks = 0;
  uint64_t min_chunk_size = 4ull << 20;  // a power of two
  uint64_t first_chunk_size = 0;         // 0 or a power of two >= 16 KiB
  // Active leases over all blobs: base_upstream_fetchers at first (clamped to the max). With
  // fast_lease_rate > 0 every lease that fetched a full-size chunk at fast_lease_rate or faster
  // raises the limit by one (up to max_upstream_fetchers), every one slower than half that
  // lowers it by one (down to the base). Fast leases mean the registry link has room: more leases
  // spread the upstream flows over more leaseholders' downlinks, each of which peers also fill.
  uint32_t max_upstream_fetchers = 8;
  uint32_t base_upstream_fetchers = 0;  // 0: max_upstream_fetchers (a fixed limit)
  uint64_t fast_lease_rate = 0;         // bytes/s; 0: the limit stays at the base
  uint32_t max_leases_per_agent = 2;    // active leases of one agent
  // Active leases on one blob (U goes to its head), scaled with the limit: at a limit of L it
  // is max_leases_per_blob * L / base (rounded down), never below max_leases_per_blob.
  uint32_t max_leases_per_blob = 4;
  // While chunk 0 is leased but not ready, no other chunk of the blob is leased for this long
  // after chunk 0's grant: chunk 0 gets the whole upstream link, so peers get it sooner. 0: off.
  std::chrono::milliseconds head_start{0};
  std::chrono::milliseconds lease_ttl{15'000};   // a lease not renewed for this long expires
  std::chrono::milliseconds retry_after{1'000};  // the hint in a wait answer
  size_t max_blobs = 100'000;                    // tables kept; beyond, the LRU lease-free one goes
  uint32_t max_chunks_per_blob = 1u << 20;       // larger blobs are refused (bounds one table)
  size_t max_chunks = 4u << 20;                  // chunks over all tables, also evicts LRU tables
  // A ready chunk is dropped on bad reports from this many distinct sources (the caller's
  // address: a client cannot forge it), or on one report once its swarm lost every seeder
  // (SetSeedersLostProbe). One agent alone cannot make the cluster fetch a chunk again.
  uint32_t bad_report_quorum = 2;
  // The root certificate published chunk torrents must carry: the cluster's peer CA (canonical
  // PEM), or empty when agents run plain peers (then SSL torrents are refused).
  std::string root_cert;
};

// Why a call failed; the blob API maps each to one HTTP status (400, 404, 409, 503).
// kForbidden: the caller may not do this (publishing a chunk another agent holds the lease on).
enum class BlobErrc { kInvalid, kNotFound, kConflict, kFull, kForbidden };

struct BlobError {
  BlobErrc code = BlobErrc::kInvalid;
  std::string message;  // names the blob and chunk
};

template <typename T>
using BlobResult = boost::outcome_v2::result<T, BlobError, boost::outcome_v2::policy::terminate>;

// Where a blob is fetched from upstream, and its size (which fixes the layout).
struct BlobSource {
  uint64_t size = 0;
  std::string registry;
  std::string repository;
};

enum class ChunkState { kNone, kLeased, kReady };
// "none", "leased" or "ready".
std::string_view ChunkStateName(ChunkState state);

// A ready chunk's validated metainfo. Immutable once published; shared with readers.
struct PublishedChunk {
  std::string metainfo;  // the bencoded torrent as published
  swarm::Sha1 info_hash{};
  std::string agent;         // who published it
  TimePoint published_at{};  // when this publication was accepted
};

// What a bad report did: dropped the chunk, or counted it (reporters: distinct reporters of
// this publication so far, needed: how many drop it). All zero when the report did not match
// a ready chunk (unknown blob, not ready, another info-hash).
struct BadReportAnswer {
  bool dropped = false;
  uint32_t reporters = 0;
  uint32_t needed = 0;
};

struct ChunkView {
  ChunkState state = ChunkState::kNone;
  std::shared_ptr<const PublishedChunk> published;  // set when ready
};

// A copy of one table (O(chunks)).
struct BlobView {
  BlobSource source;
  swarm::ChunkLayout layout;
  std::vector<ChunkView> chunks;
};

enum class WaitReason { kLeased, kClusterCap, kAgentCap, kBlobCap, kUnleased, kHeadStart };
// "leased", "cluster_cap", "agent_cap", "blob_cap", "unleased" (nobody fetches it yet) or
// "head_start" (the blob's chunk 0 is fetched alone for now).
std::string_view WaitReasonName(WaitReason reason);

// The answer to a lease request.
struct LeaseAnswer {
  // kDone (Work only): every chunk is ready, nothing is left to fetch.
  enum class Kind { kReady, kGranted, kWait, kDone };
  Kind kind = Kind::kWait;
  swarm::ChunkLayout layout;
  uint32_t chunk = 0;                               // kGranted, kReady: which chunk
  std::shared_ptr<const PublishedChunk> published;  // kReady
  std::string lease_id;                             // kGranted
  std::chrono::milliseconds ttl{0};                 // kGranted
  uint64_t begin = 0;                               // kGranted: the chunk's bytes in the blob
  uint64_t length = 0;
  WaitReason reason = WaitReason::kLeased;   // kWait
  std::chrono::milliseconds retry_after{0};  // kWait
  // kWait: the earliest lease expiry that could change this answer without any other event
  // (a long-poll must re-ask by then); TimePoint::max() when none.
  TimePoint recheck_at = TimePoint::max();
};

struct PublishAnswer {
  bool kept_existing = false;   // the chunk was already ready with another info-hash
  bool newly_ready = false;     // this call made the chunk ready
  bool released_lease = false;  // lease_id was the chunk's live lease, and it ended
  std::shared_ptr<const PublishedChunk> published;  // what the chunk holds now
};

// Things that happened to a blob, reported to the listener as they happen.
enum class BlobEvent {
  kGranted,    // a new lease
  kExpired,    // a lease passed its expiry (frees a fetcher slot)
  kReleased,   // a lease ended by its holder, or because the chunk became ready
  kPublished,  // a chunk became ready
  kDropped,    // ready metainfo was reported bad and dropped
  kEvicted,    // the whole table was dropped to make room
};
using BlobListener = std::function<void(BlobEvent event, const Digest& digest)>;
// When a ready chunk's torrent lost every seeder (SwarmTable::SeedersLostAt: the agents that held
// it evicted it or died, so nobody can serve it any more); nullopt while someone seeds it.
using SeedersLostProbe = std::function<std::optional<TimePoint>(const swarm::Sha1& info_hash)>;

struct BlobTotals {
  size_t blobs = 0;
  size_t chunks = 0;
  size_t ready = 0;
  size_t leases = 0;             // active
  uint64_t upstream_bytes = 0;   // chunk bytes published by their lease holder, since start
};

// One blob table in brief, for the cluster view.
struct BlobSummary {
  Digest digest;
  BlobSource source;
  uint32_t chunks = 0;
  uint32_t ready = 0;
  uint32_t leases = 0;
  uint64_t upstream_bytes = 0;  // its chunks fetched from upstream under a lease, so far
  TimePoint created;            // when this replica made the table
  std::optional<TimePoint> completed;  // when its last chunk became ready (first time)
  bool chunk0_ready = false;
  std::vector<swarm::Sha1> ready_info_hashes;  // the ready chunks' torrents, in chunk order
  std::vector<uint64_t> ready_lengths;         // their chunks' lengths (parallel)
};

// One active lease, for the status page.
struct LeaseSummary {
  Digest digest;
  uint32_t chunk = 0;
  uint64_t length = 0;
  std::string agent;
  uint64_t bytes = 0;  // progress reported by renewals
  TimePoint granted;
  TimePoint expires;
};

// Not thread-safe: the tracker calls it only from its single io_context thread. Every call
// first expires the leases past their expiry, so the caps are always exact. Agent ids and
// lease ids are taken as given (the API layer validates their form).
class BlobTable {
 public:
  // seed feeds lease ids (tests pass a fixed one).
  explicit BlobTable(BlobTableOptions options, uint64_t seed = std::random_device{}());

  // Called synchronously from inside the calls below, once per event. It must not call back
  // into the table.
  void SetListener(BlobListener listener) { listener_ = std::move(listener); }
  // With a probe, Lease and Work drop a ready chunk whose seeders all left after it was
  // published (kDropped), so it is leased and fetched upstream again at once instead of after a
  // peer stall. A chunk published after its seeders left is kept: its publisher has just claimed
  // to seed it (dropping it at once made a publish-lease-publish loop with no bound).
  void SetSeedersLostProbe(SeedersLostProbe probe) { seeders_lost_ = std::move(probe); }

  // The table of digest, created from source if absent (first non-empty registry and
  // repository win). Errors: kInvalid for a size the layout rejects, kConflict when the table
  // exists with another size, kFull when it is absent and no table can be evicted.
  BlobResult<BlobView> Ensure(const Digest& digest, const BlobSource& source, TimePoint now);
  // The table of digest. Errors: kNotFound.
  BlobResult<BlobView> Find(const Digest& digest, TimePoint now);

  // Chunk k for agent (creating the table like Ensure): ready with its metainfo; granted (a new
  // lease if the chunk has none and both caps allow, or the agent's own lease on it again with a
  // fresh expiry); or wait with the reason (kHeadStart for k > 0 while chunk 0 has its head
  // start). Errors: as Ensure, kInvalid for k out of range.
  // With may_grant false the answer is only ever ready or wait (the agent's upstream worker
  // asks for work with Work; its readers only wait for chunks).
  BlobResult<LeaseAnswer> Lease(const Digest& digest, uint32_t k, std::string_view agent,
                                const BlobSource& source, TimePoint now, bool may_grant = true);
  // Upstream work on digest for agent (creating the table like Ensure): the agent's live lease
  // on this blob again (fresh expiry); else, if every cap allows (cluster, agent, blob), a new
  // lease on the lowest chunk that is neither leased nor ready (not before chunk 0's head start
  // ends, options.head_start); else wait with the reason; done
  // when every chunk is ready. The tracker, not the agent, picks the chunk: whoever is idle
  // fetches the next one, so upstream bytes keep flowing in blob order and leases spread over
  // the agents that ask (long-polls parked first are woken first). Errors: as Ensure.
  BlobResult<LeaseAnswer> Work(const Digest& digest, std::string_view agent,
                               const BlobSource& source, TimePoint now);
  // Extends agent's lease on chunk k and records its progress; returns the new ttl.
  // Errors: kConflict ("lease lost") unless lease_id is the chunk's live lease held by agent,
  // kInvalid for k out of range.
  BlobResult<std::chrono::milliseconds> Renew(const Digest& digest, uint32_t k,
                                              std::string_view agent, std::string_view lease_id,
                                              uint64_t bytes, TimePoint now);
  // Validates metainfo against chunk k's length and the piece size, creates the table if absent
  // and marks the chunk ready (keeping an existing different one), ending the lease. lease_id
  // may be empty (re-publishing after a tracker restart) only while nobody holds a lease on the
  // chunk. Errors: as Ensure, kInvalid for k out of range or metainfo that does not validate
  // (with the reason), kForbidden when another lease than lease_id is live on the chunk.
  BlobResult<PublishAnswer> Publish(const Digest& digest, uint32_t k, std::string_view agent,
                                    std::string_view lease_id, const BlobSource& source,
                                    std::string_view metainfo, TimePoint now);
  // Ends agent's lease on chunk k (the chunk goes back to none). Errors: kConflict unless
  // lease_id is the chunk's live lease held by agent, kInvalid for k out of range.
  BlobResult<void> Release(const Digest& digest, uint32_t k, std::string_view agent,
                           std::string_view lease_id, TimePoint now);
  // Counts reporter's bad report against chunk k if it is ready with info_hash, and drops its
  // metainfo (so the chunk is leased again) once bad_report_quorum distinct reporters said so
  // or its swarm has lost every seeder since it was published. Errors: kInvalid for k out of
  // range.
  BlobResult<BadReportAnswer> ReportBad(const Digest& digest, uint32_t k,
                                        const swarm::Sha1& info_hash, std::string_view reporter,
                                        TimePoint now);

  // Ends every lease whose expiry has passed; returns how many. O(expired * log leases).
  size_t ExpireLeases(TimePoint now);
  // The layout a new table of size bytes gets. Errors: kInvalid when it does not validate.
  BlobResult<swarm::ChunkLayout> LayoutFor(uint64_t size) const;

  BlobTotals totals() const { return totals_; }
  // Leases that may be active at once now (see BlobTableOptions::fast_lease_rate).
  uint32_t upstream_limit() const { return limit_; }
  // Leases that may be active at once on one blob now.
  uint32_t blob_lease_limit() const;
  // Up to limit active leases, the soonest to expire first (for the status page).
  std::vector<LeaseSummary> ActiveLeases(size_t limit) const;
  // Up to limit tables, the most recently used first (for the cluster view). O(limit x chunks).
  std::vector<BlobSummary> RecentBlobs(size_t limit) const;
  // The table of digest in brief, without touching its LRU position; nullopt when absent.
  // O(chunks).
  std::optional<BlobSummary> Summary(const Digest& digest) const;
  const BlobTableOptions& options() const { return options_; }

 private:
  struct LeaseKey {
    Digest digest;
    uint32_t chunk = 0;
  };
  using ExpiryIndex = std::multimap<TimePoint, LeaseKey>;
  struct LeaseRecord {
    std::string id;
    std::string agent;
    TimePoint granted;
    uint64_t bytes = 0;
    ExpiryIndex::iterator expiry;  // its entry in expiries_ (holds the expiry time)
  };
  struct Chunk {
    std::shared_ptr<const PublishedChunk> published;
    std::unique_ptr<LeaseRecord> lease;
  };
  struct Blob {
    BlobSource source;
    swarm::ChunkLayout layout;
    std::vector<Chunk> chunks;
    uint32_t leases = 0;              // active leases on this blob (such a blob is not evicted)
    uint32_t ready = 0;               // chunks with metainfo
    uint64_t upstream_bytes = 0;      // chunk bytes published by their lease holder
    TimePoint created;
    std::optional<TimePoint> completed;
    std::list<Digest>::iterator lru;  // its entry in lru_
    // Distinct bad reporters of a ready chunk's publication (fewer than the quorum), only for
    // chunks someone reported: nothing for the others.
    std::map<uint32_t, std::vector<std::string>> bad_reporters;
  };

  // The table, created at `now` if absent (evicting as needed), moved to the front of the LRU
  // order.
  BlobResult<Blob*> EnsureBlob(const Digest& digest, const BlobSource& source, TimePoint now);
  // The layout of digest's table (existing or to be created from source) if k is one of its
  // chunks. Errors: kConflict for another size, kInvalid for a bad size or k. Creates nothing.
  BlobResult<swarm::ChunkLayout> CheckChunk(const Digest& digest, const BlobSource& source,
                                            uint32_t k) const;
  // The table if present, moved to the front of the LRU order; nullptr otherwise.
  Blob* Touch(const Digest& digest);
  // Chunk k of blob. Errors: kInvalid when k is out of range.
  static BlobResult<Chunk*> ChunkOf(const Digest& digest, Blob& blob, uint32_t k);
  // Evicts least recently used lease-free tables until one of `chunks` chunks fits.
  BlobResult<void> MakeRoom(const Digest& digest, uint32_t chunks);
  // answer (layout set) completed as a grant of lease on chunk k, or as a wait.
  LeaseAnswer Granted(LeaseAnswer answer, const Blob& blob, uint32_t k,
                      const LeaseRecord& lease) const;
  LeaseAnswer Waiting(LeaseAnswer answer, WaitReason reason, TimePoint recheck_at) const;
  // When chunk k > 0 may not be leased yet because chunk 0 is still in its head start: the
  // time the head start ends; nullopt otherwise.
  std::optional<TimePoint> HeadStartUntil(const Blob& blob, uint32_t k, TimePoint now) const;
  // A new lease on chunk k of blob for agent (the caps were checked).
  LeaseRecord& Grant(const Digest& digest, Blob& blob, uint32_t k, std::string_view agent,
                     TimePoint now);
  // Drops chunk's metainfo (kDropped) if it is ready and the probe says its seeders left after
  // it was published; returns whether the chunk is ready afterwards.
  bool KeepReady(const Digest& digest, Blob& blob, Chunk& chunk);
  // Drops chunk's metainfo (it must be ready) and emits kDropped.
  void Unpublish(const Digest& digest, Blob& blob, Chunk& chunk);
  // Moves limit_ by the speed of a lease that just published chunk k of blob.
  void Adapt(const Blob& blob, uint32_t k, const LeaseRecord& lease, TimePoint now);
  // Ends chunk's lease (event says why).
  void EndLease(const Digest& digest, Blob& blob, Chunk& chunk, BlobEvent event);
  void SetExpiry(const Digest& digest, uint32_t k, LeaseRecord& lease, TimePoint expires);
  static BlobView ViewOf(const Blob& blob);
  static BlobSummary SummaryOf(const Digest& digest, const Blob& blob);
  std::string NewLeaseId();
  void Emit(BlobEvent event, const Digest& digest) {
    if (listener_) listener_(event, digest);
  }

  BlobTableOptions options_;
  std::mt19937_64 rng_;
  BlobListener listener_;
  SeedersLostProbe seeders_lost_;
  std::unordered_map<Digest, Blob> blobs_;
  std::list<Digest> lru_;                                   // most recently used first
  ExpiryIndex expiries_;                                    // every active lease by expiry
  std::unordered_map<std::string, uint32_t> agent_leases_;  // active leases per agent (> 0 only)
  uint32_t limit_ = 0;                                      // upstream_limit()
  BlobTotals totals_;
};

}  // namespace shoal::tracker
