// lib/swarm's Swarm (libtorrent session + range disk I/O) with the real shoal-tracker: several
// sessions in this process on 127.0.0.1, each on its own io_context thread, moving a blob split
// into chunk torrents between byte ranges of single blob files.

#include <doctest/doctest.h>

#include <utility>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <libtorrent/bdecode.hpp>

#include "lib/auth/tokens.h"
#include "lib/http/url.h"
#include "lib/swarm/chunk_torrent.h"
#include "lib/swarm/file_range.h"
#include "lib/swarm/session.h"
#include "lib/tls/node_ca.h"
#include "lib/tls/peer_tls.h"
#include "tests/support/http_client.h"
#include "tests/support/process.h"
#include "tests/support/tokens.h"
#include "tests/support/tracker.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {

namespace lt = libtorrent;
using std::chrono::milliseconds;
using std::chrono::seconds;
using swarm::ChunkLayout;
using swarm::ChunkTorrent;
using swarm::Sha1;
using swarm::Swarm;

// A running shoal-tracker on 127.0.0.1 with a port picked by the OS.
struct Tracker {
  std::unique_ptr<TrackerProcess> process;
  std::string base;  // http://127.0.0.1:<port>
  std::string key;   // the test cluster's announce key (announce and scrape take ?auth=<key>)
  std::string AnnounceUrl() const { return base + "/announce?auth=" + key; }
  // The same over UDP (BEP 15 on the HTTP port's number, the key as BEP 41 URL data).
  std::string UdpAnnounceUrl() const {
    return "udp://127.0.0.1:" + std::to_string(process->port()) + "/announce?auth=" + key;
  }
};

Tracker StartTracker(const TempDir& /*dir*/) {
  // The shared fixture (tests/support/tracker.h): port file, log, /healthz wait.
  auto started = TrackerProcess::Start();
  REQUIRE_MESSAGE(started.has_value(), Why(started));
  Tracker t{std::move(started.value()), "", ""};
  t.base = t.process->Url();
  t.key = auth::AnnounceKey(Tokens().agent);
  return t;
}

// The tracker's scrape "complete" count for a v1 info-hash; -1 on failure.
int64_t ScrapeComplete(const Tracker& tracker, const Sha1& ih) {
  std::string raw(reinterpret_cast<const char*>(ih.data()), ih.size());
  auto res =
      HttpGet(tracker.base + "/scrape?auth=" + tracker.key + "&info_hash=" + http::QueryEscape(raw),
              {}, seconds(5));
  if (!res || res.value().status != 200) return -1;
  const std::string& body = res.value().body;
  lt::error_code ec;
  lt::bdecode_node root = lt::bdecode(lt::span<const char>(body.data(), body.size()), ec);
  if (ec || root.type() != lt::bdecode_node::dict_t) return -1;
  lt::bdecode_node file =
      root.dict_find_dict("files").dict_find_dict(lt::string_view(raw.data(), raw.size()));
  return file ? file.dict_find_int_value("complete", -1) : -1;
}

std::string RandomBytes(size_t size, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(size, '\0');
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < size; ++i) out[i] = static_cast<char>(rng());
  return out;
}

// The chunk torrents of `blob` under `layout`, built the way the fetching agent builds them
// (SSL torrents of root_cert when it is given).
std::vector<ChunkTorrent> BuildTorrents(const std::string& blob, const ChunkLayout& layout,
                                        const std::string& root_cert = "") {
  std::vector<ChunkTorrent> out;
  for (uint32_t k = 0; k < layout.chunk_count(); ++k) {
    swarm::PieceHasher hasher(layout.chunk_length(k), layout.piece_size);
    REQUIRE(hasher.Update(blob.data() + layout.chunk_begin(k), layout.chunk_length(k)).has_value());
    auto hashes = hasher.Finish();
    REQUIRE(hashes.has_value());
    auto t = swarm::BuildChunkTorrent("blob." + std::to_string(k), layout.chunk_length(k),
                                      layout.piece_size, std::move(hashes.value()), root_cert);
    REQUIRE_MESSAGE(t.has_value(), Why(t));
    out.push_back(std::move(t.value()));
  }
  return out;
}

// `content` at `offset` of a new file at `path` (the bytes before it are junk).
void WriteBlobFile(const std::string& path, const std::string& content, uint64_t offset) {
  WriteFile(path, RandomBytes(offset, 99) + content);
}

// An empty (sparse) file of `size` bytes.
void CreateSparseFile(const std::string& path, uint64_t size) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, static_cast<off_t>(size)) == 0);
  ::close(fd);
}

std::string ReadRange(const std::string& path, uint64_t offset, size_t size) {
  std::string all = ReadFile(path);
  if (all.size() < offset) return "";
  return all.substr(offset, size);
}

// What the callbacks of one chunk reported (written on the node's thread, read by the test).
struct ChunkEvents {
  std::vector<int> piece_calls;                       // per piece
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // per piece, last reported
  int complete_calls = 0;
  std::vector<std::string> errors;
};

// One agent's swarm on its own io_context thread. Swarm methods run on that thread via Call().
class Node {
 public:
  explicit Node(swarm::SwarmOptions options) : work_(boost::asio::make_work_guard(ioc_)) {
    thread_ = std::thread([this] { ioc_.run(); });
    Call([&] { swarm_ = std::make_unique<Swarm>(ioc_, options); });
  }
  ~Node() {
    Call([&] { swarm_.reset(); });
    work_.reset();
    thread_.join();
  }

  // Runs f on the node's thread and returns its result.
  template <typename F>
  auto Call(F f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto result = task.get_future();
    boost::asio::post(ioc_, [&task] { task(); });
    return result.get();
  }

  Swarm& swarm() { return *swarm_; }

