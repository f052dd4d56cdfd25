// BlobTable: chunk tables and upstream leases, with a fake clock (every call takes "now").

#include <doctest/doctest.h>

#include <chrono>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lib/swarm/chunk_torrent.h"
#include "tracker/blobs/blob_table.h"

#include "tests/support/why.h"

namespace shoal::tracker {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const TimePoint kT0 = TimePoint() + std::chrono::hours(1);
constexpr uint64_t kChunk = 64 << 10;
constexpr uint32_t kPiece = 16 << 10;
// Four chunks: three full ones and a short last one.
constexpr uint64_t kSize = 3 * kChunk + 3392;

BlobTableOptions Options(uint32_t fetchers = 16, uint32_t per_agent = 2) {
  BlobTableOptions o;
  o.chunk_size = kChunk;
  o.piece_size = kPiece;
  o.max_upstream_fetchers = fetchers;
  o.max_leases_per_agent = per_agent;
  o.max_leases_per_blob = fetchers;
  o.lease_ttl = seconds(15);
  return o;
}

Digest D(char c) { return Digest::FromSha256Hex(std::string(64, c)); }

BlobSource Source(uint64_t size = kSize) { return BlobSource{size, "registry.test", "team/app"}; }

// length bytes derived from seed.
std::string Bytes(uint64_t length, uint32_t seed) {
  std::string s(length, '\0');
  uint32_t x = seed;
  for (char& c : s) {
    x = x * 1103515245 + 12345;
    c = static_cast<char>(x >> 16);
  }
  return s;
}

// Real chunk metainfo over length bytes of seed's data, with the given piece size.
std::string Metainfo(uint64_t length, uint32_t seed, uint32_t piece = kPiece) {
  std::string data = Bytes(length, seed);
  swarm::PieceHasher hasher(length, piece);
  REQUIRE(hasher.Update(data.data(), data.size()).has_value());
  auto hashes = hasher.Finish();
  REQUIRE(hashes.has_value());
  auto torrent = swarm::BuildChunkTorrent("chunk", length, piece, std::move(hashes.value()));
  REQUIRE_MESSAGE(torrent.has_value(), Why(torrent));
  return torrent.value().metainfo;
}

LeaseAnswer MustLease(BlobTable& t, const Digest& d, uint32_t k, const std::string& agent,
                      TimePoint now, const BlobSource& source = Source()) {
  auto a = t.Lease(d, k, agent, source, now);
  REQUIRE_MESSAGE(a.has_value(), Why(a));
  return a.value();
}

ChunkState StateOf(BlobTable& t, const Digest& d, uint32_t k, TimePoint now) {
  auto view = t.Find(d, now);
  REQUIRE_MESSAGE(view.has_value(), Why(view));
  return view.value().chunks.at(k).state;
}

// Records the listener's events.
struct Events {
  std::vector<BlobEvent> seen;
  void Attach(BlobTable& t) {
    t.SetListener([this](BlobEvent e, const Digest&) { seen.push_back(e); });
  }
  size_t Count(BlobEvent e) const {
    size_t n = 0;
    for (BlobEvent s : seen) n += s == e;
    return n;
  }
};

}  // namespace

TEST_CASE("tracker blobs: a table is created with the layout and remembers its first source") {
  BlobTable t(Options(), 1);
  auto view = t.Ensure(D('a'), Source(), kT0);
  REQUIRE(view.has_value());
  CHECK(view.value().layout.chunk_count() == 4);
  CHECK(view.value().layout.chunk_length(3) == 3392);
  CHECK(view.value().source.registry == "registry.test");
  for (const ChunkView& c : view.value().chunks) CHECK(c.state == ChunkState::kNone);
  // A later writer does not replace the source.
  auto again = t.Ensure(D('a'), BlobSource{kSize, "other.test", "other/app"}, kT0);
  REQUIRE(again.has_value());
  CHECK(again.value().source.repository == "team/app");
  CHECK(t.totals().blobs == 1);
  CHECK(t.totals().chunks == 4);
  CHECK(t.Find(D('b'), kT0).error().code == BlobErrc::kNotFound);
}

TEST_CASE("tracker blobs: target_chunks gives smaller blobs smaller chunks, with a ramp") {
  BlobTableOptions o = Options();
  o.chunk_size = 64ull << 20;
  o.piece_size = 4u << 20;
  o.target_chunks = 32;
  o.min_chunk_size = 4ull << 20;
  o.first_chunk_size = 1ull << 20;
  BlobTable t(o, 1);
  // 256 MiB: 8 MiB chunks of 1 MiB pieces after a 1, 2, 4 MiB ramp.
  auto l = t.LayoutFor(256ull << 20);
  REQUIRE(l.has_value());
  CHECK(l.value().chunk_size == (8ull << 20));
  CHECK(l.value().piece_size == (1u << 20));
  CHECK(l.value().first_chunk_size == (1ull << 20));
  CHECK(l.value().chunk_count() == 3 + 32);
  // Just over 256 MiB (the bench's layer): rounded down, still 8 MiB chunks (size / 8 MiB >= 32):
  // the 7 MiB ramp, 31 full chunks and a tail.
  l = t.LayoutFor((256ull << 20) + (300u << 10));
  REQUIRE(l.has_value());
  CHECK(l.value().chunk_size == (8ull << 20));
  CHECK(l.value().chunk_count() == 3 + 31 + 1);
  // Just under: 4 MiB chunks.
  l = t.LayoutFor((256ull << 20) - 1);
  REQUIRE(l.has_value());
  CHECK(l.value().chunk_size == (4ull << 20));
  // 17 GiB: the configured 64 MiB chunks and 4 MiB pieces.
  l = t.LayoutFor(17ull << 30);
  REQUIRE(l.has_value());
  CHECK(l.value().chunk_size == (64ull << 20));
  CHECK(l.value().piece_size == (4u << 20));
  // Small blobs: never below min_chunk_size.
  l = t.LayoutFor(3ull << 20);
  REQUIRE(l.has_value());
  CHECK(l.value().chunk_size == (4ull << 20));
  CHECK(l.value().piece_size == (512u << 10));
  CHECK(l.value().chunk_count() == 2);
  // Without target_chunks every blob gets the configured layout; a first chunk at or above the
  // chunk size means no ramp.
  o.target_chunks = 0;
  o.first_chunk_size = 64ull << 20;
  BlobTable fixed(o, 1);
  l = fixed.LayoutFor(256ull << 20);
  REQUIRE(l.has_value());
  CHECK(l.value().chunk_size == (64ull << 20));
  CHECK(l.value().first_chunk_size == 0);
  CHECK(l.value().chunk_count() == 4);
}

