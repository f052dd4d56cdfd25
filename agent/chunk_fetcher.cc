#include "agent/chunk_fetcher.h"

#include <utility>

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <random>
#include <string_view>

#include <spdlog/spdlog.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "agent/sleep.h"
#include "lib/core/log.h"

namespace shoal::agent {
namespace asio = boost::asio;
using asio::awaitable;
using Clock = std::chrono::steady_clock;

ChunkFetchMetrics::ChunkFetchMetrics(prometheus::Registry& registry)
    : upstream_bytes(prometheus::BuildCounter()
                         .Name("shoal_upstream_blob_bytes_total")
                         .Help("Blob bytes received from upstream registries")
                         .Register(registry)
                         .Add({})),
      peer_bytes(prometheus::BuildCounter()
                     .Name("shoal_swarm_peer_bytes_total")
                     .Help("Blob bytes received from peers (pieces that passed their hash check)")
                     .Register(registry)
                     .Add({})),
      chunks(prometheus::BuildCounter()
                 .Name("shoal_swarm_chunks_total")
                 .Help("Chunks filled, by source (peers, upstream_lease, upstream_direct)")
                 .Register(registry)),
      fallbacks(prometheus::BuildCounter()
                    .Name("shoal_swarm_fallback_total")
                    .Help("Chunks fetched straight from upstream because no tracker answered, "
                          "by reason")
                    .Register(registry)),
      leases(prometheus::BuildCounter()
                 .Name("shoal_swarm_leases_granted_total")
                 .Help("Upstream leases this agent was granted")
                 .Register(registry)
                 .Add({})),
      lease_lost(prometheus::BuildCounter()
                     .Name("shoal_swarm_leases_lost_total")
                     .Help("Leases the tracker took back while this agent held them")
                     .Register(registry)
                     .Add({})),
      stalls(prometheus::BuildCounter()
                 .Name("shoal_swarm_peer_stalls_total")
                 .Help("Chunk downloads from peers that made no progress for --peer-stall-ms, "
                       "or had no peer connected for a sixth of it")
                 .Register(registry)
                 .Add({})),
      republished(prometheus::BuildCounter()
                      .Name("shoal_swarm_chunks_republished_total")
                      .Help("Chunks the tracker leased to this agent although it held them "
                            "already; published again")
                      .Register(registry)
                      .Add({})) {}

namespace {

bool Fatal(const Error& e) {
  return e.code == ErrorCode::kNotFound || e.code == ErrorCode::kDenied ||
         e.code == ErrorCode::kRefused || e.code == ErrorCode::kUnauthorized ||
         e.code == ErrorCode::kIo || e.code == ErrorCode::kDigestMismatch ||
         e.code == ErrorCode::kInvalidArgument;
}

// The fetch of one blob's chunks. Owned by the coroutines working on it.
class ChunkFetcher : public std::enable_shared_from_this<ChunkFetcher> {
 public:
  ChunkFetcher(FetchServices& s, std::shared_ptr<BlobFetch> fetch,
               upstream::RegistryEndpoint endpoint, BlobSource source)
      : s_(s),
        fetch_(std::move(fetch)),
        endpoint_(std::move(endpoint)),
        source_(std::move(source)),
        upstream_done_(s.ioc.get_executor()),
        work_wanted_(s.ioc.get_executor()),
        ready_changed_(s.ioc.get_executor()),
        watch_wanted_(s.ioc.get_executor()) {}

  awaitable<void> Run();

 private:
  enum class Origin { kNone, kPeers, kUpstream };

  // A head stream: takes the chunks in order, skipping those a background stream took.
  awaitable<void> Worker();
  // A background stream: takes a random chunk among those the watcher knows are ready and no
  // stream has taken; ends when none is left to take.
  awaitable<void> BackgroundWorker();
  awaitable<void> Chunk(uint32_t k);
  // Fetches chunk k straight from upstream (no lease), retrying within the blob's failure budget.
  awaitable<void> Direct(uint32_t k);
  // Logs and counts that the tracker gave no usable answer (e), then fetches chunk k as Direct.
  awaitable<void> NoTracker(uint32_t k, Error e);
  // Whether to ask the tracker again after the failed call e instead of going upstream: it did
  // not answer, for less than options.tracker_grace (and not known down for that long), or it
  // is full (503), for less than options.tracker_busy_grace; both since this blob's last usable
  // answer. A full tracker is alive: the whole cluster going upstream at once is what it sheds
  // to prevent.
  bool KeepAskingTracker(const Error& e) const;
  // Chunk k's download from peers failed (again): logs it and tells whether to give up on peers
  // for it (kMaxPeerFailures, counted as a peers_failed fallback).
  bool PeersFailed(uint32_t k, const Error& e, int& peer_failures);
  // Counts a failed upstream fetch against the blob's budget (options.upstream_attempts, over
  // all of its chunks). Returns whether to try again; false after failing the fetch.
  bool UpstreamFailed(const Error& e);
  // Puts chunk k (which we hold, metainfo_[k] set) into the swarm as a seed if it is not there.
  awaitable<void> EnsureSeeding(uint32_t k);
  // SeedChunk, retried for about a second while libtorrent still holds a removed copy.
  awaitable<Status> AddChunkRetrying(uint32_t k, const swarm::ChunkTorrent& torrent,
                                     swarm::ChunkSpec spec);
  // Asks the tracker for upstream work on this blob until the fetch ends or nothing is left:
  // fetches, seeds and publishes each chunk the tracker hands it.
  awaitable<void> UpstreamWorker();
  // One long-poll per blob for the window's chunks (POST .../ready), instead of one per window
  // worker: at 2,500 nodes pulling three layers each, one per worker was ~37,500 parked
  // connections on the tracker. Fills ready_meta_ and wakes the workers.
  awaitable<void> ReadyWatcher();
  // The chunks the watcher asks for: the lowest ones neither held, known ready nor being
  // fetched by our upstream worker, at most kReadyWindow.
  std::vector<uint32_t> ReadyWanted() const;
  // Fetches chunk k from upstream (under lease_id when not empty), then seeds and publishes it.
  awaitable<Status> Upstream(uint32_t k, std::string lease_id, std::chrono::milliseconds ttl);
  awaitable<Status> FromPeers(uint32_t k, const std::string& metainfo);
  // Renews the lease while bytes arrive; renewed_at is when it last held for sure.
  awaitable<void> RenewLoop(uint32_t k, std::string lease_id, std::chrono::milliseconds ttl,
                            std::shared_ptr<uint64_t> progress, std::shared_ptr<bool> done,
                            std::shared_ptr<Clock::time_point> renewed_at);
  awaitable<void> Finish();
  // Adds chunk k's torrent over our file: as a seed, or to download (spec callbacks set).
  Status SeedChunk(uint32_t k, const swarm::ChunkTorrent& torrent, swarm::ChunkSpec spec);
  std::string ChunkName(uint32_t k) const {
    return fetch_->digest().hex() + "." + std::to_string(k);
  }
  // The root certificate this swarm's chunk torrents carry (empty: plain peers, or no swarm).
  std::string_view RootCert() const {
    return s_.swarm != nullptr ? std::string_view(s_.swarm->root_cert()) : std::string_view();
  }
  // Chunk k's metainfo, checked against the layout and this swarm's root certificate.
  Result<swarm::ChunkTorrent> Parse(uint32_t k, std::string_view metainfo) const {
    return swarm::ParseChunkTorrent(metainfo, layout_.chunk_length(k), layout_.piece_size_of(k),
                                    RootCert());
  }