  void Start() {
    auto s = Call([&] { return swarm_->Start(); });
    REQUIRE_MESSAGE(s.has_value(), Why(s));
    CHECK(Call([&] { return swarm_->listen_port(); }) != 0);
  }

  // Adds chunk k over [offset, offset + length) of the file at `path`.
  void AddChunk(const ChunkTorrent& t, uint32_t k, const std::string& path, uint64_t offset,
                bool seed, const std::string& tracker_url, bool read_only = false) {
    auto file = swarm::BlobFile::Open(path, !seed && !read_only);
    REQUIRE_MESSAGE(file.has_value(), Why(file));
    {
      std::lock_guard<std::mutex> lock(mu_);
      ChunkEvents& ev = events_[k];
      ev.piece_calls.assign(t.piece_hashes.size(), 0);
      ev.ranges.assign(t.piece_hashes.size(), {0, 0});
    }
    swarm::ChunkSpec spec;
    spec.torrent = t;
    spec.range = swarm::FileRange{file.value(), offset, t.length};
    spec.seed = seed;
    spec.tracker_urls = {tracker_url};
    spec.on_piece = [this, k](uint32_t piece, uint64_t begin, uint64_t end) {
      std::lock_guard<std::mutex> lock(mu_);
      ChunkEvents& ev = events_[k];
      if (piece < ev.piece_calls.size()) {
        ++ev.piece_calls[piece];
        ev.ranges[piece] = {begin, end};
      }
    };
    spec.on_complete = [this, k] {
      std::lock_guard<std::mutex> lock(mu_);
      ++events_[k].complete_calls;
    };
    spec.on_error = [this, k](const Error& e) {
      std::lock_guard<std::mutex> lock(mu_);
      events_[k].errors.push_back(e.message);
    };
    auto added = Call([&] { return swarm_->AddChunk(std::move(spec)); });
    REQUIRE_MESSAGE(added.has_value(), Why(added));
  }

  ChunkEvents Events(uint32_t k) {
    std::lock_guard<std::mutex> lock(mu_);
    return events_[k];
  }
  bool AllComplete(uint32_t chunks) {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t k = 0; k < chunks; ++k) {
      if (events_[k].complete_calls == 0) return false;
    }
    return true;
  }
  std::string Errors() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out;
    for (auto& [k, ev] : events_) {
      for (auto& e : ev.errors) out += "chunk " + std::to_string(k) + ": " + e + "\n";
    }
    return out;
  }
  swarm::SwarmStats Stats() {
    return Call([&] { return swarm_->Stats(); });
  }
  void Stop() {
    Call([&] { swarm_->Stop(); });
  }

 private:
  boost::asio::io_context ioc_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::thread thread_;
  std::unique_ptr<Swarm> swarm_;
  std::mutex mu_;
  std::map<uint32_t, ChunkEvents> events_;
};

swarm::SwarmOptions LoopbackOptions() {
  swarm::SwarmOptions o;
  o.listen_interface = "127.0.0.1:0";
  o.allow_multiple_connections_per_ip = true;
  return o;
}

// Waits until the tracker lists a seeder for every chunk (so a later leecher gets it).
void WaitForSeeders(const Tracker& tracker, const std::vector<ChunkTorrent>& torrents) {
  bool seeded = WaitUntil(
      [&] {
        for (auto& t : torrents) {
          if (ScrapeComplete(tracker, t.info_hash) < 1) return false;
        }
        return true;
      },
      seconds(10), milliseconds(50));
  REQUIRE_MESSAGE(seeded, "seeder did not announce: " << tracker.process->LogTail());
}

// Every piece of every chunk reported exactly once with its range; every chunk complete once.
void CheckCallbacks(Node& node, const ChunkLayout& layout) {
  for (uint32_t k = 0; k < layout.chunk_count(); ++k) {
    ChunkEvents ev = node.Events(k);
    CHECK(ev.complete_calls == 1);
    CHECK(ev.errors.empty());
    REQUIRE(ev.piece_calls.size() == layout.piece_count(k));
    for (uint32_t p = 0; p < layout.piece_count(k); ++p) {
      CHECK_MESSAGE(ev.piece_calls[p] == 1, "chunk " << k << " piece " << p);
      uint64_t begin = uint64_t{p} * layout.piece_size;
      CHECK(ev.ranges[p].first == begin);
      CHECK(ev.ranges[p].second ==
            std::min<uint64_t>(begin + layout.piece_size, layout.chunk_length(k)));
    }
  }
}

const ChunkLayout kLayout{
    .blob_size = (24ull << 20) + 123, .chunk_size = 8ull << 20, .piece_size = 256u << 10};

// Adds every chunk of kLayout to `node` as a download into the file at `path` and waits until
// all are complete, without an error (REQUIREd); returns how many seconds that took.
double DownloadAll(Node& node, const std::vector<ChunkTorrent>& torrents, const std::string& path,
                   const Tracker& tracker) {
  auto started = std::chrono::steady_clock::now();
  for (uint32_t k = 0; k < torrents.size(); ++k) {
    node.AddChunk(torrents[k], k, path, kLayout.chunk_begin(k), false, tracker.AnnounceUrl());
  }
  const auto n = static_cast<uint32_t>(torrents.size());
  bool done = WaitUntil([&] { return node.AllComplete(n) || !node.Errors().empty(); },
                        seconds(20), milliseconds(10));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  REQUIRE_MESSAGE(done, "download did not finish; tracker:\n" << tracker.process->LogTail());
  REQUIRE_MESSAGE(node.Errors().empty(), node.Errors());
  return secs;
}

}  // namespace