TEST_CASE("tracker blobs: a known blob asked for with another size is a conflict") {
  BlobTable t(Options(), 1);
  REQUIRE(t.Ensure(D('a'), Source(), kT0).has_value());
  auto other = t.Ensure(D('a'), Source(kSize + 1), kT0);
  REQUIRE_FALSE(other.has_value());
  CHECK(other.error().code == BlobErrc::kConflict);
  CHECK(other.error().message.find("known with size") != std::string::npos);
  CHECK(t.Lease(D('a'), 0, "n1", Source(5), kT0).error().code == BlobErrc::kConflict);
  CHECK(t.Publish(D('a'), 0, "n1", "", Source(5), Metainfo(5, 1), kT0).error().code ==
        BlobErrc::kConflict);
}

TEST_CASE("tracker blobs: sizes the layout rejects and chunk indexes out of range are invalid") {
  BlobTableOptions o = Options();
  o.max_chunks_per_blob = 8;
  BlobTable t(o, 1);
  CHECK(t.Ensure(D('a'), Source(0), kT0).error().code == BlobErrc::kInvalid);
  CHECK(t.Ensure(D('a'), Source(9 * kChunk), kT0).error().code == BlobErrc::kInvalid);
  CHECK(t.totals().blobs == 0);
  auto out = t.Lease(D('a'), 4, "n1", Source(), kT0);
  REQUIRE_FALSE(out.has_value());
  CHECK(out.error().code == BlobErrc::kInvalid);
  CHECK(out.error().message.find("out of range") != std::string::npos);
}

TEST_CASE("tracker blobs: the cluster cap holds leases back until one ends") {
  BlobTable t(Options(/*fetchers=*/2, /*per_agent=*/5), 1);
  Events events;
  events.Attach(t);
  auto a = MustLease(t, D('a'), 0, "n1", kT0);
  auto b = MustLease(t, D('a'), 1, "n2", kT0);
  CHECK(a.kind == LeaseAnswer::Kind::kGranted);
  CHECK(b.kind == LeaseAnswer::Kind::kGranted);
  CHECK(a.lease_id != b.lease_id);
  CHECK(a.begin == 0);
  CHECK(b.begin == kChunk);
  CHECK(b.length == kChunk);
  CHECK(a.ttl == seconds(15));
  // A third fetcher, even on another blob, must wait.
  auto c = MustLease(t, D('b'), 0, "n3", kT0 + seconds(1));
  CHECK(c.kind == LeaseAnswer::Kind::kWait);
  CHECK(c.reason == WaitReason::kClusterCap);
  CHECK(c.retry_after > milliseconds(0));
  CHECK(c.recheck_at == kT0 + seconds(15));  // the first expiry could free a slot
  CHECK(t.totals().leases == 2);
  REQUIRE(t.Release(D('a'), 0, "n1", a.lease_id, kT0 + seconds(2)).has_value());
  CHECK(StateOf(t, D('a'), 0, kT0 + seconds(2)) == ChunkState::kNone);
  auto again = MustLease(t, D('b'), 0, "n3", kT0 + seconds(2));
  CHECK(again.kind == LeaseAnswer::Kind::kGranted);
  CHECK(events.Count(BlobEvent::kGranted) == 3);
  CHECK(events.Count(BlobEvent::kReleased) == 1);
}

TEST_CASE("tracker blobs: one agent holds at most max_leases_per_agent leases") {
  BlobTable t(Options(/*fetchers=*/16, /*per_agent=*/2), 1);
  auto a0 = MustLease(t, D('a'), 0, "n1", kT0);
  CHECK(MustLease(t, D('a'), 1, "n1", kT0).kind == LeaseAnswer::Kind::kGranted);
  auto a2 = MustLease(t, D('a'), 2, "n1", kT0);
  CHECK(a2.kind == LeaseAnswer::Kind::kWait);
  CHECK(a2.reason == WaitReason::kAgentCap);
  // The chunk itself is free: another agent gets it.
  CHECK(MustLease(t, D('a'), 2, "n2", kT0).kind == LeaseAnswer::Kind::kGranted);
  // n1's own leases are still handed back to it while it is at its cap.
  CHECK(MustLease(t, D('a'), 0, "n1", kT0).lease_id == a0.lease_id);
  REQUIRE(t.Release(D('a'), 0, "n1", a0.lease_id, kT0).has_value());
  CHECK(MustLease(t, D('a'), 3, "n1", kT0).kind == LeaseAnswer::Kind::kGranted);
}

TEST_CASE("tracker blobs: asking again for a held lease returns the same lease with a new expiry") {
  BlobTable t(Options(), 1);
  Events events;
  events.Attach(t);
  auto first = MustLease(t, D('a'), 0, "n1", kT0);
  REQUIRE(first.kind == LeaseAnswer::Kind::kGranted);
  auto second = MustLease(t, D('a'), 0, "n1", kT0 + seconds(10));
  CHECK(second.kind == LeaseAnswer::Kind::kGranted);
  CHECK(second.lease_id == first.lease_id);
  CHECK(events.Count(BlobEvent::kGranted) == 1);
  CHECK(t.totals().leases == 1);
  // The expiry moved to 10 + 15 s: at 20 s another agent still waits.
  auto other = MustLease(t, D('a'), 0, "n2", kT0 + seconds(20));
  CHECK(other.kind == LeaseAnswer::Kind::kWait);
  CHECK(other.reason == WaitReason::kLeased);
  CHECK(other.recheck_at == kT0 + seconds(25));
}