  FetchServices& s_;
  std::shared_ptr<BlobFetch> fetch_;
  upstream::RegistryEndpoint endpoint_;
  BlobSource source_;
  swarm::ChunkLayout layout_;
  bool use_tracker_ = false;
  bool hash_pieces_ = false;  // build torrents for what we fetch (only with a swarm)
  std::shared_ptr<swarm::BlobFile> file_;
  uint32_t next_ = 0;
  std::vector<bool> claimed_;  // per chunk: a head or background stream took it
  std::mt19937 rng_{std::random_device{}()};
  std::vector<Origin> origin_;
  std::vector<bool> in_upstream_;  // our upstream worker is fetching the chunk
  // A lease of ours on the chunk lapsed before its first byte and the fetch gave way (once per
  // chunk: a registry whose first byte always comes after the lease ttl still gets fetched).
  std::vector<bool> gave_way_;
  Notifier upstream_done_;         // woken when our upstream worker ends a chunk
  Notifier work_wanted_;           // woken when a chunk may need fetching again (reported bad)
  bool upstream_worker_ = false;
  std::vector<std::string> metainfo_;            // per chunk, once known
  std::vector<std::string> ready_meta_;          // per chunk: the tracker says ready with this
  Notifier ready_changed_;                       // woken when the watcher learned something
  Notifier watch_wanted_;                        // woken when a worker waits for a chunk
  std::optional<Error> watch_error_;             // the watcher's last tracker failure, if any
  std::vector<swarm::Sha1> added_;               // torrents this fetch put into the swarm
  Clock::time_point tracker_ok_ = Clock::now();  // this blob's last usable tracker answer
  int upstream_failures_ = 0;                    // failed upstream chunk fetches of this blob
  int republished_ = 0;         // chunks the tracker handed back although we hold them
  bool swarm_cut_off_ = false;  // our announces fail: no peers either way
};

// The shoal_swarm_fallback_total reason for going upstream after the tracker call failed with e.
std::string_view TrackerFallbackReason(const Error& e) {
  switch (e.code) {
    case ErrorCode::kUnavailable: return "tracker_unreachable";
    case ErrorCode::kTooManyRequests: return "tracker_busy";
    default: return "tracker_error";
  }
}

// Times a chunk may fail from peers before it is fetched from upstream directly.
constexpr int kMaxPeerFailures = 4;
// Chunks one ready poll asks for: the window workers' chunks and those they take next.
constexpr size_t kReadyWindow = 16;

awaitable<void> ChunkFetcher::Run() {
  auto self = shared_from_this();
  use_tracker_ = s_.tracker != nullptr && s_.tracker->enabled();
  if (use_tracker_ && s_.tracker->Unreachable(s_.options.tracker_grace)) {
    // Known for a while already: this blob does not wait the grace again (a background probe
    // brings the swarm back for later blobs when a replica answers).
    spdlog::warn("no tracker replica has answered for {} ms; fetching {} straight from upstream",
                 s_.options.tracker_grace.count(), fetch_->digest().str());
    s_.metrics.fallbacks.Add({{"reason", "tracker_unreachable"}}).Increment();
    use_tracker_ = false;
  }
  if (use_tracker_) {
    for (;;) {
      auto table = co_await s_.tracker->Table(fetch_->digest(), source_);
      if (table) {
        layout_ = table.value().layout;
        tracker_ok_ = Clock::now();
        break;
      }
      if (!KeepAskingTracker(table.error())) {
        spdlog::warn("no usable tracker for {} ({}); fetching it straight from upstream",
                     fetch_->digest().str(), table.error().message);
        s_.metrics.fallbacks.Add({{"reason", std::string(TrackerFallbackReason(table.error()))}})
            .Increment();
        use_tracker_ = false;
        break;
      }
      co_await SleepFor(TrackerRetryPause(table.error()));
    }
  }
  if (!use_tracker_) {
    layout_ = s_.options.local_layout;
    layout_.blob_size = fetch_->size();
  }
  if (layout_.blob_size != fetch_->size()) {
    fetch_->Fail(MakeError(ErrorCode::kProtocol, "tracker says " + fetch_->digest().str() + " is " +
                                                     std::to_string(layout_.blob_size) +
                                                     " bytes, upstream says " +
                                                     std::to_string(fetch_->size())));
    co_return;
  }
  if (fetch_->size() == 0) co_return;  // verified at Open
  hash_pieces_ = s_.swarm != nullptr;
  if (hash_pieces_) {
    int fd = ::dup(fetch_->fd());
    if (fd < 0) {
      fetch_->Fail(MakeError(ErrorCode::kIo, "dup of the temp file descriptor failed"));
      co_return;
    }
    auto file = swarm::BlobFile::Adopt(fd);
    if (!file) {
      fetch_->Fail(file.error());
      co_return;
    }
    file_ = file.value();
  }
  uint32_t count = layout_.chunk_count();
  origin_.assign(count, Origin::kNone);
  in_upstream_.assign(count, false);
  gave_way_.assign(count, false);
  metainfo_.assign(count, "");
  ready_meta_.assign(count, "");
  // With a swarm, upstream fetching is work the tracker hands out (any chunk of the blob);
  // the window workers below only wait for chunks to become ready.
  upstream_worker_ = use_tracker_ && hash_pieces_;
  if (upstream_worker_) {
    asio::co_spawn(s_.ioc, UpstreamWorker(), asio::detached);
    asio::co_spawn(s_.ioc, ReadyWatcher(), asio::detached);
  }
  int workers = std::max(1, std::min<int>(s_.options.window, static_cast<int>(count)));
  // Background streams need the ready watcher (a swarm and a tracker that hands out work).
  const int head = upstream_worker_ ? std::clamp(s_.options.head_streams, 1, workers) : workers;
  claimed_.assign(count, false);
  for (int i = 0; i < head; ++i) asio::co_spawn(s_.ioc, Worker(), asio::detached);
  for (int i = head; i < workers; ++i) asio::co_spawn(s_.ioc, BackgroundWorker(), asio::detached);
  // Wait for the end, then seed or clean up.
  while (!fetch_->ended()) co_await fetch_->changes().Wait();
  co_await Finish();
}

awaitable<void> ChunkFetcher::Worker() {
  auto self = shared_from_this();
  while (!fetch_->ended() && next_ < layout_.chunk_count()) {
    uint32_t k = next_++;
    if (claimed_[k]) continue;  // a background stream has it
    claimed_[k] = true;
    co_await Chunk(k);
  }
}

awaitable<void> ChunkFetcher::BackgroundWorker() {
  auto self = shared_from_this();
  while (!fetch_->ended()) {
    // A chunk the watcher knows is ready that nobody here holds, fetches or has taken, at
    // random; every other chunk is left to the head streams, which walk them all in order.
    std::vector<uint32_t> ready;
    bool open = false;
    for (uint32_t k = 0; k < layout_.chunk_count(); ++k) {
      if (claimed_[k] || origin_[k] != Origin::kNone || in_upstream_[k]) continue;
      open = true;
      if (!ready_meta_[k].empty()) ready.push_back(k);
    }
    // Nothing left to take, or the tracker or the swarm fails us: the head streams go on.
    if (!open || watch_error_ || swarm_cut_off_) co_return;
    if (ready.empty()) {
      watch_wanted_.NotifyAll();
      co_await ready_changed_.Wait(s_.options.lease_wait);
      continue;
    }
    std::uniform_int_distribution<size_t> pick(0, ready.size() - 1);
    const uint32_t k = ready[pick(rng_)];
    claimed_[k] = true;
    co_await Chunk(k);
  }
}

awaitable<void> ChunkFetcher::NoTracker(uint32_t k, Error e) {
  spdlog::warn("chunk {} of {}: no tracker answer ({}); fetching it straight from upstream", k,
               fetch_->digest().str(), e.message);
  s_.metrics.fallbacks.Add({{"reason", std::string(TrackerFallbackReason(e))}}).Increment();
  co_await Direct(k);
}

bool ChunkFetcher::KeepAskingTracker(const Error& e) const {
  const auto since_ok = Clock::now() - tracker_ok_;
  if (e.code == ErrorCode::kTooManyRequests) return since_ok < s_.options.tracker_busy_grace;
  return e.code == ErrorCode::kUnavailable && !s_.tracker->Unreachable(s_.options.tracker_grace) &&
         since_ok < s_.options.tracker_grace;
}

bool ChunkFetcher::PeersFailed(uint32_t k, const Error& e, int& peer_failures) {
  spdlog::warn("chunk {} of {} from peers: {}", k, fetch_->digest().str(), e.message);
  if (swarm_cut_off_ || ++peer_failures < kMaxPeerFailures || fetch_->ended()) return false;
  // The tracker keeps saying ready but no peer delivers: bounded, then upstream.
  spdlog::warn("chunk {} of {}: peers failed {} times; fetching it straight from upstream", k,
               fetch_->digest().str(), peer_failures);
  s_.metrics.fallbacks.Add({{"reason", "peers_failed"}}).Increment();
  return true;
}

awaitable<void> ChunkFetcher::Direct(uint32_t k) {
  const std::string no_lease;
  while (!fetch_->ended()) {
    Status st = co_await Upstream(k, no_lease, std::chrono::milliseconds(0));
    if (st) co_return;
    if (!UpstreamFailed(st.error())) co_return;
    co_await SleepFor(std::chrono::milliseconds(500));
  }
}

bool ChunkFetcher::UpstreamFailed(const Error& e) {
  if (fetch_->ended()) return false;
  // Counted per blob, not per chunk: four window workers each retrying their own chunk three
  // times (each GET retried 6 times by the client) made 72 GETs and 45 s against a dead upstream
  // before the client heard anything.
  // A lease that lapsed before its first byte passed the chunk on: not a failed fetch.
  if (e.code == ErrorCode::kCancelled) return true;
  if (Fatal(e) || ++upstream_failures_ >= s_.options.upstream_attempts) {
    fetch_->Fail(e);
    return false;
  }
  return true;
}

awaitable<void> ChunkFetcher::Chunk(uint32_t k) {
  if (!use_tracker_) co_return co_await Direct(k);
  int peer_failures = 0;
  while (!fetch_->ended()) {
    if (origin_[k] != Origin::kNone) co_return;  // our upstream worker fetched it
    if (swarm_cut_off_) {
      // Our announces fail: peers cannot be found (nor find us); never worse than no mirror.
      s_.metrics.fallbacks.Add({{"reason", "announce_failed"}}).Increment();
      co_return co_await Direct(k);
    }
    if (in_upstream_[k]) {
      co_await upstream_done_.Wait(std::chrono::milliseconds(500));
      continue;
    }
    if (upstream_worker_) {
      // The watcher asks the tracker for this chunk (with the rest of the window).
      if (ready_meta_[k].empty()) {
        if (watch_error_) co_return co_await NoTracker(k, *watch_error_);
        watch_wanted_.NotifyAll();
        co_await ready_changed_.Wait(s_.options.lease_wait);
        continue;
      }
      const std::string metainfo = ready_meta_[k];
      Status st = co_await FromPeers(k, metainfo);
      if (st) co_return;
      if (ready_meta_[k] == metainfo) ready_meta_[k].clear();  // ask the tracker again
      if (PeersFailed(k, st.error(), peer_failures)) co_return co_await Direct(k);
      continue;
    }
    auto started = Clock::now();
    auto answer = co_await s_.tracker->Lease(fetch_->digest(), k, source_, s_.options.lease_wait,
                                             !upstream_worker_);
    if (origin_[k] != Origin::kNone) co_return;
    if (in_upstream_[k]) continue;
    if (!answer) {
      const Error& e = answer.error();
      if (KeepAskingTracker(e)) {
        co_await SleepFor(TrackerRetryPause(e));
        continue;
      }
      co_return co_await NoTracker(k, e);
    }
    tracker_ok_ = Clock::now();
    LeaseAnswer& a = answer.value();
    if (!(a.layout == layout_)) {
      fetch_->Fail(MakeError(ErrorCode::kProtocol, "tracker changed the chunk layout of " +
                                                       fetch_->digest().str() + " mid-fetch"));
      co_return;
    }
    switch (a.kind) {
      case LeaseAnswer::Kind::kReady: {
        Status st = co_await FromPeers(k, a.metainfo);
        if (st) co_return;
        if (PeersFailed(k, st.error(), peer_failures)) co_return co_await Direct(k);
        break;
      }
      case LeaseAnswer::Kind::kGranted: {
        s_.metrics.leases.Increment();
        Status st = co_await Upstream(k, a.lease_id, a.ttl);
        if (st) co_return;
        if (!UpstreamFailed(st.error())) co_return;
        break;
      }
      case LeaseAnswer::Kind::kDone:  // a work answer; not sent for a chunk
      case LeaseAnswer::Kind::kWait:
        // The tracker long-polls; an early answer (e.g. the cluster cap) asks us to back off.
        if (Clock::now() - started < std::chrono::milliseconds(200)) {
          auto pause = std::clamp(a.retry_after, std::chrono::milliseconds(100),
                                  std::chrono::milliseconds(2000));
          co_await SleepFor(pause);
        }
        break;
    }
  }
}

std::vector<uint32_t> ChunkFetcher::ReadyWanted() const {
  std::vector<uint32_t> wanted;
  // Chunks below the contiguous prefix are held; every other one is wanted sooner or later, the
  // lowest first (those the workers wait on, then those they take next).
  const uint32_t first =
      fetch_->contiguous() < fetch_->size() ? layout_.chunk_at(fetch_->contiguous()) : 0;
  for (uint32_t k = first; k < layout_.chunk_count() && wanted.size() < kReadyWindow; ++k) {
    if (origin_[k] != Origin::kNone || in_upstream_[k] || !ready_meta_[k].empty()) continue;
    wanted.push_back(k);
  }
  return wanted;
}

awaitable<void> ChunkFetcher::ReadyWatcher() {
  auto self = shared_from_this();
  Clock::time_point last_poll{};
  while (!fetch_->ended()) {
    if (std::all_of(origin_.begin(), origin_.end(), [](Origin o) { return o != Origin::kNone; }))
      co_return;
    if (swarm_cut_off_) co_return;  // the workers fetch straight from upstream
    std::vector<uint32_t> wanted = ReadyWanted();
    if (wanted.empty()) {
      co_await watch_wanted_.Wait(std::chrono::milliseconds(500));
      continue;
    }
    if (const auto next = last_poll + s_.options.ready_interval; Clock::now() < next) {
      // --ready-interval-ms: let more chunks become ready, then ask for them in one call.
      co_await SleepFor(std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()));
      continue;  // what is wanted may have changed meanwhile
    }
    auto started = Clock::now();
    last_poll = started;
    auto answer = co_await s_.tracker->Ready(fetch_->digest(), wanted, source_,
                                             s_.options.lease_wait);
    if (fetch_->ended()) co_return;
    if (!answer) {
      const Error& e = answer.error();
      // Past the grace, the waiting workers fetch their chunks straight from upstream.
      if (!KeepAskingTracker(e)) {
        watch_error_ = e;
        ready_changed_.NotifyAll();
      }
      co_await SleepFor(TrackerRetryPause(e));
      continue;
    }
    tracker_ok_ = Clock::now();
    watch_error_.reset();
    ReadyAnswer& a = answer.value();
    if (!(a.layout == layout_)) {
      fetch_->Fail(MakeError(ErrorCode::kProtocol, "tracker changed the chunk layout of " +
                                                       fetch_->digest().str() + " mid-fetch"));
      co_return;
    }
    for (auto& [k, metainfo] : a.ready) ready_meta_[k] = std::move(metainfo);
    if (!a.ready.empty()) {
      ready_changed_.NotifyAll();
    } else if (Clock::now() - started < std::chrono::milliseconds(200)) {
      // The tracker long-polls; an early empty answer (it is shutting down, or full of
      // waiters) asks us to back off.
      co_await SleepFor(std::clamp(a.retry_after, std::chrono::milliseconds(100),
                                        std::chrono::milliseconds(2000)));
    }
  }
}

awaitable<void> ChunkFetcher::UpstreamWorker() {
  auto self = shared_from_this();
  while (!fetch_->ended()) {
    if (std::all_of(origin_.begin(), origin_.end(), [](Origin o) { return o != Origin::kNone; }))
      co_return;
    // Peers cannot reach an agent whose announces fail: it stops taking leases (the window
    // workers fetch straight from upstream).
    if (swarm_cut_off_) co_return;
    auto started = Clock::now();
    auto answer = co_await s_.tracker->Work(fetch_->digest(), source_, s_.options.lease_wait);
    if (fetch_->ended()) co_return;
    if (!answer) {
      // The window workers decide about falling back to upstream; just do not spin.
      co_await SleepFor(TrackerRetryPause(answer.error()));
      continue;
    }
    LeaseAnswer& a = answer.value();
    if (!(a.layout == layout_)) {
      fetch_->Fail(MakeError(ErrorCode::kProtocol, "tracker changed the chunk layout of " +
                                                       fetch_->digest().str() + " mid-fetch"));
      co_return;
    }
    if (a.kind == LeaseAnswer::Kind::kDone) {
      // Every chunk is ready, but ours are not all filled yet: a chunk whose peers fail is
      // reported bad and needs fetching again, so stay around (woken by the report).
      co_await work_wanted_.Wait(s_.options.lease_wait);
      continue;
    }
    if (a.kind != LeaseAnswer::Kind::kGranted) {
      if (Clock::now() - started < std::chrono::milliseconds(200)) {
        co_await SleepFor(std::clamp(a.retry_after, std::chrono::milliseconds(100),
                                          std::chrono::milliseconds(2000)));
      }
      continue;
    }
    const uint32_t k = a.chunk;
    s_.metrics.leases.Increment();
    if (origin_[k] != Origin::kNone && !metainfo_[k].empty()) {
      // We hold the chunk already (the tracker lost or dropped its metainfo): make sure we seed
      // it, publish ours, and back off if the tracker hands it back again and again, so that no
      // grant-publish loop can spin (it once ran thousands of rounds a second).
      co_await EnsureSeeding(k);
      Status published =
          co_await s_.tracker->Publish(fetch_->digest(), k, source_, a.lease_id, metainfo_[k]);
      s_.metrics.republished.Increment();
      if (!published) {
        spdlog::warn("cannot re-publish chunk {} of {}: {}", k, fetch_->digest().str(),
                     published.error().message);
      }
      const int n = ++republished_;
      auto pause = std::min<std::chrono::milliseconds>(
          std::chrono::milliseconds(100 << std::min(n, 6)), std::chrono::milliseconds(5000));
      if (n > 1) {
        spdlog::warn(
            "chunk {} of {}: the tracker handed back a chunk this agent holds ({} times); "
            "waiting {} ms",
            k, fetch_->digest().str(), n, pause.count());
      }
      co_await SleepFor(pause);
      continue;
    }
    in_upstream_[k] = true;
    Status st = co_await Upstream(k, a.lease_id, a.ttl);
    in_upstream_[k] = false;
    upstream_done_.NotifyAll();
    if (st) continue;
    spdlog::warn("chunk {} of {} from upstream: {}", k, fetch_->digest().str(), st.error().message);
    if (!UpstreamFailed(st.error())) co_return;
    co_await SleepFor(std::chrono::milliseconds(500));
  }
}

awaitable<void> ChunkFetcher::EnsureSeeding(uint32_t k) {
  auto torrent =
      Parse(k, metainfo_[k]);
  if (!torrent || s_.swarm == nullptr || !file_) co_return;
  if (s_.swarm->HasChunk(torrent.value().info_hash)) co_return;
  swarm::ChunkSpec spec;
  spec.seed = true;
  auto seeded = co_await AddChunkRetrying(k, torrent.value(), std::move(spec));
  if (!seeded) {
    spdlog::warn("cannot seed chunk {} of {}: {}", k, fetch_->digest().str(),
                 seeded.error().message);
  }
}

awaitable<Status> ChunkFetcher::AddChunkRetrying(uint32_t k, const swarm::ChunkTorrent& torrent,
                                                 swarm::ChunkSpec spec) {
  // libtorrent drops a removed torrent asynchronously: re-adding the same info-hash right after
  // RemoveChunk can fail for a moment (a chunk that peers failed to deliver, then fetched from
  // upstream). Bounded: 20 tries over about a second.
  Status st = Ok();
  for (int attempt = 0; attempt < 20; ++attempt) {
    st = SeedChunk(k, torrent, spec);
    if (st || st.error().code != ErrorCode::kInternal) co_return st;
    co_await SleepFor(std::chrono::milliseconds(50));
  }
  co_return st;
}

Status ChunkFetcher::SeedChunk(uint32_t k, const swarm::ChunkTorrent& torrent,
                               swarm::ChunkSpec spec) {
  spec.torrent = torrent;
  spec.range = swarm::FileRange{file_, layout_.chunk_begin(k), layout_.chunk_length(k)};
  // In order only for chunk 0 while a streaming client waits on it (the blob's first bytes);
  // elsewhere rarest-first, so that peers fetching the same chunks hold different pieces and
  // trade them. In order for every chunk a client waits on, nodes that start a chunk together
  // (a late chunk everyone lacks) hold the same prefix of it and have nothing to trade:
  // shoal-sim at 2,500 nodes waited 12 s on one such 64 MiB chunk (docs/benchmarks.md).
  spec.sequential = !spec.seed && k == 0 && fetch_->contiguous() < fetch_->size() &&
                    layout_.chunk_at(fetch_->contiguous()) == k;
  if (s_.tracker != nullptr) spec.tracker_urls = s_.tracker->AnnounceUrls(fetch_->digest());
  // A torrent left from an earlier failed attempt on this chunk is replaced.
  if (s_.swarm->HasChunk(torrent.info_hash)) s_.swarm->RemoveChunk(torrent.info_hash);
  auto added = s_.swarm->AddChunk(std::move(spec));
  if (!added) return added.error();
  added_.push_back(torrent.info_hash);
  return Ok();
}

awaitable<Status> ChunkFetcher::Upstream(uint32_t k, std::string lease_id,
                                         std::chrono::milliseconds ttl) {
  auto self = shared_from_this();
  const uint64_t begin = layout_.chunk_begin(k), length = layout_.chunk_length(k);
  std::optional<swarm::PieceHasher> hasher;
  if (hash_pieces_) hasher.emplace(length, layout_.piece_size_of(k));
  auto progress = std::make_shared<uint64_t>(0);
  auto done = std::make_shared<bool>(false);
  auto renewed_at = std::make_shared<Clock::time_point>(Clock::now());
  if (!lease_id.empty()) {
    asio::co_spawn(s_.ioc, RenewLoop(k, lease_id, ttl, progress, done, renewed_at),
                   asio::detached);
  }
  // Peers give way to the upstream GET on this node while it lasts (upstream_reserve.h).
  UpstreamReserve::Hold reserved;
  if (s_.reserve != nullptr && !lease_id.empty()) reserved = s_.reserve->Acquire();
  const Clock::time_point started = Clock::now();
  spdlog::debug("chunk {} of {}: upstream GET of {} bytes at {}{}", k, fetch_->digest().str(),
                length, begin, lease_id.empty() ? " (no lease)" : "");
  const bool leased = !lease_id.empty();
  upstream::BodySink sink = [this, k, begin, &hasher, progress, started, leased, renewed_at,
                             ttl](const char* data, size_t n) -> Status {
    if (*progress == 0) {
      spdlog::debug("chunk {} of {}: first upstream byte after {} ms", k, fetch_->digest().str(),
                    MillisSince(started));
      // No byte came while the lease lasted (connects that kept failing): the tracker has
      // given the chunk to another agent, so this one does not fetch it too.
      if (leased && !gave_way_[k] && Clock::now() - *renewed_at >= ttl) {
        gave_way_[k] = true;
        return MakeError(ErrorCode::kCancelled,
                         "the lease on chunk " + std::to_string(k) + " of " +
                             fetch_->digest().str() + " lapsed before its first upstream byte (" +
                             std::to_string(MillisSince(started)) +
                             " ms); another agent fetches it");
      }
    }
    if (auto st = fetch_->Write(data, n, begin + *progress); !st) return st;
    if (hasher) {
      if (auto st = hasher->Update(data, n); !st) return st;
    }
    *progress += n;
    s_.metrics.upstream_bytes.Increment(static_cast<double>(n));
    return Ok();
  };
  Status st = co_await s_.client.FetchBlob(endpoint_, source_.repository, fetch_->digest(), begin,
                                           length, std::move(sink));
  reserved.Release();
  *done = true;
  if (!st) {
    if (!lease_id.empty()) {
      auto released = co_await s_.tracker->Release(fetch_->digest(), k, lease_id);
      (void)released;
    }
    co_return st.error();
  }
  origin_[k] = Origin::kUpstream;
  spdlog::debug("chunk {} of {}: {} bytes from upstream in {} ms", k, fetch_->digest().str(),
                length, MillisSince(started));
  s_.metrics.chunks.Add({{"source", lease_id.empty() ? "upstream_direct" : "upstream_lease"}})
      .Increment();
  if (!hasher) co_return Ok();
  auto hashes = hasher->Finish();
  if (!hashes) co_return hashes.error();
  auto torrent = swarm::BuildChunkTorrent(ChunkName(k), length, layout_.piece_size_of(k),
                                          std::move(hashes.value()), RootCert());
  if (!torrent) co_return torrent.error();
  metainfo_[k] = torrent.value().metainfo;
  swarm::ChunkSpec seed_spec;
  seed_spec.seed = true;
  if (auto seeded = co_await AddChunkRetrying(k, torrent.value(), std::move(seed_spec)); !seeded) {
    spdlog::warn("cannot seed chunk {} of {}: {}", k, fetch_->digest().str(),
                 seeded.error().message);
  } else if (s_.seeds != nullptr && use_tracker_) {
    s_.seeds->AddPartial(fetch_->digest(), source_, k, metainfo_[k]);
  }
  if (use_tracker_) {
    Status published = co_await s_.tracker->Publish(fetch_->digest(), k, source_, lease_id,
                                                    torrent.value().metainfo);
    if (!published) {
      spdlog::warn("cannot publish chunk {} of {}: {}", k, fetch_->digest().str(),
                   published.error().message);
    }
  }
  co_return Ok();
}

awaitable<void> ChunkFetcher::RenewLoop(uint32_t k, std::string lease_id,
                                        std::chrono::milliseconds ttl,
                                        std::shared_ptr<uint64_t> progress,
                                        std::shared_ptr<bool> done,
                                        std::shared_ptr<Clock::time_point> renewed_at) {
  auto self = shared_from_this();
  auto period = std::max(std::chrono::milliseconds(200), ttl / 3);
  uint64_t last = 0;
  while (!*done && !fetch_->ended()) {
    co_await SleepFor(period);
    if (*done || fetch_->ended()) break;
    // No byte since the last round: a stalled body, or a registry this agent cannot reach
    // (connects timing out, retried for up to a minute). Let the lease run out, so that the
    // tracker gives the chunk to another agent instead of every node waiting on this one.
    if (*progress == last) continue;
    last = *progress;
    const Clock::time_point asked = Clock::now();
    Status st = co_await s_.tracker->Renew(fetch_->digest(), k, lease_id, *progress);
    if (st) *renewed_at = asked;
    if (!st && st.error().code == ErrorCode::kDenied) {
      spdlog::warn("lease on chunk {} of {} was lost; finishing the fetch anyway", k,
                   fetch_->digest().str());
      s_.metrics.lease_lost.Increment();
      break;
    }
  }
}

awaitable<Status> ChunkFetcher::FromPeers(uint32_t k, const std::string& metainfo) {
  auto self = shared_from_this();
  const uint64_t begin = layout_.chunk_begin(k);
  auto torrent =
      Parse(k, metainfo);
  if (!torrent) co_return torrent.error();
  if (s_.swarm == nullptr || !file_)
    co_return MakeError(ErrorCode::kUnsupported, "this agent has no swarm session");
  struct State {
    explicit State(asio::io_context& ioc) : notifier(ioc.get_executor()) {}
    Notifier notifier;
    bool complete = false;
    std::optional<Error> error;
    Clock::time_point progress = Clock::now();
    bool any_piece = false;
  };
  auto state = std::make_shared<State>(s_.ioc);
  swarm::ChunkSpec spec;
  std::weak_ptr<BlobFetch> weak_fetch = fetch_;
  ChunkFetchMetrics* metrics = &s_.metrics;
  spec.on_piece = [state, weak_fetch, begin, metrics, k](uint32_t piece, uint64_t b, uint64_t e) {
    if (!state->any_piece) {
      state->any_piece = true;
      spdlog::debug("chunk {}: first piece ({}) from peers {} ms after it was added", k, piece,
                    MillisSince(state->progress));
    }
    state->progress = Clock::now();
    metrics->peer_bytes.Increment(static_cast<double>(e - b));
    if (auto f = weak_fetch.lock()) f->Filled(begin + b, begin + e);
  };
  spec.on_complete = [state] {
    state->complete = true;
    state->notifier.NotifyAll();
  };
  spec.on_error = [state](const Error& e) {
    state->error = e;
    state->notifier.NotifyAll();
  };
  if (auto st = co_await AddChunkRetrying(k, torrent.value(), std::move(spec)); !st) co_return st;
  const Clock::time_point added = state->progress;
  const uint64_t replies_when_added = s_.swarm->AnnounceReplies();
  Clock::time_point reannounced = state->progress;
  // Without a connected peer a chunk cannot progress: a seeder that died (kill -9 sends no stop
  // announce, so the tracker still lists it) or announces that fail are seen within seconds,
  // not after the whole --peer-stall-ms.
  const auto no_peer_limit = std::max(std::chrono::milliseconds(2000), s_.options.peer_stall / 6);
  Clock::time_point last_connected = added;
  bool cut_off = false;
  bool retried_announce = false;
  bool peers_reasked = false;
  Clock::time_point retried_at = added;
  while (!state->complete && !state->error && !fetch_->ended()) {
    co_await state->notifier.Wait(std::chrono::milliseconds(500));
    if (state->complete || state->error || fetch_->ended()) break;
    if (auto ann = s_.swarm->Announces(torrent.value().info_hash)) {
      if (ann->connected > 0) last_connected = Clock::now();
      // No announce answered because this host cannot route to the tracker: the announces
      // failed with no route (after half the limit), or none was answered at all, neither this
      // chunk's nor any other's since it was added (libtorrent skips a tracker no listen socket
      // can reach, or sends a datagram that goes nowhere; after all of it). A tracker that
      // refuses or times out is restarting or down for every agent: that is waited out as
      // before. So is this chunk's announce alone going unanswered while others' are: a UDP
      // datagram lost on a full link is only known after libtorrent's receive timeout (5 s),
      // and then the swarm asks again; taking it for a cut-off sent the rest of the blob
      // straight upstream.
      const bool none_answered =
          ann->sent == 0 || s_.swarm->AnnounceReplies() == replies_when_added;
      const bool no_reply =
          ann->replies == 0 &&
          ((ann->errors > 0 && ann->unroutable && Clock::now() - added > no_peer_limit / 2) ||
           (ann->errors == 0 && none_answered && ann->connected == 0 &&
            Clock::now() - added > no_peer_limit));
      // Only ours to fix if the tracker's HTTP API answers us meanwhile: when it does not
      // either, the tracker is restarting or down, which every agent sees at once, and going
      // to upstream then would send the whole cluster there.
      const bool tracker_answers = s_.tracker->healthy_replicas() > 0;
      if (no_reply && !tracker_answers) {
        retried_announce = false;
      } else if (no_reply && !state->any_piece && !retried_announce) {
        // Once more, with the tracker answering, before giving up.
        retried_announce = true;
        retried_at = Clock::now();
        s_.swarm->Reannounce(torrent.value().info_hash);
      } else if (no_reply && !state->any_piece && Clock::now() - retried_at > no_peer_limit / 2) {
        cut_off = true;
        state->error = MakeError(
            ErrorCode::kUnavailable,
            "no tracker answered the chunk's announces (" +
                (!ann->last_error.empty() ? ann->last_error
                 : ann->sent == 0         ? std::string("none was sent")
                                          : std::string("nor any other chunk's since")) +
                ")");
        break;
      }
      if (ann->connected == 0 && !state->any_piece && !peers_reasked && ann->replies > 0 &&
          Clock::now() - last_connected > no_peer_limit / 2) {
        // The seeder may have announced after our first announce: ask for peers once more.
        peers_reasked = true;
        s_.swarm->Reannounce(torrent.value().info_hash);
      }
      // A peer that took our connection and closed it (its slots for this chunk were full)
      // means the swarm is alive: wait for a slot (the swarm re-announces for other peers)
      // rather than report the chunk bad, which makes the tracker drop it and the cluster
      // fetch it from upstream again. --peer-stall-ms still bounds the wait.
      const bool peers_busy = Clock::now() - ann->last_peer_closed < no_peer_limit;
      // The count is sampled each second: before giving up on the chunk, read it live (a peer
      // that connected since the sample is not a stall).
      const bool looks_stalled = ann->connected == 0 && !state->any_piece && !peers_busy &&
                                 Clock::now() - last_connected > no_peer_limit &&
                                 ann->replies > 0;
      if (looks_stalled && s_.swarm->PeersNow(torrent.value().info_hash) > 0) {
        last_connected = Clock::now();
      } else if (looks_stalled) {
        s_.metrics.stalls.Increment();
        state->error = MakeError(ErrorCode::kUnavailable,
                                 "no peer connected for " + std::to_string(no_peer_limit.count()) +
                                     " ms (the tracker " + "offered " +
                                     std::to_string(ann->peers_offered) + ")");
        break;
      }
    }
    // Halfway to a stall, ask the tracker for peers again: seeds that finished since we
    // joined are not connected to us yet (libtorrent would wait for the announce interval).
    if (!state->complete && Clock::now() - state->progress > s_.options.peer_stall / 2 &&
        reannounced != state->progress) {
      reannounced = state->progress;
      spdlog::info("chunk {} of {}: no piece from peers for {} ms; re-announcing", k,
                   fetch_->digest().str(), (s_.options.peer_stall / 2).count());
      s_.swarm->Reannounce(torrent.value().info_hash);
    }
    if (!state->complete && Clock::now() - state->progress > s_.options.peer_stall) {
      s_.metrics.stalls.Increment();
      state->error = MakeError(
          ErrorCode::kUnavailable,
          "no piece from peers for " + std::to_string(s_.options.peer_stall.count()) + " ms");
    }
  }
  if (state->complete) {
    spdlog::debug("chunk {} of {}: complete from peers {} ms after it was added", k,
                  fetch_->digest().str(), MillisSince(added));
    origin_[k] = Origin::kPeers;
    metainfo_[k] = torrent.value().metainfo;
    if (s_.seeds != nullptr) s_.seeds->AddPartial(fetch_->digest(), source_, k, metainfo_[k]);
    s_.metrics.chunks.Add({{"source", "peers"}}).Increment();
    co_return Ok();
  }
  s_.swarm->RemoveChunk(torrent.value().info_hash);
  if (fetch_->ended()) co_return MakeError(ErrorCode::kCancelled, "blob fetch ended");
  if (cut_off) {
    // Our own problem, not the chunk's: no bad report (it would make the cluster fetch it again).
    if (!swarm_cut_off_) {
      spdlog::error(
          "blob {}: this agent's announces fail ({}); fetching its chunks straight from "
          "upstream",
          fetch_->digest().str(), state->error->message);
    }
    swarm_cut_off_ = true;
    co_return *state->error;
  }
  // Let the tracker re-lease the chunk: its seeders are gone or serve garbage.
  const std::string info_hash = swarm::Sha1Hex(torrent.value().info_hash);
  auto reported = co_await s_.tracker->ReportBad(fetch_->digest(), k, info_hash);
  (void)reported;
  work_wanted_.NotifyAll();
  co_return *state->error;
}

awaitable<void> ChunkFetcher::Finish() {
  auto self = shared_from_this();
  if (s_.seeds != nullptr) s_.seeds->DropPartial(fetch_->digest());
  if (!fetch_->failed()) {
    if (s_.seeds != nullptr && hash_pieces_) {
      bool all = std::all_of(metainfo_.begin(), metainfo_.end(),
                             [](const std::string& m) { return !m.empty(); });
      if (all) s_.seeds->Add(SeedEntry{fetch_->digest(), source_, layout_, metainfo_});
    }
    co_return;
  }
  for (const auto& ih : added_) s_.swarm->RemoveChunk(ih);
  if (fetch_->error()->code == ErrorCode::kDigestMismatch && use_tracker_) {
    // Some published chunk was wrong: drop what we took from peers so it is fetched again.
    for (uint32_t k = 0; k < origin_.size(); ++k) {
      if (origin_[k] != Origin::kPeers) continue;
      auto t =
          Parse(k, metainfo_[k]);
      if (!t) continue;
      const std::string info_hash = swarm::Sha1Hex(t.value().info_hash);
      auto reported = co_await s_.tracker->ReportBad(fetch_->digest(), k, info_hash);
      (void)reported;
    }
  }
}

}  // namespace

awaitable<void> RunChunkFetch(FetchServices& services, std::shared_ptr<BlobFetch> fetch,
                              upstream::RegistryEndpoint endpoint, BlobSource source) {
  auto fetcher = std::make_shared<ChunkFetcher>(services, std::move(fetch), std::move(endpoint),
                                                std::move(source));
  co_await fetcher->Run();
}

}  // namespace shoal::agent