TEST_CASE("swarm session: a blob's chunk torrents download in parallel into one file") {
  REQUIRE(kLayout.Validate().has_value());
  TempDir dir("shoal-swarm");
  Tracker tracker = StartTracker(dir);
  const std::string blob = RandomBytes(kLayout.blob_size, 1);
  const std::vector<ChunkTorrent> torrents = BuildTorrents(blob, kLayout);
  REQUIRE(torrents.size() == 4);  // the last chunk is 123 bytes

  // The seeder's blob sits at an offset inside its file; the downloader's file is empty.
  const uint64_t kSeedOffset = 4096 + 17;
  WriteBlobFile(dir.Sub("seed.blob"), blob, kSeedOffset);
  CreateSparseFile(dir.Sub("leech.blob"), kLayout.blob_size);

  Node seeder(LoopbackOptions());
  seeder.Start();
  for (uint32_t k = 0; k < torrents.size(); ++k) {
    seeder.AddChunk(torrents[k], k, dir.Sub("seed.blob"), kSeedOffset + kLayout.chunk_begin(k),
                    true, tracker.AnnounceUrl());
  }
  CHECK(seeder.Stats().torrents == 4);
  WaitForSeeders(tracker, torrents);

  Node leecher(LoopbackOptions());
  leecher.Start();
  double secs = DownloadAll(leecher, torrents, dir.Sub("leech.blob"), tracker);
  MESSAGE("24 MiB over 4 chunk torrents in " << secs << " s (" << (kLayout.blob_size / secs / 1e6)
                                             << " MB/s)");

  CHECK(ReadFile(dir.Sub("leech.blob")) == blob);
  CHECK(ReadRange(dir.Sub("seed.blob"), kSeedOffset, blob.size()) == blob);  // untouched
  CheckCallbacks(leecher, kLayout);
  for (uint32_t k = 0; k < torrents.size(); ++k) {
    CHECK(seeder.Events(k).piece_calls == std::vector<int>(kLayout.piece_count(k), 0));
    CHECK(seeder.Events(k).complete_calls == 0);
  }
  swarm::SwarmStats ls = leecher.Stats();
  CHECK(ls.downloaded >= kLayout.blob_size);
  CHECK(ls.hash_failures == 0);
  CHECK(ls.torrents == 4);
  REQUIRE(ls.chunks.size() == 4);
  for (const auto& c : ls.chunks) {
    CHECK(c.pieces_have == c.pieces_total);
    CHECK(c.seeding);
  }
  CHECK(seeder.Stats().uploaded >= kLayout.blob_size);

  // Removing a chunk keeps its bytes counted and the file untouched; it can be added again.
  leecher.Call([&] { leecher.swarm().RemoveChunk(torrents[0].info_hash); });
  CHECK_FALSE(leecher.Call([&] { return leecher.swarm().HasChunk(torrents[0].info_hash); }));
  swarm::SwarmStats after = leecher.Stats();
  CHECK(after.torrents == 3);
  CHECK(after.downloaded == ls.downloaded);
  CHECK(ReadFile(dir.Sub("leech.blob")) == blob);
  leecher.AddChunk(torrents[0], 0, dir.Sub("leech.blob"), 0, true, tracker.AnnounceUrl());
  CHECK(leecher.Stats().torrents == 4);

  // Adding the same info-hash twice is an error.
  auto file = swarm::BlobFile::Open(dir.Sub("leech.blob"), false);
  REQUIRE(file.has_value());
  auto dup = leecher.Call([&] {
    swarm::ChunkSpec spec;
    spec.torrent = torrents[1];
    spec.range = swarm::FileRange{file.value(), kLayout.chunk_begin(1), torrents[1].length};
    spec.seed = true;
    return leecher.swarm().AddChunk(std::move(spec));
  });
  REQUIRE_FALSE(dup.has_value());
  CHECK(dup.error().code == ErrorCode::kInvalidArgument);

  leecher.Stop();
  seeder.Stop();
  CHECK(leecher.Call([&] { return leecher.swarm().listen_port(); }) == 0);
}

TEST_CASE("swarm session: a corrupt seeder's bad piece fails its hash and a good seeder fixes it") {
  TempDir dir("shoal-swarm-corrupt");
  Tracker tracker = StartTracker(dir);
  const std::string blob = RandomBytes(kLayout.blob_size, 2);
  const std::vector<ChunkTorrent> torrents = BuildTorrents(blob, kLayout);

  // The bad seeder claims to have everything, but chunk 1's piece 5 has one flipped byte.
  std::string corrupt = blob;
  const uint64_t bad_at = kLayout.chunk_begin(1) + 5ull * kLayout.piece_size + 1000;
  corrupt[bad_at] = static_cast<char>(corrupt[bad_at] ^ 0x55);
  WriteBlobFile(dir.Sub("bad.blob"), corrupt, 0);
  WriteBlobFile(dir.Sub("good.blob"), blob, 0);
  CreateSparseFile(dir.Sub("leech.blob"), kLayout.blob_size);

  Node bad(LoopbackOptions());
  bad.Start();
  for (uint32_t k = 0; k < torrents.size(); ++k) {
    bad.AddChunk(torrents[k], k, dir.Sub("bad.blob"), kLayout.chunk_begin(k), true,
                 tracker.AnnounceUrl());
  }
  WaitForSeeders(tracker, torrents);

  Node leecher(LoopbackOptions());
  leecher.Start();
  for (uint32_t k = 0; k < torrents.size(); ++k) {
    leecher.AddChunk(torrents[k], k, dir.Sub("leech.blob"), kLayout.chunk_begin(k), false,
                     tracker.AnnounceUrl());
  }
  // Only the bad seeder so far: the piece fails, and the other chunks complete.
  bool failed =
      WaitUntil([&] { return leecher.Stats().hash_failures >= 1; }, seconds(15), milliseconds(20));
  REQUIRE_MESSAGE(failed, "no hash failure; tracker:\n" << tracker.process->LogTail());
  bool others = WaitUntil(
      [&] {
        return leecher.Events(0).complete_calls == 1 && leecher.Events(2).complete_calls == 1 &&
               leecher.Events(3).complete_calls == 1;
      },
      seconds(15), milliseconds(20));
  CHECK(others);
  CHECK(leecher.Events(1).complete_calls == 0);
  CHECK(leecher.Events(1).piece_calls[5] == 0);

  // A good seeder joins; the tracker hands it the leecher, which completes chunk 1 from it.
  Node good(LoopbackOptions());
  good.Start();
  for (uint32_t k = 0; k < torrents.size(); ++k) {
    good.AddChunk(torrents[k], k, dir.Sub("good.blob"), kLayout.chunk_begin(k), true,
                  tracker.AnnounceUrl());
  }
  bool done = WaitUntil([&] { return leecher.AllComplete(4); }, seconds(15), milliseconds(20));
  REQUIRE_MESSAGE(done, "chunk 1 never completed; errors: " << leecher.Errors() << "tracker:\n"
                                                            << tracker.process->LogTail());
  CHECK(ReadFile(dir.Sub("leech.blob")) == blob);
  CheckCallbacks(leecher, kLayout);
  swarm::SwarmStats st = leecher.Stats();
  CHECK(st.hash_failures >= 1);
  MESSAGE("hash failures " << st.hash_failures << ", peers banned " << st.peers_banned);
  CHECK(good.Stats().uploaded >= kLayout.piece_size);

  leecher.Stop();
  good.Stop();
  bad.Stop();
}