TEST_CASE("tracker blobs: an expired lease goes to the next agent that asks") {
  BlobTable t(Options(), 1);
  Events events;
  events.Attach(t);
  auto a = MustLease(t, D('a'), 0, "n1", kT0);
  CHECK(MustLease(t, D('a'), 0, "n2", kT0 + seconds(14)).kind == LeaseAnswer::Kind::kWait);
  CHECK(StateOf(t, D('a'), 0, kT0 + seconds(14)) == ChunkState::kLeased);
  auto b = MustLease(t, D('a'), 0, "n2", kT0 + seconds(15));
  CHECK(b.kind == LeaseAnswer::Kind::kGranted);
  CHECK(b.lease_id != a.lease_id);
  CHECK(events.Count(BlobEvent::kExpired) == 1);
  CHECK(t.totals().leases == 1);
  // The periodic sweep expires leases nobody asks about.
  CHECK(t.ExpireLeases(kT0 + seconds(29)) == 0);
  CHECK(t.ExpireLeases(kT0 + seconds(30)) == 1);
  CHECK(t.totals().leases == 0);
  CHECK(t.ActiveLeases(10).empty());
}

TEST_CASE("tracker blobs: renewals extend a lease, after expiry or re-grant the lease is lost") {
  BlobTable t(Options(), 1);
  auto a = MustLease(t, D('a'), 0, "n1", kT0);
  auto ttl = t.Renew(D('a'), 0, "n1", a.lease_id, 1000, kT0 + seconds(10));
  REQUIRE(ttl.has_value());
  CHECK(ttl.value() == seconds(15));
  auto leases = t.ActiveLeases(10);
  REQUIRE(leases.size() == 1);
  CHECK(leases[0].bytes == 1000);
  CHECK(leases[0].agent == "n1");
  CHECK(leases[0].expires == kT0 + seconds(25));
  // Wrong id, wrong agent: lost.
  CHECK(t.Renew(D('a'), 0, "n1", "nope", 0, kT0 + seconds(11)).error().code == BlobErrc::kConflict);
  CHECK(t.Renew(D('a'), 0, "n2", a.lease_id, 0, kT0 + seconds(11)).error().code ==
        BlobErrc::kConflict);
  // Expired (nobody asked in between).
  auto late = t.Renew(D('a'), 0, "n1", a.lease_id, 2000, kT0 + seconds(25));
  REQUIRE_FALSE(late.has_value());
  CHECK(late.error().code == BlobErrc::kConflict);
  CHECK(late.error().message.find("lease lost") == 0);
  // Expired and re-granted to someone else.
  auto b = MustLease(t, D('a'), 0, "n2", kT0 + seconds(26));
  REQUIRE(b.kind == LeaseAnswer::Kind::kGranted);
  auto regranted = t.Renew(D('a'), 0, "n1", a.lease_id, 2000, kT0 + seconds(27));
  REQUIRE_FALSE(regranted.has_value());
  CHECK(regranted.error().message.find("leased again") != std::string::npos);
  // Unknown blob: lost too.
  CHECK(t.Renew(D('z'), 0, "n1", a.lease_id, 0, kT0).error().code == BlobErrc::kConflict);
}

TEST_CASE("tracker blobs: publishing validates the metainfo against the chunk's layout") {
  BlobTable t(Options(), 1);
  std::string right = Metainfo(kChunk, 1);
  auto reason = [&](uint32_t k, std::string_view metainfo) {
    auto r = t.Publish(D('a'), k, "n1", "", Source(), metainfo, kT0);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == BlobErrc::kInvalid);
    return r.error().message;
  };
  // Chunk 3 is 3392 bytes long: a full chunk's torrent has the wrong length.
  CHECK(reason(3, right).find("bytes long") != std::string::npos);
  CHECK(reason(0, Metainfo(kChunk, 1, 2 * kPiece)).find("pieces of") != std::string::npos);
  CHECK(reason(0, "garbage").find("does not parse") != std::string::npos);
  CHECK(reason(0, "").find("metainfo") != std::string::npos);
  CHECK(reason(4, right).find("out of range") != std::string::npos);
  // Nothing was created by the failed attempts.
  CHECK(t.Find(D('a'), kT0).error().code == BlobErrc::kNotFound);
  auto ok = t.Publish(D('a'), 3, "n1", "", Source(), Metainfo(3392, 1), kT0);
  REQUIRE_MESSAGE(ok.has_value(), Why(ok));
  CHECK(StateOf(t, D('a'), 3, kT0) == ChunkState::kReady);
}

TEST_CASE("tracker blobs: publishing under a lease makes the chunk ready and ends the lease") {
  BlobTable t(Options(/*fetchers=*/1), 1);
  Events events;
  events.Attach(t);
  auto a = MustLease(t, D('a'), 1, "n1", kT0);
  REQUIRE(a.kind == LeaseAnswer::Kind::kGranted);
  CHECK(MustLease(t, D('a'), 1, "n2", kT0).reason == WaitReason::kLeased);
  std::string metainfo = Metainfo(kChunk, 7);
  auto p = t.Publish(D('a'), 1, "n1", a.lease_id, Source(), metainfo, kT0 + seconds(3));
  REQUIRE_MESSAGE(p.has_value(), Why(p));
  CHECK(p.value().newly_ready);
  CHECK(p.value().released_lease);
  CHECK_FALSE(p.value().kept_existing);
  CHECK(t.totals().leases == 0);
  CHECK(t.totals().ready == 1);
  CHECK(events.Count(BlobEvent::kReleased) == 1);
  CHECK(events.Count(BlobEvent::kPublished) == 1);
  auto ready = MustLease(t, D('a'), 1, "n2", kT0 + seconds(3));
  REQUIRE(ready.kind == LeaseAnswer::Kind::kReady);
  CHECK(ready.published->metainfo == metainfo);
  auto view = t.Find(D('a'), kT0 + seconds(3));
  REQUIRE(view.has_value());
  CHECK(view.value().chunks[1].state == ChunkState::kReady);
  CHECK(view.value().chunks[1].published->metainfo == metainfo);
  // The old holder's lease is gone; the freed slot goes to another chunk.
  CHECK(
      t.Renew(D('a'), 1, "n1", a.lease_id, 0, kT0 + seconds(4)).error().message.find("is ready") !=
      std::string::npos);
  CHECK(MustLease(t, D('a'), 2, "n2", kT0 + seconds(4)).kind == LeaseAnswer::Kind::kGranted);
}