namespace {

// A seeds, B downloads from A, A leaves, C downloads from B: every chunk torrent announces to
// `url` (started, completed, stopped and regular announces).
void SeedChain(const TempDir& dir, const Tracker& tracker, const std::string& url) {
  const std::string blob = RandomBytes(kLayout.blob_size, 3);
  const std::vector<ChunkTorrent> torrents = BuildTorrents(blob, kLayout);
  WriteBlobFile(dir.Sub("a.blob"), blob, 0);
  CreateSparseFile(dir.Sub("b.blob"), kLayout.blob_size);
  CreateSparseFile(dir.Sub("c.blob"), kLayout.blob_size);

  Node a(LoopbackOptions());
  a.Start();
  for (uint32_t k = 0; k < torrents.size(); ++k) {
    a.AddChunk(torrents[k], k, dir.Sub("a.blob"), kLayout.chunk_begin(k), true,
               url);
  }
  WaitForSeeders(tracker, torrents);

  Node b(LoopbackOptions());
  b.Start();
  for (uint32_t k = 0; k < torrents.size(); ++k) {
    b.AddChunk(torrents[k], k, dir.Sub("b.blob"), kLayout.chunk_begin(k), false,
               url);
  }
  REQUIRE(WaitUntil([&] { return b.AllComplete(4); }, seconds(15), milliseconds(10)));
  CHECK(ReadFile(dir.Sub("b.blob")) == blob);

  // A leaves (its stop announce removes it from the tracker); B's completed announces made it
  // a seeder of every chunk, so C can only get the blob from B.
  a.Stop();
  bool b_seeds = WaitUntil(
      [&] {
        for (auto& t : torrents) {
          if (ScrapeComplete(tracker, t.info_hash) != 1) return false;
        }
        return true;
      },
      seconds(10), milliseconds(50));
  REQUIRE_MESSAGE(b_seeds, tracker.process->LogTail());

  Node c(LoopbackOptions());
  c.Start();
  for (uint32_t k = 0; k < torrents.size(); ++k) {
    c.AddChunk(torrents[k], k, dir.Sub("c.blob"), kLayout.chunk_begin(k), false,
               url);
  }
  bool done = WaitUntil([&] { return c.AllComplete(4); }, seconds(15), milliseconds(10));
  REQUIRE_MESSAGE(done, "C did not finish; errors: " << c.Errors() << "tracker:\n"
                                                     << tracker.process->LogTail());
  CHECK(ReadFile(dir.Sub("c.blob")) == blob);
  CheckCallbacks(c, kLayout);
  // B counts a block as uploaded when its socket write completes, which may run after C has the
  // block (CI once read B 5 blocks short right after C finished): wait briefly for the count.
  const bool b_counted = WaitUntil([&] { return b.Stats().uploaded >= kLayout.blob_size; },
                                   seconds(5), milliseconds(20));
  CHECK_MESSAGE(b_counted, "B uploaded " << b.Stats().uploaded << " of " << kLayout.blob_size);
  CHECK(c.Stats().downloaded >= kLayout.blob_size);

  c.Stop();
  b.Stop();
}

}  // namespace

TEST_CASE("swarm session: a downloader seeds what it downloaded to the next one") {
  TempDir dir("shoal-swarm-chain");
  Tracker tracker = StartTracker(dir);
  SeedChain(dir, tracker, tracker.AnnounceUrl());
  CHECK(tracker.process->Metric("shoal_tracker_http_requests_total", {{"route", "announce"}}) > 0);
}

TEST_CASE("swarm session: over UDP announces (BEP 15) a downloader seeds what it downloaded to the "
          "next one, with no announce over HTTP") {
  TempDir dir("shoal-swarm-chain-udp");
  Tracker tracker = StartTracker(dir);
  SeedChain(dir, tracker, tracker.UdpAnnounceUrl());
  const double udp_ok = tracker.process->Metric("shoal_tracker_udp_requests_total",
                                                {{"action", "announce"}, {"result", "ok"}});
  // Every chunk torrent: A's, B's and C's first announces, B's completed and A's stopped (sent
  // before A's session closed its UDP socket).
  CHECK(udp_ok >= 5.0 * kLayout.chunk_count());
  CHECK(tracker.process->Metric("shoal_tracker_announces_total", {{"event", "stopped"}}) >=
        kLayout.chunk_count());
  CHECK(tracker.process->Metric("shoal_tracker_http_requests_total", {{"route", "announce"}}) ==
        0);
  CHECK(tracker.process->Metric("shoal_tracker_udp_requests_total",
                                {{"result", "bad_connection_id"}}) == 0);
}

// A tracker, a random blob of kLayout cut into chunk torrents, and the blob in seed.blob.
struct SeededBlob {
  SeededBlob(const char* name, uint32_t seed)
      : dir(name),
        tracker(StartTracker(dir)),
        blob(RandomBytes(kLayout.blob_size, seed)),
        torrents(BuildTorrents(blob, kLayout)),
        chunks(static_cast<uint32_t>(torrents.size())) {
    WriteBlobFile(dir.Sub("seed.blob"), blob, 0);
  }
  TempDir dir;
  Tracker tracker;
  std::string blob;
  std::vector<ChunkTorrent> torrents;
  uint32_t chunks;
};

TEST_CASE("swarm session: a leecher whose announce found no peer re-announces when it gets no "
          "payload, and reaches a seeder that came later") {
  // The seeder makes no outgoing connections (a libtorrent override), so the leecher must
  // learn of it from the tracker: libtorrent alone would wait for the announce interval.
  SeededBlob w("shoal-swarm-stall", 6);
  // Named references, not a structured binding: clang 14 cannot capture those in lambdas.
  TempDir& dir = w.dir;
  Tracker& tracker = w.tracker;
  const std::string& blob = w.blob;
  const std::vector<ChunkTorrent>& torrents = w.torrents;
  const uint32_t chunks = w.chunks;

  auto run = [&](int stall_reannounce_ms, const std::string& name, seconds limit) {
    swarm::SwarmOptions options = LoopbackOptions();
    options.stall_reannounce_ms = stall_reannounce_ms;
    Node leecher(options);
    leecher.Start();
    const std::string path = dir.Sub(name + ".blob");
    CreateSparseFile(path, kLayout.blob_size);
    for (uint32_t k = 0; k < chunks; ++k) {
      leecher.AddChunk(torrents[k], k, path, kLayout.chunk_begin(k), false, tracker.AnnounceUrl());
    }
    // Every chunk's first announce answered, with no peer in it.
    bool announced = WaitUntil(
        [&] {
          return leecher.Call([&] {
            for (const auto& t : torrents) {
              auto a = leecher.swarm().Announces(t.info_hash);
              if (!a || a->replies == 0) return false;
            }
            return true;
          });
        },
        seconds(10), milliseconds(20));
    REQUIRE(announced);

    swarm::SwarmOptions seeder_options = LoopbackOptions();
    seeder_options.libtorrent_settings = {"seeding_outgoing_connections=false"};
    Node seeder(seeder_options);
    seeder.Start();
    for (uint32_t k = 0; k < chunks; ++k) {
      seeder.AddChunk(torrents[k], k, dir.Sub("seed.blob"), kLayout.chunk_begin(k), true,
                      tracker.AnnounceUrl());
    }
    WaitForSeeders(tracker, torrents);
    bool done = WaitUntil([&] { return leecher.AllComplete(chunks) || !leecher.Errors().empty(); },
                          limit, milliseconds(20));
    const uint64_t reannounces = leecher.Stats().stall_reannounces;
    const std::string file = ReadFile(path);
    leecher.Stop();
    seeder.Stop();
    return std::make_tuple(done, reannounces, file == blob);
  };

  SUBCASE("with stall re-announces (500 ms), the leecher finishes within seconds") {
    auto [done, reannounces, same] = run(500, "fast", seconds(15));
    CHECK(done);
    CHECK(same);
    CHECK(reannounces >= 1);
  }
  SUBCASE("without them, it still waits after 5 s: the case they exist for") {
    auto [done, reannounces, same] = run(0, "off", seconds(5));
    CHECK_FALSE(done);
    CHECK(reannounces == 0);
  }
}