// Issue 14: publishing a leased chunk was open to anybody, who could end the holder's fetch
// and put their own torrent in its place.
TEST_CASE("tracker blobs: only the lease holder publishes a leased chunk, others get forbidden") {
  BlobTable t(Options(), 1);
  auto a = MustLease(t, D('a'), 0, "n1", kT0);
  auto p = t.Publish(D('a'), 0, "n2", "", Source(), Metainfo(kChunk, 1), kT0);
  REQUIRE_FALSE(p.has_value());
  CHECK(p.error().code == BlobErrc::kForbidden);
  CHECK(p.error().message.find("only the lease holder") != std::string::npos);
  auto guessed = t.Publish(D('a'), 0, "n1", "not-the-id", Source(), Metainfo(kChunk, 1), kT0);
  CHECK(guessed.error().code == BlobErrc::kForbidden);
  CHECK(t.totals().leases == 1);
  CHECK(StateOf(t, D('a'), 0, kT0) == ChunkState::kLeased);
  // The holder's own publication is taken and ends its lease.
  auto own = t.Publish(D('a'), 0, "n1", a.lease_id, Source(), Metainfo(kChunk, 2), kT0);
  REQUIRE(own.has_value());
  CHECK(own.value().released_lease);
  CHECK(t.totals().leases == 0);
  // With no lease live, an unleased publication (re-teaching a restarted tracker) is taken.
  auto teach = t.Publish(D('a'), 1, "n2", "", Source(), Metainfo(kChunk, 3), kT0);
  CHECK(teach.has_value());
}

TEST_CASE("tracker blobs: re-publishing without a lease rebuilds a table, the first wins") {
  BlobTable t(Options(), 1);
  std::string first = Metainfo(kChunk, 1);
  std::string second = Metainfo(kChunk, 2);
  auto p1 = t.Publish(D('a'), 2, "n1", "", Source(), first, kT0);
  REQUIRE(p1.has_value());
  CHECK(p1.value().newly_ready);
  CHECK(t.totals().blobs == 1);
  auto same = t.Publish(D('a'), 2, "n2", "", Source(), first, kT0);
  REQUIRE(same.has_value());
  CHECK_FALSE(same.value().newly_ready);
  CHECK_FALSE(same.value().kept_existing);
  auto other = t.Publish(D('a'), 2, "n3", "", Source(), second, kT0);
  REQUIRE(other.has_value());
  CHECK(other.value().kept_existing);
  CHECK(other.value().published->metainfo == first);
  CHECK(t.totals().ready == 1);
}

TEST_CASE("tracker blobs: bad reports with the ready info-hash from two sources drop the "
          "metainfo, and one source alone does not") {
  BlobTable t(Options(), 1);
  Events events;
  events.Attach(t);
  auto p = t.Publish(D('a'), 0, "n1", "", Source(), Metainfo(kChunk, 1), kT0);
  REQUIRE(p.has_value());
  swarm::Sha1 hash = p.value().published->info_hash;
  swarm::Sha1 other = hash;
  other[0] ^= 1;
  auto report = [&](uint32_t k, const swarm::Sha1& h, std::string_view from) {
    return t.ReportBad(D('a'), k, h, from, kT0);
  };
  // No match: another info-hash, a chunk that is not ready, an unknown blob.
  CHECK(report(0, other, "10.0.0.2").value().needed == 0);
  CHECK(report(1, hash, "10.0.0.2").value().needed == 0);
  CHECK(t.ReportBad(D('z'), 0, hash, "10.0.0.2", kT0).value().needed == 0);
  CHECK(report(9, hash, "10.0.0.2").error().code == BlobErrc::kInvalid);
  // One source, however often it reports, is counted once.
  for (int i = 0; i < 3; ++i) {
    BadReportAnswer a = report(0, hash, "10.0.0.2").value();
    CHECK_FALSE(a.dropped);
    CHECK(a.reporters == 1);
    CHECK(a.needed == 2);
  }
  CHECK(StateOf(t, D('a'), 0, kT0) == ChunkState::kReady);
  CHECK(events.Count(BlobEvent::kDropped) == 0);
  // A second source agrees: dropped, and leased again.
  BadReportAnswer second = report(0, hash, "10.0.0.3").value();
  CHECK(second.dropped);
  CHECK(second.reporters == 2);
  CHECK(events.Count(BlobEvent::kDropped) == 1);
  CHECK(StateOf(t, D('a'), 0, kT0) == ChunkState::kNone);
  CHECK(t.totals().ready == 0);
  CHECK(MustLease(t, D('a'), 0, "n2", kT0).kind == LeaseAnswer::Kind::kGranted);
  CHECK_FALSE(report(0, hash, "10.0.0.4").value().dropped);
}

TEST_CASE("tracker blobs: a re-published chunk starts its bad-report count afresh, and a quorum "
          "of 1 drops on the first report") {
  BlobTable t(Options(), 1);
  auto p = t.Publish(D('a'), 0, "n1", "", Source(), Metainfo(kChunk, 1), kT0);
  REQUIRE(p.has_value());
  const swarm::Sha1 hash = p.value().published->info_hash;
  CHECK(t.ReportBad(D('a'), 0, hash, "10.0.0.2", kT0).value().reporters == 1);
  CHECK(t.ReportBad(D('a'), 0, hash, "10.0.0.3", kT0).value().dropped);
  REQUIRE(t.Publish(D('a'), 0, "n1", "", Source(), Metainfo(kChunk, 1), kT0).has_value());
  BadReportAnswer fresh = t.ReportBad(D('a'), 0, hash, "10.0.0.3", kT0).value();
  CHECK_FALSE(fresh.dropped);
  CHECK(fresh.reporters == 1);

  BlobTableOptions one = Options();
  one.bad_report_quorum = 1;
  BlobTable u(one, 1);
  auto q = u.Publish(D('a'), 0, "n1", "", Source(), Metainfo(kChunk, 1), kT0);
  REQUIRE(q.has_value());
  CHECK(u.ReportBad(D('a'), 0, q.value().published->info_hash, "10.0.0.2", kT0).value().dropped);
}

TEST_CASE("tracker blobs: one bad report drops a ready chunk whose swarm lost every seeder") {
  BlobTable t(Options(), 1);
  std::optional<TimePoint> lost_at;
  t.SetSeedersLostProbe([&lost_at](const swarm::Sha1&) { return lost_at; });
  auto p = t.Publish(D('a'), 0, "n1", "", Source(), Metainfo(kChunk, 0), kT0);
  REQUIRE(p.has_value());
  const swarm::Sha1 hash = p.value().published->info_hash;
  // Seeders live (as far as the tracker knows): one report is only counted.
  CHECK_FALSE(t.ReportBad(D('a'), 0, hash, "10.0.0.2", kT0).value().dropped);
  lost_at = kT0 + std::chrono::seconds(1);  // n1 died; no seeder since
  BadReportAnswer a = t.ReportBad(D('a'), 0, hash, "10.0.0.2", kT0 + std::chrono::seconds(2))
                          .value();
  CHECK(a.dropped);
  CHECK(StateOf(t, D('a'), 0, kT0 + std::chrono::seconds(2)) == ChunkState::kNone);
}

TEST_CASE("tracker blobs: release needs the holder and its lease id") {
  BlobTable t(Options(), 1);
  auto a = MustLease(t, D('a'), 0, "n1", kT0);
  CHECK(t.Release(D('a'), 0, "n2", a.lease_id, kT0).error().code == BlobErrc::kConflict);
  CHECK(t.Release(D('a'), 0, "n1", "other", kT0).error().code == BlobErrc::kConflict);
  CHECK(t.Release(D('z'), 0, "n1", a.lease_id, kT0).error().code == BlobErrc::kConflict);
  REQUIRE(t.Release(D('a'), 0, "n1", a.lease_id, kT0).has_value());
  CHECK(t.Release(D('a'), 0, "n1", a.lease_id, kT0).error().code == BlobErrc::kConflict);
  CHECK(StateOf(t, D('a'), 0, kT0) == ChunkState::kNone);
}

TEST_CASE("tracker blobs: beyond max_blobs the least recently used table without leases goes") {
  BlobTableOptions o = Options();
  o.max_blobs = 3;
  BlobTable t(o, 1);
  Events events;
  events.Attach(t);
  REQUIRE(t.Ensure(D('a'), Source(), kT0).has_value());
  REQUIRE(t.Ensure(D('b'), Source(), kT0).has_value());
  REQUIRE(t.Ensure(D('c'), Source(), kT0).has_value());
  // Order by last use is now b, a, c: c goes first. a holds a lease and is never evicted.
  auto lease = MustLease(t, D('a'), 0, "n1", kT0);
  REQUIRE(lease.kind == LeaseAnswer::Kind::kGranted);
  REQUIRE(t.Find(D('b'), kT0).has_value());  // b is now more recent than c
  REQUIRE(t.Ensure(D('d'), Source(), kT0).has_value());
  CHECK(t.Find(D('c'), kT0).error().code == BlobErrc::kNotFound);
  CHECK(t.Find(D('a'), kT0).has_value());
  CHECK(t.Find(D('b'), kT0).has_value());
  CHECK(t.totals().blobs == 3);
  CHECK(t.totals().chunks == 12);
  CHECK(events.Count(BlobEvent::kEvicted) == 1);
  REQUIRE(t.Ensure(D('e'), Source(), kT0).has_value());  // evicts d (a, b were touched since)
  CHECK(t.Find(D('d'), kT0).error().code == BlobErrc::kNotFound);
  CHECK(t.Find(D('a'), kT0).has_value());
}

TEST_CASE("tracker blobs: when every table holds a lease a new table is refused") {
  BlobTableOptions o = Options();
  o.max_blobs = 2;
  BlobTable t(o, 1);
  REQUIRE(MustLease(t, D('a'), 0, "n1", kT0).kind == LeaseAnswer::Kind::kGranted);
  REQUIRE(MustLease(t, D('b'), 0, "n1", kT0).kind == LeaseAnswer::Kind::kGranted);
  auto full = t.Ensure(D('c'), Source(), kT0);
  REQUIRE_FALSE(full.has_value());
  CHECK(full.error().code == BlobErrc::kFull);
  CHECK(t.Publish(D('c'), 0, "n1", "", Source(), Metainfo(kChunk, 1), kT0).error().code ==
        BlobErrc::kFull);
  // Once the leases expire the tables can go again.
  CHECK(t.Ensure(D('c'), Source(), kT0 + seconds(15)).has_value());
}

TEST_CASE("tracker blobs: the chunk bound evicts too") {
  BlobTableOptions o = Options();
  o.max_chunks_per_blob = 4;
  o.max_chunks = 8;
  BlobTable t(o, 1);
  REQUIRE(t.Ensure(D('a'), Source(), kT0).has_value());
  REQUIRE(t.Ensure(D('b'), Source(), kT0).has_value());
  REQUIRE(t.Ensure(D('c'), Source(kChunk), kT0).has_value());  // one chunk: a goes
  CHECK(t.Find(D('a'), kT0).error().code == BlobErrc::kNotFound);
  CHECK(t.totals().chunks == 5);
}

}  // namespace shoal::tracker