TEST_CASE("swarm session: an announce to a UDP tracker that never answers counts as sent, and "
          "as neither answered nor failed until libtorrent's receive timeout") {
  // What a datagram lost on a full link looks like to the agent: the chunk fetcher must wait
  // for it (libtorrent times it out and the swarm asks again), not take it for a host that
  // cannot reach the tracker, which sent the rest of the blob straight upstream.
  SeededBlob w("shoal-swarm-lost-announce", 8);
  int hole = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  REQUIRE(hole >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(hole, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(hole, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const std::string url = "udp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) + "/announce";

  Node leecher(LoopbackOptions());
  leecher.Start();
  CreateSparseFile(w.dir.Sub("l.blob"), kLayout.blob_size);
  const auto started = std::chrono::steady_clock::now();
  leecher.AddChunk(w.torrents[0], 0, w.dir.Sub("l.blob"), kLayout.chunk_begin(0), false, url);
  const Sha1 ih = w.torrents[0].info_hash;
  auto announces = [&] { return leecher.Call([&] { return *leecher.swarm().Announces(ih); }); };
  REQUIRE(WaitUntil([&] { return announces().sent >= 1; }, seconds(5), milliseconds(20)));
  swarm::ChunkAnnounces in_flight = announces();
  CHECK(in_flight.replies == 0);
  CHECK(in_flight.errors == 0);
  // libtorrent's receive timeout (5 s) turns it into an error: a tracker that times out.
  REQUIRE(WaitUntil([&] { return announces().errors >= 1; }, seconds(10), milliseconds(50)));
  CHECK(std::chrono::steady_clock::now() - started >= seconds(4));
  swarm::ChunkAnnounces failed = announces();
  CHECK(failed.replies == 0);
  CHECK_FALSE(failed.unroutable);
  leecher.Stop();
  ::close(hole);
}

TEST_CASE("swarm session: a peer with every slot taken closes a newcomer's connection, and the "
          "newcomer's chunk records it as a live but busy swarm") {
  SeededBlob w("shoal-swarm-busy", 7);
  TempDir& dir = w.dir;
  Tracker& tracker = w.tracker;
  const std::vector<ChunkTorrent>& torrents = w.torrents;
  swarm::SwarmOptions one = LoopbackOptions();
  one.peers_per_chunk = 1;
  Node seeder(one);
  seeder.Start();
  seeder.AddChunk(torrents[0], 0, dir.Sub("seed.blob"), kLayout.chunk_begin(0), true,
                  tracker.AnnounceUrl());
  WaitForSeeders(tracker, {torrents[0]});
  // A slow leecher holds the seeder's one slot for the whole test (8 MiB at 200 kB/s).
  swarm::SwarmOptions slow = one;
  slow.libtorrent_settings = {"download_rate_limit=200000"};
  Node holder(slow);
  holder.Start();
  CreateSparseFile(dir.Sub("holder.blob"), kLayout.blob_size);
  holder.AddChunk(torrents[0], 0, dir.Sub("holder.blob"), kLayout.chunk_begin(0), false,
                  tracker.AnnounceUrl());
  auto connected = [&](Node& n) {
    return n.Call([&] { return n.swarm().PeersNow(torrents[0].info_hash); });
  };
  REQUIRE(WaitUntil([&] { return connected(holder) == 1; }, seconds(10), milliseconds(20)));
  // Announces() carries the count sampled each second while the chunk downloads.
  auto sampled = [&](Node& n) {
    return n.Call([&] { return n.swarm().Announces(torrents[0].info_hash)->connected; });
  };
  CHECK(WaitUntil([&] { return sampled(holder) == 1; }, seconds(3), milliseconds(20)));

  Node newcomer(one);
  newcomer.Start();
  CreateSparseFile(dir.Sub("new.blob"), kLayout.blob_size);
  newcomer.AddChunk(torrents[0], 0, dir.Sub("new.blob"), kLayout.chunk_begin(0), false,
                    tracker.AnnounceUrl());
  // Both peers the newcomer can learn of have their one slot taken: whichever it reaches
  // closes a connection (the newcomer's, or by libtorrent's peer rank the one it had), so some
  // node saw its peer close a connection after connecting (the closer's own close does not
  // count), and no session ever held two peers. Under load (about 1 run in 12 with four at
  // once) the pair connect both ways at the same moment and one end drops the extra
  // connection before the other has tied it to the torrent, which libtorrent reports to
  // nobody; the seeder then serves the newcomer, which completes without ever being turned
  // away. Such a run shows only the limit.
  auto closed = [&](Node& n) {
    return n.Call([&] {
      return n.swarm().Announces(torrents[0].info_hash)->last_peer_closed !=
             std::chrono::steady_clock::time_point{};
    });
  };
  auto completed = [&](Node& n) {
    return n.Call([&] {
      for (const swarm::ChunkStats& c : n.swarm().Stats().chunks) {
        if (c.info_hash == torrents[0].info_hash) return c.seeding;
      }
      return false;
    });
  };
  int most = 0;
  bool seen = WaitUntil(
      [&] {
        for (Node* n : {&seeder, &holder, &newcomer}) most = std::max(most, connected(*n));
        return closed(newcomer) || closed(holder) || closed(seeder) || completed(newcomer);
      },
      seconds(15), milliseconds(20));
  CHECK(seen);
  if (!closed(newcomer) && !closed(holder) && !closed(seeder)) {
    MESSAGE("no node was turned away: the newcomer got a slot and completed");
  }
  CHECK(most <= 1);
  newcomer.Stop();
  holder.Stop();
  seeder.Stop();
}

TEST_CASE("swarm session: with two peers per chunk no session holds more, and six leechers get "
          "the blob through each other") {
  SeededBlob w("shoal-swarm-degree", 5);
  // Named references, not a structured binding: clang 14 cannot capture those in lambdas.
  TempDir& dir = w.dir;
  Tracker& tracker = w.tracker;
  const std::string& blob = w.blob;
  const std::vector<ChunkTorrent>& torrents = w.torrents;
  const uint32_t chunks = w.chunks;
  swarm::SwarmOptions options = LoopbackOptions();
  options.peers_per_chunk = 2;

  Node seeder(options);
  seeder.Start();
  for (uint32_t k = 0; k < chunks; ++k) {
    seeder.AddChunk(torrents[k], k, dir.Sub("seed.blob"), kLayout.chunk_begin(k), true,
                    tracker.AnnounceUrl());
  }
  WaitForSeeders(tracker, torrents);

  constexpr int kLeechers = 6;
  std::vector<std::unique_ptr<Node>> leechers;
  for (int i = 0; i < kLeechers; ++i) {
    leechers.push_back(std::make_unique<Node>(options));
    leechers.back()->Start();
    const std::string path = dir.Sub("l" + std::to_string(i) + ".blob");
    CreateSparseFile(path, kLayout.blob_size);
    for (uint32_t k = 0; k < chunks; ++k) {
      leechers.back()->AddChunk(torrents[k], k, path, kLayout.chunk_begin(k), false,
                                tracker.AnnounceUrl());
    }
  }
  // The most peers any session had on any chunk, sampled until every leecher is done.
  auto most_peers = [&](Node& node) {
    return node.Call([&] {
      int most = 0;
      for (const auto& t : torrents) {
        most = std::max(most, node.swarm().PeersNow(t.info_hash));
      }
      return most;
    });
  };
  int most = 0;
  bool done = WaitUntil(
      [&] {
        most = std::max(most, most_peers(seeder));
        bool all = true;
        for (auto& l : leechers) {
          most = std::max(most, most_peers(*l));
          all = all && (l->AllComplete(chunks) || !l->Errors().empty());
        }
        return all;
      },
      seconds(40), milliseconds(20));
  REQUIRE_MESSAGE(done, "leechers did not finish; tracker:\n" << tracker.process->LogTail());
  CHECK(most <= 2);
  CHECK(most >= 1);
  // About one run in three leaves a leecher whose peers on some chunk have nothing it needs
  // (they met before the seeder reached them); the stall re-announce gets it out in seconds.
  uint64_t stall_reannounces = 0;
  for (auto& l : leechers) stall_reannounces += l->Stats().stall_reannounces;
  MESSAGE("stall re-announces over all leechers: " << stall_reannounces);
  uint64_t leecher_uploads = 0;
  for (int i = 0; i < kLeechers; ++i) {
    INFO("leecher " << i);
    REQUIRE_MESSAGE(leechers[i]->Errors().empty(), leechers[i]->Errors());
    CHECK(ReadFile(dir.Sub("l" + std::to_string(i) + ".blob")) == blob);
    CheckCallbacks(*leechers[i], kLayout);
    leecher_uploads += leechers[i]->Stats().uploaded;
  }
  // Two connections per chunk on the seeder cannot feed six leechers alone.
  CHECK(leecher_uploads >= kLayout.blob_size);
  for (auto& l : leechers) l->Stop();
  seeder.Stop();
}

TEST_CASE("swarm session: a disk error while downloading reaches on_error") {
  TempDir dir("shoal-swarm-diskerr");
  Tracker tracker = StartTracker(dir);
  const std::string blob = RandomBytes(kLayout.blob_size, 5);
  const std::vector<ChunkTorrent> torrents = BuildTorrents(blob, kLayout);
  WriteBlobFile(dir.Sub("seed.blob"), blob, 0);
  CreateSparseFile(dir.Sub("leech.blob"), kLayout.blob_size);

  Node seeder(LoopbackOptions());
  seeder.Start();
  seeder.AddChunk(torrents[0], 0, dir.Sub("seed.blob"), 0, true, tracker.AnnounceUrl());
  WaitForSeeders(tracker, {torrents[0]});

  // The downloader's file is open read-only: every pwrite fails with EBADF.
  Node leecher(LoopbackOptions());
  leecher.Start();
  leecher.AddChunk(torrents[0], 0, dir.Sub("leech.blob"), 0, false, tracker.AnnounceUrl(),
                   /*read_only=*/true);
  bool failed =
      WaitUntil([&] { return !leecher.Events(0).errors.empty(); }, seconds(15), milliseconds(20));
  REQUIRE_MESSAGE(failed, "no error reported; tracker:\n" << tracker.process->LogTail());
  ChunkEvents ev = leecher.Events(0);
  CHECK(ev.errors.size() == 1);
  CHECK(ev.errors[0].find("blob.0") != std::string::npos);
  CHECK(ev.complete_calls == 0);
  MESSAGE("on_error: " << ev.errors[0]);
  CHECK(ReadFile(dir.Sub("leech.blob")) == std::string(kLayout.blob_size, '\0'));
  leecher.Stop();
  seeder.Stop();
}

// A CA in dir/<name> (as the chart's cluster peer CA) and an agent's peer TLS minted from it.
tls::PeerTls PeerTlsFrom(const TempDir& dir, const std::string& ca, const std::string& agent) {
  auto made = tls::NodeCa::LoadOrCreate(dir.Sub(ca), "test peer CA " + ca);
  REQUIRE_MESSAGE(made.has_value(), Why(made));
  auto minted = tls::MintPeerTls(dir.Sub(ca) + "/ca.crt", dir.Sub(ca) + "/ca.key", agent);
  REQUIRE_MESSAGE(minted.has_value(), Why(minted));
  return minted.value();
}

swarm::SwarmOptions TlsOptions(tls::PeerTls peer_tls) {
  swarm::SwarmOptions o = LoopbackOptions();
  o.tls = std::move(peer_tls);
  return o;
}

// What a plain BitTorrent client gets from a TLS swarm port: the 68-byte handshake for
// info_hash, then whatever comes back within a second (nothing, as the server wants TLS).
std::string PlainHandshake(uint16_t port, const Sha1& info_hash) {
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::socket sock(ioc);
  boost::system::error_code ec;
  sock.connect({boost::asio::ip::make_address("127.0.0.1"), port}, ec);
  REQUIRE_MESSAGE(!ec, ec.message());
  std::string hs = std::string(1, '\x13') + "BitTorrent protocol" + std::string(8, '\0');
  hs.append(reinterpret_cast<const char*>(info_hash.data()), info_hash.size());
  hs += "-XX0001-outsider0001";
  boost::asio::write(sock, boost::asio::buffer(hs), ec);
  std::string got;
  char buf[512];
  auto deadline = std::chrono::steady_clock::now() + seconds(1);
  sock.non_blocking(true);
  while (std::chrono::steady_clock::now() < deadline) {
    size_t n = sock.read_some(boost::asio::buffer(buf), ec);
    if (ec == boost::asio::error::would_block) {
      std::this_thread::sleep_for(milliseconds(20));
      continue;
    }
    if (ec) break;  // closed
    got.append(buf, n);
  }
  return got;
}

TEST_CASE("swarm session: with peer TLS only the cluster CA's agents exchange chunks") {
  TempDir dir("shoal-swarm-tls");
  Tracker tracker = StartTracker(dir);
  const std::string blob = RandomBytes(kLayout.blob_size, 7);
  tls::PeerTls seeder_tls = PeerTlsFrom(dir, "cluster-ca", "seeder");
  const std::vector<ChunkTorrent> torrents = BuildTorrents(blob, kLayout, seeder_tls.ca_pem);
  // The CA is part of each chunk's info-hash: the plain torrent of the same bytes is another.
  CHECK(torrents[0].info_hash != BuildTorrents(blob, kLayout)[0].info_hash);
  WriteBlobFile(dir.Sub("seed.blob"), blob, 0);
  CreateSparseFile(dir.Sub("leech.blob"), kLayout.blob_size);
  CreateSparseFile(dir.Sub("outsider.blob"), kLayout.blob_size);

  Node seeder(TlsOptions(seeder_tls));
  seeder.Start();
  for (uint32_t k = 0; k < torrents.size(); ++k) {
    seeder.AddChunk(torrents[k], k, dir.Sub("seed.blob"), kLayout.chunk_begin(k), true,
                    tracker.AnnounceUrl());
  }
  WaitForSeeders(tracker, torrents);
  const uint16_t seeder_port = seeder.Call([&] { return seeder.swarm().listen_port(); });

  // An outsider with the metainfo, the announce key and a certificate from another CA: every
  // connection ends in the TLS handshake, in both directions, and no byte moves.
  tls::PeerTls foreign = PeerTlsFrom(dir, "other-ca", "outsider");
  foreign.ca_pem = seeder_tls.ca_pem;  // so that it can add the cluster's torrents at all
  Node outsider(TlsOptions(foreign));
  outsider.Start();
  for (uint32_t k = 0; k < torrents.size(); ++k) {
    outsider.AddChunk(torrents[k], k, dir.Sub("outsider.blob"), kLayout.chunk_begin(k), false,
                      tracker.AnnounceUrl());
  }
  // A plain BitTorrent client on the swarm port gets no handshake back.
  CHECK(PlainHandshake(seeder_port, torrents[0].info_hash).empty());
  // A plain swarm cannot even add an SSL torrent, and a TLS swarm refuses a plain one.
  Node plain(LoopbackOptions());
  plain.Start();
  swarm::ChunkSpec spec;
  spec.torrent = torrents[0];
  spec.range = swarm::FileRange{swarm::BlobFile::Open(dir.Sub("outsider.blob"), true).value(), 0,
                                torrents[0].length};
  auto refused = plain.Call([&] { return plain.swarm().AddChunk(spec); });
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().message.find("SSL torrent") != std::string::npos);
  spec.torrent = BuildTorrents(blob, kLayout)[0];
  auto refused_plain = seeder.Call([&] { return seeder.swarm().AddChunk(spec); });
  REQUIRE_FALSE(refused_plain.has_value());
  CHECK(refused_plain.error().message.find("not an SSL torrent") != std::string::npos);

  // The seeder counts the plain client and the outsider's connections.
  bool refused_counted =
      WaitUntil([&] { return seeder.Stats().peer_tls_refused >= 2; }, seconds(15), milliseconds(50));
  CHECK_MESSAGE(refused_counted, "seeder refused " << seeder.Stats().peer_tls_refused);

  // An agent of the cluster (its own certificate from the cluster CA) downloads it all.
  Node leecher(TlsOptions(PeerTlsFrom(dir, "cluster-ca", "leecher")));
  leecher.Start();
  double secs = DownloadAll(leecher, torrents, dir.Sub("leech.blob"), tracker);
  MESSAGE("24 MiB over TLS peers in " << secs << " s");
  CHECK(ReadFile(dir.Sub("leech.blob")) == blob);
  CheckCallbacks(leecher, kLayout);

  // The outsider got nothing, though the leecher (which it also tries) now seeds too.
  std::this_thread::sleep_for(seconds(1));
  swarm::SwarmStats os = outsider.Stats();
  CHECK(os.downloaded == 0);
  for (const auto& c : os.chunks) CHECK(c.pieces_have == 0);
  CHECK(ReadFile(dir.Sub("outsider.blob")) == std::string(kLayout.blob_size, '\0'));
  // And the outsider saw its own attempts fail (the cluster's agents do not trust its CA).
  CHECK(os.peer_tls_refused >= 1);
  CHECK(seeder.Stats().hash_failures == 0);
  outsider.Stop();
  leecher.Stop();
  plain.Stop();
  seeder.Stop();
}

// Not run by default (doctest --no-skip): loopback throughput for a larger blob.
TEST_CASE("swarm session: throughput of a 512 MiB blob" * doctest::skip()) {
  const ChunkLayout layout{
      .blob_size = 512ull << 20, .chunk_size = 64ull << 20, .piece_size = 4u << 20};
  TempDir dir("shoal-swarm-perf");
  Tracker tracker = StartTracker(dir);
  const std::string blob = RandomBytes(layout.blob_size, 4);
  const std::vector<ChunkTorrent> torrents = BuildTorrents(blob, layout);
  WriteBlobFile(dir.Sub("seed.blob"), blob, 0);
  CreateSparseFile(dir.Sub("leech.blob"), layout.blob_size);

  Node seeder(LoopbackOptions());
  seeder.Start();
  for (uint32_t k = 0; k < torrents.size(); ++k) {
    seeder.AddChunk(torrents[k], k, dir.Sub("seed.blob"), layout.chunk_begin(k), true,
                    tracker.AnnounceUrl());
  }
  WaitForSeeders(tracker, torrents);
  Node leecher(LoopbackOptions());
  leecher.Start();
  auto started = std::chrono::steady_clock::now();
  for (uint32_t k = 0; k < torrents.size(); ++k) {
    leecher.AddChunk(torrents[k], k, dir.Sub("leech.blob"), layout.chunk_begin(k), false,
                     tracker.AnnounceUrl());
  }
  REQUIRE(WaitUntil([&] { return leecher.AllComplete(layout.chunk_count()); }, seconds(120),
                    milliseconds(10)));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  MESSAGE("512 MiB over " << layout.chunk_count() << " chunk torrents in " << secs << " s ("
                          << (layout.blob_size / secs / 1e6) << " MB/s)");
  CHECK(ReadFile(dir.Sub("leech.blob")) == blob);
}

}  // namespace shoal::testkit