namespace shoal::tracker {

TEST_CASE("tracker blobs: work hands out the lowest free chunk, within the blob cap, then done") {
  BlobTableOptions o = Options(/*fetchers=*/16, /*per_agent=*/2);
  o.max_leases_per_blob = 2;
  BlobTable t(o, 1);
  const Digest d = D('w');
  auto work = [&](const std::string& agent) {
    auto a = t.Work(d, agent, Source(), kT0);
    REQUIRE_MESSAGE(a.has_value(), Why(a));
    return a.value();
  };
  LeaseAnswer a = work("a");
  REQUIRE(a.kind == LeaseAnswer::Kind::kGranted);
  CHECK(a.chunk == 0);
  CHECK(a.begin == 0);
  CHECK(a.length == kChunk);
  // Asking again returns the agent's own lease, not a second one.
  LeaseAnswer again = work("a");
  CHECK(again.kind == LeaseAnswer::Kind::kGranted);
  CHECK(again.chunk == 0);
  CHECK(again.lease_id == a.lease_id);
  LeaseAnswer b = work("b");
  REQUIRE(b.kind == LeaseAnswer::Kind::kGranted);
  CHECK(b.chunk == 1);
  // The blob cap (2) holds a third agent back.
  LeaseAnswer c = work("c");
  CHECK(c.kind == LeaseAnswer::Kind::kWait);
  CHECK(c.reason == WaitReason::kBlobCap);
  // A reader that may not be granted only waits, even for a free chunk.
  auto reader = t.Lease(d, 2, "c", Source(), kT0, /*may_grant=*/false);
  REQUIRE(reader.has_value());
  CHECK(reader.value().kind == LeaseAnswer::Kind::kWait);
  CHECK(reader.value().reason == WaitReason::kUnleased);
  CHECK(StateOf(t, d, 2, kT0) == ChunkState::kNone);
  // Publishing chunk 0 frees a slot: the next free chunk (2) goes to c.
  REQUIRE(t.Publish(d, 0, "a", a.lease_id, Source(), Metainfo(kChunk, 1), kT0).has_value());
  c = work("c");
  REQUIRE(c.kind == LeaseAnswer::Kind::kGranted);
  CHECK(c.chunk == 2);
  REQUIRE(t.Publish(d, 1, "b", b.lease_id, Source(), Metainfo(kChunk, 2), kT0).has_value());
  REQUIRE(t.Publish(d, 2, "c", c.lease_id, Source(), Metainfo(kChunk, 3), kT0).has_value());
  LeaseAnswer last = work("a");
  REQUIRE(last.kind == LeaseAnswer::Kind::kGranted);
  CHECK(last.chunk == 3);
  CHECK(last.length == 3392);
  // Every other chunk is ready and the last one leased: nothing for b to do yet.
  CHECK(work("b").kind == LeaseAnswer::Kind::kWait);
  REQUIRE(t.Publish(d, 3, "a", last.lease_id, Source(), Metainfo(3392, 4), kT0).has_value());
  CHECK(work("b").kind == LeaseAnswer::Kind::kDone);
}

TEST_CASE(
    "tracker blobs: chunk 0 has a head start: other chunks wait until it is ready or it ends") {
  BlobTableOptions o = Options();
  o.head_start = milliseconds(500);
  BlobTable t(o, 1);
  const Digest d = D('h');
  auto work = [&](const std::string& agent, TimePoint now) {
    auto a = t.Work(d, agent, Source(), now);
    REQUIRE_MESSAGE(a.has_value(), Why(a));
    return a.value();
  };
  LeaseAnswer a = work("a", kT0);
  REQUIRE(a.kind == LeaseAnswer::Kind::kGranted);
  REQUIRE(a.chunk == 0);
  // Within the head start, nobody gets chunk 1: not by work, not by an explicit lease.
  LeaseAnswer b = work("b", kT0 + milliseconds(100));
  CHECK(b.kind == LeaseAnswer::Kind::kWait);
  CHECK(b.reason == WaitReason::kHeadStart);
  CHECK(WaitReasonName(b.reason) == "head_start");
  // A long-poll must re-ask when the head start ends.
  CHECK(b.recheck_at == kT0 + milliseconds(500));
  auto direct = t.Lease(d, 1, "b", Source(), kT0 + milliseconds(100));
  REQUIRE(direct.has_value());
  CHECK(direct.value().kind == LeaseAnswer::Kind::kWait);
  CHECK(direct.value().reason == WaitReason::kHeadStart);
  // The holder of chunk 0 asking again still gets its own lease.
  CHECK(work("a", kT0 + milliseconds(200)).lease_id == a.lease_id);
  // Once chunk 0 is ready the head start is over at once.
  REQUIRE(t.Publish(d, 0, "a", a.lease_id, Source(), Metainfo(kChunk, 1), kT0 + milliseconds(300))
              .has_value());
  b = work("b", kT0 + milliseconds(300));
  REQUIRE(b.kind == LeaseAnswer::Kind::kGranted);
  CHECK(b.chunk == 1);

  // On another blob whose chunk 0 is slow, the head start ends after 500 ms anyway.
  const Digest e = D('i');
  auto slow = t.Work(e, "c", Source(), kT0);
  REQUIRE(slow.has_value());
  REQUIRE(slow.value().chunk == 0);
  auto early = t.Work(e, "d", Source(), kT0 + milliseconds(499));
  REQUIRE(early.has_value());
  CHECK(early.value().reason == WaitReason::kHeadStart);
  auto late = t.Work(e, "d", Source(), kT0 + milliseconds(500));
  REQUIRE(late.has_value());
  CHECK(late.value().kind == LeaseAnswer::Kind::kGranted);
  CHECK(late.value().chunk == 1);
}

TEST_CASE("tracker blobs: without a head start chunk 1 is leased next to chunk 0 at once") {
  BlobTable t(Options(), 1);  // head_start 0
  const Digest d = D('j');
  REQUIRE(t.Work(d, "a", Source(), kT0).value().chunk == 0);
  auto b = t.Work(d, "b", Source(), kT0);
  REQUIRE(b.has_value());
  CHECK(b.value().kind == LeaseAnswer::Kind::kGranted);
  CHECK(b.value().chunk == 1);
}

TEST_CASE("tracker blobs: an expired work lease goes to the next agent that asks for work") {
  BlobTable t(Options(), 1);
  const Digest d = D('x');
  auto a = t.Work(d, "a", Source(), kT0);
  REQUIRE(a.has_value());
  REQUIRE(a.value().chunk == 0);
  auto b = t.Work(d, "b", Source(), kT0 + seconds(16));
  REQUIRE(b.has_value());
  CHECK(b.value().kind == LeaseAnswer::Kind::kGranted);
  CHECK(b.value().chunk == 0);
}

TEST_CASE("tracker blobs: a ready chunk whose seeders all left is leased again at once") {
  BlobTable t(Options(), 1);
  Events events;
  events.Attach(t);
  std::set<swarm::Sha1> lost;
  t.SetSeedersLostProbe([&lost](const swarm::Sha1& h) -> std::optional<TimePoint> {
    if (lost.count(h) == 0) return std::nullopt;
    return kT0;
  });
  std::vector<swarm::Sha1> hashes;
  for (uint32_t k = 0; k < 4; ++k) {
    uint64_t length = k < 3 ? kChunk : kSize - 3 * kChunk;
    auto p = t.Publish(D('a'), k, "n1", "", Source(), Metainfo(length, k), kT0);
    REQUIRE(p.has_value());
    hashes.push_back(p.value().published->info_hash);
  }
  CHECK(t.Work(D('a'), "n2", Source(), kT0).value().kind == LeaseAnswer::Kind::kDone);
  CHECK(MustLease(t, D('a'), 2, "n2", kT0).kind == LeaseAnswer::Kind::kReady);

  // n1 evicted the blob: its chunk torrents stopped. A reader is told to wait, not to download.
  lost.insert(hashes[2]);
  lost.insert(hashes[3]);
  auto read = t.Lease(D('a'), 2, "n2", Source(), kT0, /*may_grant=*/false);
  REQUIRE(read.has_value());
  CHECK(read.value().kind == LeaseAnswer::Kind::kWait);
  CHECK(read.value().reason == WaitReason::kUnleased);
  CHECK(events.Count(BlobEvent::kDropped) == 1);
  // Work sees every lost chunk, the first one first.
  auto work = t.Work(D('a'), "n2", Source(), kT0);
  REQUIRE(work.has_value());
  CHECK(work.value().kind == LeaseAnswer::Kind::kGranted);
  CHECK(work.value().chunk == 2);
  CHECK(events.Count(BlobEvent::kDropped) == 2);
  CHECK(t.totals().ready == 2);
  CHECK(StateOf(t, D('a'), 3, kT0) == ChunkState::kNone);
  CHECK(StateOf(t, D('a'), 0, kT0) == ChunkState::kReady);
}

}  // namespace shoal::tracker

namespace shoal::tracker {

// The livelock of issue 13: a restarted agent's leecher announce from the dead seeder's
// address ended the chunk's last seeder; every Work then dropped the chunk at once, leased it
// to the agent that holds it, which re-published it, and round again, thousands of times a
// second. A publication after the loss is a new claim to seed and is kept.
TEST_CASE("tracker blobs: a chunk re-published after its seeders left is kept, not re-leased") {
  BlobTable t(Options(), 1);
  Events events;
  events.Attach(t);
  std::optional<TimePoint> lost_at;
  t.SetSeedersLostProbe([&lost_at](const swarm::Sha1&) { return lost_at; });
  auto first = t.Publish(D('a'), 0, "n1", "", Source(), Metainfo(kChunk, 0), kT0);
  REQUIRE(first.has_value());
  lost_at = kT0 + std::chrono::seconds(1);  // n1 died; the swarm has no seeder since
  auto work = t.Work(D('a'), "n2", Source(), kT0 + std::chrono::seconds(2));
  REQUIRE(work.has_value());
  REQUIRE(work.value().kind == LeaseAnswer::Kind::kGranted);
  CHECK(work.value().chunk == 0);
  CHECK(events.Count(BlobEvent::kDropped) == 1);
  // n2 holds chunk 0 already and re-publishes it under the lease.
  auto again = t.Publish(D('a'), 0, "n2", work.value().lease_id, Source(), Metainfo(kChunk, 0),
                         kT0 + std::chrono::seconds(2));
  REQUIRE(again.has_value());
  CHECK(again.value().newly_ready);
  // A thousand more asks: chunk 0 stays ready, the work is chunk 1, no new drop or publish.
  for (int i = 0; i < 1000; ++i) {
    auto w = t.Work(D('a'), "n2", Source(), kT0 + std::chrono::seconds(3));
    REQUIRE(w.has_value());
    REQUIRE(w.value().kind == LeaseAnswer::Kind::kGranted);
    CHECK(w.value().chunk == 1);
  }
  CHECK(events.Count(BlobEvent::kDropped) == 1);
  CHECK(events.Count(BlobEvent::kPublished) == 2);
  CHECK(events.Count(BlobEvent::kGranted) == 2);
  CHECK(StateOf(t, D('a'), 0, kT0 + std::chrono::seconds(3)) == ChunkState::kReady);
}

TEST_CASE(
    "tracker blobs: fast leases raise the upstream limit toward the max, slow ones lower it") {
  BlobTableOptions o = Options(/*fetchers=*/4, /*per_agent=*/8);
  o.base_upstream_fetchers = 2;
  o.fast_lease_rate = kChunk * 10;  // a full chunk in 100 ms
  BlobTable t(o, 1);
  CHECK(t.upstream_limit() == 2);
  const Digest d = D('f');
  auto work = [&](const std::string& agent, TimePoint now) {
    auto a = t.Work(d, agent, Source(), now);
    REQUIRE_MESSAGE(a.has_value(), Why(a));
    return a.value();
  };
  auto publish = [&](const LeaseAnswer& a, const std::string& agent, TimePoint now) {
    auto p =
        t.Publish(d, a.chunk, agent, a.lease_id, Source(), Metainfo(a.length, a.chunk + 1), now);
    REQUIRE_MESSAGE(p.has_value(), Why(p));
    REQUIRE(p.value().released_lease);
  };
  LeaseAnswer a = work("a", kT0);
  LeaseAnswer b = work("b", kT0);
  REQUIRE(a.kind == LeaseAnswer::Kind::kGranted);
  REQUIRE(b.kind == LeaseAnswer::Kind::kGranted);
  LeaseAnswer c = work("c", kT0);
  CHECK(c.kind == LeaseAnswer::Kind::kWait);
  CHECK(c.reason == WaitReason::kClusterCap);
  // A full chunk in 50 ms: one more lease may run (b and two more).
  publish(a, "a", kT0 + milliseconds(50));
  CHECK(t.upstream_limit() == 3);
  c = work("c", kT0 + milliseconds(50));
  LeaseAnswer e = work("e", kT0 + milliseconds(50));
  REQUIRE(c.kind == LeaseAnswer::Kind::kGranted);
  REQUIRE(e.kind == LeaseAnswer::Kind::kGranted);  // the blob's short last chunk
  CHECK(e.length == 3392);
  CHECK(work("g", kT0 + milliseconds(50)).reason == WaitReason::kClusterCap);
  // Between half the rate and the rate (150 ms for a full chunk): the limit stays.
  publish(b, "b", kT0 + milliseconds(150));
  CHECK(t.upstream_limit() == 3);
  // A short chunk says little about the link, however fast it came.
  publish(e, "e", kT0 + milliseconds(51));
  CHECK(t.upstream_limit() == 3);
  // Slower than half the rate (a full chunk in 1 s): one lease fewer, but never below the base.
  publish(c, "c", kT0 + seconds(1));
  CHECK(t.upstream_limit() == 2);

  // Many fast leases on other blobs: the limit stops at the max.
  for (char name = 'p'; name < 'x'; ++name) {
    const Digest other = D(name);
    auto got = t.Work(other, "h", Source(), kT0 + seconds(2));
    REQUIRE(got.has_value());
    REQUIRE(got.value().kind == LeaseAnswer::Kind::kGranted);
    REQUIRE(t.Publish(other, got.value().chunk, "h", got.value().lease_id, Source(),
                      Metainfo(got.value().length, 1), kT0 + seconds(2) + milliseconds(10))
                .has_value());
  }
  CHECK(t.upstream_limit() == 4);
  // And slow ones take it back down to the base, not below.
  for (char name = 'p'; name < 'x'; ++name) {
    const Digest other = D(name);
    auto got = t.Work(other, "h", Source(), kT0 + seconds(3));
    REQUIRE(got.has_value());
    REQUIRE(got.value().kind == LeaseAnswer::Kind::kGranted);
    REQUIRE(t.Publish(other, got.value().chunk, "h", got.value().lease_id, Source(),
                      Metainfo(got.value().length, 2), kT0 + seconds(13))
                .has_value());
  }
  CHECK(t.upstream_limit() == 2);
}

TEST_CASE("tracker blobs: the per-blob cap grows with the upstream limit, from its own value") {
  BlobTableOptions o = Options(/*fetchers=*/8, /*per_agent=*/8);
  o.base_upstream_fetchers = 2;
  o.max_leases_per_blob = 1;
  o.fast_lease_rate = kChunk * 10;
  BlobTable t(o, 1);
  CHECK(t.blob_lease_limit() == 1);
  const Digest d = D('g');
  auto first = t.Work(d, "a", Source(), kT0);
  REQUIRE(first.has_value());
  auto held = t.Work(d, "b", Source(), kT0);
  REQUIRE(held.has_value());
  CHECK(held.value().reason == WaitReason::kBlobCap);
  // Two fast leases: the limit doubles (2 -> 4), and so does the blob's cap (1 -> 2).
  REQUIRE(t.Publish(d, 0, "a", first.value().lease_id, Source(), Metainfo(kChunk, 1),
                    kT0 + milliseconds(10))
              .has_value());
  auto second = t.Work(d, "a", Source(), kT0 + milliseconds(10));
  REQUIRE(second.has_value());
  REQUIRE(t.Publish(d, 1, "a", second.value().lease_id, Source(), Metainfo(kChunk, 2),
                    kT0 + milliseconds(20))
              .has_value());
  CHECK(t.upstream_limit() == 4);
  CHECK(t.blob_lease_limit() == 2);
  auto x = t.Work(d, "a", Source(), kT0 + milliseconds(20));
  auto y = t.Work(d, "b", Source(), kT0 + milliseconds(20));
  REQUIRE(x.has_value());
  REQUIRE(y.has_value());
  CHECK(x.value().kind == LeaseAnswer::Kind::kGranted);
  CHECK(y.value().kind == LeaseAnswer::Kind::kGranted);
}

TEST_CASE("tracker blobs: without a fast lease rate the limit stays at the base") {
  BlobTableOptions o = Options(/*fetchers=*/8, /*per_agent=*/8);
  o.base_upstream_fetchers = 3;
  BlobTable t(o, 1);
  const Digest d = D('k');
  auto a = t.Work(d, "a", Source(), kT0);
  REQUIRE(a.has_value());
  REQUIRE(
      t.Publish(d, 0, "a", a.value().lease_id, Source(), Metainfo(kChunk, 1), kT0 + milliseconds(1))
          .has_value());
  CHECK(t.upstream_limit() == 3);
  // An unset base is the max (a fixed limit, as before the base existed).
  BlobTable fixed(Options(/*fetchers=*/5), 1);
  CHECK(fixed.upstream_limit() == 5);
}

}  // namespace shoal::tracker
