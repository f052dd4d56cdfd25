#include "tests/sim/sim.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <queue>
#include <random>
#include <stdexcept>
#include <utility>

#include "lib/core/digest.h"
#include "tests/sim/flow_model.h"
#include "tracker/swarms/swarm_table.h"

namespace shoal::sim {

tracker::BlobTableOptions TrackerDefaults() {
  // tracker/config.h's defaults, as tracker/run.cc passes them to the table.
  tracker::BlobTableOptions o;
  o.chunk_size = 16ull << 20;
  o.piece_size = 1u << 20;
  o.target_chunks = 64;
  o.min_chunk_size = 1ull << 20;
  o.first_chunk_size = 1ull << 20;
  o.max_upstream_fetchers = 64;
  o.base_upstream_fetchers = 8;
  o.fast_lease_rate = 256'000'000 / 8;
  o.max_leases_per_agent = 2;
  o.max_leases_per_blob = 4;
  o.head_start = std::chrono::milliseconds(500);
  o.lease_ttl = std::chrono::seconds(15);
  return o;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

namespace {

using tracker::LeaseAnswer;
using tracker::TimePoint;
using tracker::WaitReason;
constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

const TimePoint kEpoch = TimePoint() + std::chrono::hours(1);
TimePoint At(double t) {
  return kEpoch + std::chrono::duration_cast<TimePoint::duration>(std::chrono::duration<double>(t));
}
double SecondsOf(TimePoint tp) {
  if (tp == TimePoint::max()) return std::numeric_limits<double>::infinity();
  return std::chrono::duration<double>(tp - kEpoch).count();
}
double Secs(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

struct Blob {
  Digest digest = Digest::FromSha256Hex(std::string(64, '0'));
  tracker::BlobSource source;
  swarm::ChunkLayout layout;
  uint32_t chunks = 0;
  std::vector<uint64_t> chunk_len;
  std::vector<uint32_t> piece_count, piece_off;  // per chunk: pieces, first piece's index
  std::vector<uint64_t> piece_len;               // per piece (blob-wide index)
  std::vector<uint32_t> piece_chunk;             // per piece
  std::vector<std::string> metainfo;             // per chunk: a valid chunk torrent
  std::vector<std::vector<uint32_t>> holders;    // per piece: nodes that verified it
  std::vector<std::vector<uint32_t>> hungry;     // per chunk: downloads waiting for a source
  std::vector<uint8_t> published;                // per chunk: ready at the tracker
  std::vector<uint32_t> swarm;                   // per chunk: nodes announced (fetching or holding)
  std::vector<uint32_t> bg_waiting;              // fetches with a background stream parked
  std::vector<size_t> hungry_cursor;             // per chunk
  // With neighbours: per chunk, the swarm's members (node ids) by kind, as the tracker lists them.
  std::vector<std::vector<uint32_t>> seeders, leechers;
};

enum WorkerOn : uint8_t { kIdle, kWaitReady, kWaitUpstream, kDownloading };

struct Fetch {
  uint32_t node = 0, blob = 0;
  bool done = false;
  std::vector<uint8_t> origin;  // per chunk: 0 none, 1 peers, 2 upstream
  std::vector<uint8_t> in_upstream, ready_known, worker_on;
  std::vector<uint8_t> background;   // per chunk: taken by a background stream
  int bg_parked = 0;                 // background streams waiting for a publish
  bool bg_listed = false;            // in its blob's bg_waiting
  std::vector<std::string> lease;    // per chunk while we hold its lease
  std::vector<uint8_t> have;         // per piece
  std::vector<uint8_t> inflight;     // per piece: flows carrying parts of it to us now
  std::vector<uint32_t> have_count;  // per chunk
  std::vector<uint32_t> download;    // per chunk: its download from peers, or kNone
  uint32_t complete_chunks = 0, contiguous = 0, next = 0;
  bool watcher_busy = false;
  bool watcher_waits = false;        // a kick is scheduled for the end of ready_interval
  double ready_sent = -1e18;         // when the watcher's last poll went out
  bool upstream_stopped = false;
  // With neighbours (empty without): per chunk, our index in the blob's seeders or leechers
  // (kNone: not in the swarm), our connections, and P slots of connected nodes.
  std::vector<uint32_t> member_pos;
  std::vector<uint8_t> links;
  std::vector<uint32_t> peers;
};

struct Download {
  bool alive = false;
  uint32_t fetch = 0, chunk = 0;
  int active = 0;
  bool in_hungry = false;
  bool tick_pending = false;      // a retry of Fill is scheduled
  std::vector<uint32_t> sources;  // nodes with a flow to us now
  std::vector<FlowId> flows;      // parallel to sources
  // With neighbours: nodes we tried to connect to, when the download started and last got a
  // piece, whether it has had a connection, and the agent's watch (see PeerWatch).
  std::vector<uint32_t> tried;
  double started = 0, last_piece = 0;
  bool linked = false, half_reasked = false, no_peer_counted = false;
};

struct SimFlow {
  bool upstream = false;
  uint32_t fetch = 0, chunk = 0, piece = 0, src = kNone, download = kNone;
  double remaining = 0, last_t = 0;
};

struct Event {
  double t;
  uint64_t seq;
  uint32_t closure;  // its index in closures_
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

// Flows by the time their current piece (or chunk) completes: one entry per flow, moved in
// place when its rate changes (a plain event heap filled up with stale entries, one per flow
// per re-solve, and its pops dominated the run time at 500 nodes).
class FlowHeap {
 public:
  bool empty() const { return heap_.empty(); }
  FlowId top() const { return heap_.front(); }
  double top_time() const { return key_[heap_.front()]; }
  void Set(FlowId f, double t) {
    if (f >= pos_.size()) {
      pos_.resize(f + 1, kAbsent);
      key_.resize(f + 1, 0);
    }
    if (pos_[f] == kAbsent) {
      pos_[f] = heap_.size();
      heap_.push_back(f);
      key_[f] = t;
      Up(pos_[f]);
      return;
    }
    double old = key_[f];
    key_[f] = t;
    if (t < old)
      Up(pos_[f]);
    else
      Down(pos_[f]);
  }
  void Remove(FlowId f) {
    if (f >= pos_.size() || pos_[f] == kAbsent) return;
    size_t i = pos_[f];
    pos_[f] = kAbsent;
    FlowId last = heap_.back();
    heap_.pop_back();
    if (i == heap_.size()) return;
    heap_[i] = last;
    pos_[last] = i;
    Up(i);
    Down(pos_[last]);
  }

 private:
  static constexpr size_t kAbsent = std::numeric_limits<size_t>::max();
  bool Less(size_t a, size_t b) const {
    FlowId x = heap_[a], y = heap_[b];
    return key_[x] != key_[y] ? key_[x] < key_[y] : x < y;
  }
  void Swap(size_t a, size_t b) {
    std::swap(heap_[a], heap_[b]);
    pos_[heap_[a]] = a;
    pos_[heap_[b]] = b;
  }
  void Up(size_t i) {
    while (i > 0) {
      size_t p = (i - 1) / 2;
      if (!Less(i, p)) break;
      Swap(i, p);
      i = p;
    }
  }
  void Down(size_t i) {
    for (;;) {
      size_t l = 2 * i + 1, r = l + 1, m = i;
      if (l < heap_.size() && Less(l, m)) m = l;
      if (r < heap_.size() && Less(r, m)) m = r;
      if (m == i) return;
      Swap(i, m);
      i = m;
    }
  }
  std::vector<FlowId> heap_;
  std::vector<size_t> pos_;
  std::vector<double> key_;
};

// A parked long-poll on the tracker.
struct Waiter {
  bool parked = false;
  uint32_t gen = 0;
  bool ready = false;  // a ready poll (else work)
  uint32_t fetch = 0;
  std::vector<uint32_t> wanted;
  double deadline = 0, sent = 0;
  bool cap = false;
  double wake_at = 0;  // min(deadline, the table's recheck time)
  // The time of this slot's pending timer (+inf: none). A waiter re-parked after a wake-up keeps
  // its slot and its timer: at 2,500 nodes every lease end re-parks ~27,500 work polls, and a
  // new timer per re-park flooded the event queue.
  double timer_at = std::numeric_limits<double>::infinity();
};

// xoshiro256** (small and fast; the simulator draws a few random numbers per piece).
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& v : s_) {
      seed += 0x9e3779b97f4a7c15ull;  // splitmix64
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      v = z ^ (z >> 31);
    }
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, n) (n > 0).
  size_t Below(size_t n) {
    return static_cast<size_t>((static_cast<unsigned __int128>(Next()) * n) >> 64);
  }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

class Sim {
 public:
  explicit Sim(const SimConfig& c) : c_(c), table_(c.table, c.seed), rng_(c.seed) {}
  SimResult Run();

 private:
  // ---- event loop ----
  void At(double t, std::function<void()> fn);
  void ScheduleFlow(FlowId f);
  void MaybeRecompute();
  void Recompute();
  void OnFlowDone(FlowId f);
  FlowId StartFlow(uint32_t fetch, uint32_t chunk, uint32_t piece, uint32_t src, uint32_t dl,
                   uint64_t bytes);
  // ---- tracker ----
  void Count(const char* route, bool request);
  // Counts an announce of fetch's chunk torrent under route, and logs it (log_announces).
  void CountAnnounce(uint32_t fetch, const char* route);
  void TrackerWork(uint32_t fetch, double sent, double deadline, uint32_t waiter);
  void TrackerReady(uint32_t fetch, std::vector<uint32_t> wanted, double sent, double deadline,
                    uint32_t waiter);
  uint32_t Park(Waiter w, double recheck, uint32_t slot);
  void OnTimer(uint32_t id);
  void DrainWakes();
  void Reevaluate(uint32_t waiter_id);
  // ---- agents ----
  void StartBlob(uint32_t fetch);
  void AskWork(uint32_t fetch);
  void OnWorkAnswer(uint32_t fetch, const LeaseAnswer& a, double sent);
  void RenewLoop(uint32_t fetch, uint32_t chunk, std::string lease);
  void OnUpstreamDone(uint32_t fetch, uint32_t chunk);
  void WatcherKick(uint32_t fetch);
  std::vector<uint32_t> ReadyWanted(const Fetch& f) const;
  void OnReadyAnswer(uint32_t fetch, const std::vector<uint32_t>& ready);
  void WorkerNext(uint32_t fetch);
  void BackgroundNext(uint32_t fetch);
  void OnBackgroundAnswer(uint32_t fetch);
  void WakeBackground(uint32_t blob);
  void WatcherPick(uint32_t fetch);
  void RecordPrefix(const Fetch& f);
  void FromPeers(uint32_t fetch, uint32_t chunk);
  void Fill(uint32_t dl);
  uint32_t SampledSource(const Download& d, const Fetch& f, const std::vector<uint32_t>& needed);
  uint32_t SampledHolder(const Download& d, const Fetch& f, uint32_t piece);
  bool PickPiece(const Fetch& f, uint32_t chunk, uint32_t src, uint32_t* piece);
  void WakeHungry(uint32_t blob, uint32_t chunk, uint32_t from, uint32_t piece);
  // ---- neighbours (peers_per_chunk > 0) ----
  uint32_t FetchOf(uint32_t node, uint32_t blob) const {
    return static_cast<uint32_t>(size_t{node} * blobs_.size() + blob);
  }
  bool Seeding(const Fetch& f, uint32_t k) const {
    return f.have_count[k] == blobs_[f.blob].piece_count[k];
  }
  const uint32_t* PeersOf(const Fetch& f, uint32_t k) const {
    return &f.peers[size_t{k} * static_cast<size_t>(c_.peers_per_chunk)];
  }
  bool Linked(const Fetch& f, uint32_t k, uint32_t node) const;
  void JoinSwarm(uint32_t fetch, uint32_t k);
  void LeaveList(uint32_t fetch, uint32_t k);
  std::vector<uint32_t> SelectPeers(const Fetch& f, uint32_t k, bool seeder);
  void SamplePeers(const std::vector<uint32_t>& from, size_t want, uint32_t self, bool has_self,
                   std::vector<uint32_t>& out);
  void Announce(uint32_t fetch, uint32_t k, const char* route);
  bool Connect(uint32_t fetch, uint32_t k, uint32_t node);
  void AddLink(uint32_t fetch, uint32_t k, uint32_t node);
  void DropLink(uint32_t fetch, uint32_t k, uint32_t node);
  void OnLinked(uint32_t fetch, uint32_t k);
  void CloseRedundant(uint32_t fetch, uint32_t k);
  void DropIdleLinks(uint32_t fetch, uint32_t k);
  void PeerWatch(uint32_t dl);
  void WakeNeighbours(uint32_t fetch, uint32_t k, uint32_t piece);
  uint32_t NeighbourSource(const Download& d, const Fetch& f, uint32_t k) const;
  uint32_t NeighbourHolder(const Download& d, const Fetch& f, uint32_t k, uint32_t piece) const;
  template <typename Serves>
  uint32_t LeastLoadedNeighbour(const Download& d, const Fetch& f, uint32_t k,
                                Serves serves) const;
  void GotPiece(uint32_t fetch, uint32_t piece);
  void ChunkComplete(uint32_t fetch, uint32_t chunk);
  bool AllHeld(const Fetch& f) const { return f.complete_chunks == blobs_[f.blob].chunks; }

  const SimConfig& c_;
  tracker::BlobTable table_;
  Rng rng_;
  FlowModel net_;
  LinkId nat_ = 0;
  std::vector<LinkId> up_, down_;
  // With an upstream reserve: per node, the link its peer downloads also cross (its downlink's
  // capacity, held lower while the node has upstream flows), and its upstream flows now.
  std::vector<LinkId> peer_down_;
  std::vector<uint32_t> upstream_flows_;
  void UpstreamFlows(uint32_t node, int delta);
  std::vector<int> uploads_;  // per node
  std::vector<Blob> blobs_;
  std::vector<Fetch> fetches_;  // node * blobs + blob
  std::vector<std::string> agent_ids_;
  std::vector<uint32_t> blobs_left_;  // per node
  std::vector<Download> downloads_;
  std::vector<SimFlow> flows_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;  // closures
  FlowHeap flow_heap_;
  std::vector<std::function<void()>> closures_;
  std::vector<uint32_t> free_closures_;
  uint64_t seq_ = 0;
  double now_ = 0;
  bool recompute_pending_ = false;
  double last_recompute_ = -1;
  std::vector<FlowId> changed_;
  // Long-polls.
  std::vector<Waiter> waiters_;
  std::vector<uint32_t> free_waiters_;
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> blob_waiters_;  // (id, gen), FIFO
  std::vector<std::pair<uint32_t, uint32_t>> cap_waiters_;
  std::vector<uint32_t> pending_blob_wakes_;
  bool pending_cap_wake_ = false;
  std::vector<uint64_t> req_buckets_, call_buckets_;
  uint32_t largest_ = 0;
  double rtt_ = 0, half_ = 0;
  SimResult r_;
};

// ---- event loop ---------------------------------------------------------------------------------

void Sim::At(double t, std::function<void()> fn) {
  uint32_t idx;
  if (!free_closures_.empty()) {
    idx = free_closures_.back();
    free_closures_.pop_back();
    closures_[idx] = std::move(fn);
  } else {
    idx = static_cast<uint32_t>(closures_.size());
    closures_.push_back(std::move(fn));
  }
  events_.push(Event{std::max(t, now_), seq_++, idx});
}

void Sim::ScheduleFlow(FlowId f) {
  double rate = net_.rate(f);
  if (rate <= 0) {
    flow_heap_.Remove(f);  // re-scheduled by the next Recompute
    return;
  }
  flow_heap_.Set(f, now_ + flows_[f].remaining / rate);
}

void Sim::UpstreamFlows(uint32_t node, int delta) {
  if (peer_down_.empty()) return;
  const uint32_t before = upstream_flows_[node];
  upstream_flows_[node] = static_cast<uint32_t>(static_cast<int>(before) + delta);
  const double full = net_.capacity(down_[node]);
  if (before == 0 && upstream_flows_[node] > 0) {
    net_.SetCapacity(peer_down_[node], full * (1 - c_.upstream_reserve));
  } else if (before > 0 && upstream_flows_[node] == 0) {
    net_.SetCapacity(peer_down_[node], full);
  }
}

void Sim::MaybeRecompute() {
  if (!net_.dirty() || recompute_pending_) return;
  recompute_pending_ = true;
  double t = std::max(now_, last_recompute_ + c_.quantum_s);
  At(t, [this] {
    recompute_pending_ = false;
    Recompute();
  });
}

void Sim::Recompute() {
  last_recompute_ = now_;
  for (FlowId f = 0; f < flows_.size(); ++f) {
    if (!net_.alive(f)) continue;
    SimFlow& fl = flows_[f];
    fl.remaining = std::max(0.0, fl.remaining - net_.rate(f) * (now_ - fl.last_t));
    fl.last_t = now_;
  }
  changed_.clear();
  net_.Recompute(&changed_);
  for (FlowId f : changed_) ScheduleFlow(f);
  r_.peak_flows = std::max(r_.peak_flows, net_.flow_count());
}

FlowId Sim::StartFlow(uint32_t fetch, uint32_t chunk, uint32_t piece, uint32_t src, uint32_t dl,
                      uint64_t bytes) {
  const uint32_t node = fetches_[fetch].node;
  FlowId f;
  if (src == kNone) {
    f = net_.AddFlow({nat_, down_[node]});
    UpstreamFlows(node, +1);
  } else {
    double cap = static_cast<double>(c_.request_window) / c_.rtt_s;
    if (peer_down_.empty()) {
      f = net_.AddFlow({up_[src], down_[node]}, cap);
    } else {
      f = net_.AddFlow({up_[src], down_[node], peer_down_[node]}, cap);
    }
  }
  if (flows_.size() <= f) flows_.resize(f + 1);
  SimFlow& fl = flows_[f];
  fl = SimFlow{};
  fl.upstream = src == kNone;
  fl.fetch = fetch;
  fl.chunk = chunk;
  fl.piece = piece;
  fl.src = src;
  fl.download = dl;
  fl.remaining = static_cast<double>(bytes);
  fl.last_t = now_;
  ScheduleFlow(f);
  r_.peak_flows = std::max(r_.peak_flows, net_.flow_count());
  return f;
}

// ---- tracker
// -------------------------------------------------------------------------------------

void Sim::Count(const char* route, bool request) {
  size_t sec = static_cast<size_t>(std::max(0.0, now_));
  auto& buckets = request ? req_buckets_ : call_buckets_;
  if (buckets.size() <= sec) buckets.resize(sec + 1, 0);
  ++buckets[sec];
  if (request) {
    ++r_.calls.requests[route];
    ++r_.calls.total_requests;
  } else {
    ++r_.calls.table_calls[route];
    ++r_.calls.total_table_calls;
  }
}

void Sim::CountAnnounce(uint32_t fetch, const char* route) {
  Count(route, true);
  if (c_.log_announces) {
    r_.announces.push_back({now_, fetches_[fetch].node, fetches_[fetch].blob});
  }
}

uint32_t Sim::Park(Waiter w, double recheck, uint32_t slot) {
  uint32_t id = slot;
  if (id == kNone) {
    if (!free_waiters_.empty()) {
      id = free_waiters_.back();
      free_waiters_.pop_back();
    } else {
      id = static_cast<uint32_t>(waiters_.size());
      waiters_.emplace_back();
    }
  }
  const uint32_t gen = waiters_[id].gen + 1;
  const double timer_at = waiters_[id].timer_at;
  w.parked = true;
  w.gen = gen;
  w.timer_at = timer_at;
  if (recheck <= now_) recheck = now_ + 1e-6;
  w.wake_at = std::min(w.deadline, recheck);
  waiters_[id] = std::move(w);
  Waiter& p = waiters_[id];
  blob_waiters_[fetches_[p.fetch].blob].emplace_back(id, gen);
  if (p.cap) cap_waiters_.emplace_back(id, gen);
  if (p.timer_at > p.wake_at) {
    p.timer_at = p.wake_at;
    At(p.wake_at, [this, id] { OnTimer(id); });
  }
  return id;
}

void Sim::OnTimer(uint32_t id) {
  Waiter& w = waiters_[id];
  w.timer_at = std::numeric_limits<double>::infinity();
  if (!w.parked) return;
  if (now_ >= w.wake_at) {
    Reevaluate(id);
    DrainWakes();
    return;
  }
  w.timer_at = w.wake_at;  // parked again since, with a later wake-up
  At(w.wake_at, [this, id] { OnTimer(id); });
}

void Sim::Reevaluate(uint32_t id) {
  Waiter& slot = waiters_[id];
  slot.parked = false;
  std::vector<uint32_t> wanted = std::move(slot.wanted);
  const uint32_t fetch = slot.fetch;
  const double sent = slot.sent, deadline = slot.deadline;
  // The call parks again in the same slot, or answers and frees it.
  if (slot.ready) {
    TrackerReady(fetch, std::move(wanted), sent, deadline, id);
  } else {
    TrackerWork(fetch, sent, deadline, id);
  }
}

void Sim::DrainWakes() {
  while (!pending_blob_wakes_.empty() || pending_cap_wake_) {
    std::vector<std::pair<uint32_t, uint32_t>> woken;
    if (!pending_blob_wakes_.empty()) {
      uint32_t b = pending_blob_wakes_.back();
      pending_blob_wakes_.pop_back();
      woken.swap(blob_waiters_[b]);
    } else {
      pending_cap_wake_ = false;
      woken.swap(cap_waiters_);
    }
    for (auto [id, gen] : woken) {
      if (waiters_[id].parked && waiters_[id].gen == gen) Reevaluate(id);
    }
  }
}

void Sim::TrackerWork(uint32_t fetch, double sent, double deadline, uint32_t slot) {
  Fetch& f = fetches_[fetch];
  const Blob& b = blobs_[f.blob];
  Count("work", false);
  auto answer = table_.Work(b.digest, agent_ids_[f.node], b.source, ::shoal::sim::At(now_));
  if (!answer) throw std::runtime_error("tracker Work: " + answer.error().message);
  LeaseAnswer a = std::move(answer.value());
  if (a.kind == LeaseAnswer::Kind::kWait && now_ < deadline) {
    Waiter w;
    w.ready = false;
    w.fetch = fetch;
    w.sent = sent;
    w.deadline = deadline;
    w.cap = a.reason == WaitReason::kClusterCap || a.reason == WaitReason::kAgentCap;
    Park(std::move(w), SecondsOf(a.recheck_at), slot);
    return;
  }
  if (slot != kNone) free_waiters_.push_back(slot);
  At(now_ + half_, [this, fetch, a = std::move(a), sent] { OnWorkAnswer(fetch, a, sent); });
}

void Sim::TrackerReady(uint32_t fetch, std::vector<uint32_t> wanted, double sent, double deadline,
                       uint32_t slot) {
  Fetch& f = fetches_[fetch];
  const Blob& b = blobs_[f.blob];
  std::vector<uint32_t> ready;
  TimePoint recheck = TimePoint::max();
  for (uint32_t k : wanted) {
    Count("lease", false);
    auto answer = table_.Lease(b.digest, k, agent_ids_[f.node], b.source, ::shoal::sim::At(now_),
                               /*may_grant=*/false);
    if (!answer) throw std::runtime_error("tracker Lease: " + answer.error().message);
    if (answer.value().kind == LeaseAnswer::Kind::kReady) {
      ready.push_back(k);
    } else {
      recheck = std::min(recheck, answer.value().recheck_at);
    }
  }
  if (ready.empty() && now_ < deadline) {
    Waiter w;
    w.ready = true;
    w.fetch = fetch;
    w.wanted = std::move(wanted);
    w.sent = sent;
    w.deadline = deadline;
    Park(std::move(w), SecondsOf(recheck), slot);
    return;
  }
  if (slot != kNone) free_waiters_.push_back(slot);
  At(now_ + half_, [this, fetch, ready = std::move(ready)] { OnReadyAnswer(fetch, ready); });
}

// ---- agents: upstream worker
// ------------------------------------------------------------------------

void Sim::StartBlob(uint32_t fetch) {
  Count("table", true);
  At(now_ + half_, [this, fetch] {
    Fetch& f = fetches_[fetch];
    const Blob& b = blobs_[f.blob];
    Count("ensure", false);
    auto view = table_.Ensure(b.digest, b.source, ::shoal::sim::At(now_));
    if (!view) throw std::runtime_error("tracker Ensure: " + view.error().message);
    if (!(view.value().layout == b.layout)) throw std::runtime_error("layout differs");
    At(now_ + half_, [this, fetch] {
      // RunChunkFetch: the upstream worker and the ready watcher, then the window workers.
      AskWork(fetch);
      WatcherKick(fetch);
      const Blob& b = blobs_[fetches_[fetch].blob];
      int workers = std::max(1, std::min<int>(c_.range_streams, static_cast<int>(b.chunks)));
      int head = c_.head_streams < 0 ? workers : std::clamp(c_.head_streams, 1, workers);
      for (int i = 0; i < head; ++i) WorkerNext(fetch);
      for (int i = head; i < workers; ++i) BackgroundNext(fetch);
    });
  });
}

void Sim::AskWork(uint32_t fetch) {
  Fetch& f = fetches_[fetch];
  if (f.upstream_stopped) return;
  if (std::all_of(f.origin.begin(), f.origin.end(), [](uint8_t o) { return o != 0; })) {
    f.upstream_stopped = true;
    return;
  }
  const double sent = now_;
  Count("work", true);
  At(now_ + half_, [this, fetch, sent] {
    TrackerWork(fetch, sent, now_ + c_.lease_wait_s, kNone);
    DrainWakes();
  });
}

void Sim::OnWorkAnswer(uint32_t fetch, const LeaseAnswer& a, double sent) {
  Fetch& f = fetches_[fetch];
  const Blob& b = blobs_[f.blob];
  switch (a.kind) {
    case LeaseAnswer::Kind::kDone:
      // Every chunk is ready; stay around for chunks that may need fetching again.
      At(now_ + c_.lease_wait_s, [this, fetch] { AskWork(fetch); });
      return;
    case LeaseAnswer::Kind::kWait:
    case LeaseAnswer::Kind::kReady: {
      double pause = 0;
      if (now_ - sent < 0.2) pause = std::clamp(Secs(a.retry_after), 0.1, 2.0);
      At(now_ + pause, [this, fetch] { AskWork(fetch); });
      return;
    }
    case LeaseAnswer::Kind::kGranted:
      break;
  }
  const uint32_t k = a.chunk;
  if (f.origin[k] != 0) throw std::runtime_error("granted a chunk the agent holds");
  ++r_.leases_granted;
  f.in_upstream[k] = 1;
  f.lease[k] = a.lease_id;
  // The GET crosses to the registry and its first bytes come back.
  At(now_ + rtt_ + c_.registry_latency_s, [this, fetch, k] {
    Fetch& f = fetches_[fetch];
    const Blob& b = blobs_[f.blob];
    if (f.blob == largest_ && k == 0 && r_.first_byte_s[f.node] < 0) r_.first_byte_s[f.node] = now_;
    StartFlow(fetch, k, 0, kNone, kNone, b.chunk_len[k]);
    MaybeRecompute();
  });
  RenewLoop(fetch, k, a.lease_id);
  (void)b;
}

void Sim::RenewLoop(uint32_t fetch, uint32_t chunk, std::string lease) {
  double period = std::max(0.2, Secs(c_.table.lease_ttl) / 3);
  At(now_ + period, [this, fetch, chunk, lease = std::move(lease)]() mutable {
    Fetch& f = fetches_[fetch];
    if (!f.in_upstream[chunk] || f.lease[chunk] != lease) return;
    Count("renew", true);
    At(now_ + half_, [this, fetch, chunk, lease] {
      Fetch& f = fetches_[fetch];
      const Blob& b = blobs_[f.blob];
      Count("renew", false);
      auto renewed =
          table_.Renew(b.digest, chunk, agent_ids_[f.node], lease, 0, ::shoal::sim::At(now_));
      (void)renewed;  // a lost lease: the agent finishes the fetch anyway
      DrainWakes();
    });
    RenewLoop(fetch, chunk, std::move(lease));
  });
}

void Sim::OnUpstreamDone(uint32_t fetch, uint32_t k) {
  Fetch& f = fetches_[fetch];
  Blob& b = blobs_[f.blob];
  f.origin[k] = 2;
  f.in_upstream[k] = 0;
  for (uint32_t p = b.piece_off[k]; p < b.piece_off[k] + b.piece_count[k]; ++p) {
    if (!f.have[p]) {
      f.have[p] = 1;
      b.holders[p].push_back(f.node);
    }
  }
  f.have_count[k] = b.piece_count[k];
  std::string lease = std::move(f.lease[k]);
  f.lease[k].clear();
  ChunkComplete(fetch, k);
  if (f.worker_on[k] == kWaitUpstream || f.worker_on[k] == kWaitReady) {
    f.worker_on[k] = kIdle;
    WorkerNext(fetch);
  }
  // Build the torrent (done once per chunk), seed it, publish it; then ask for work again.
  Count("publish", true);
  At(now_ + half_, [this, fetch, k, lease = std::move(lease)] {
    Fetch& f = fetches_[fetch];
    const Blob& b = blobs_[f.blob];
    Count("publish", false);
    auto published = table_.Publish(b.digest, k, agent_ids_[f.node], lease, b.source, b.metainfo[k],
                                    ::shoal::sim::At(now_));
    if (!published) throw std::runtime_error("tracker Publish: " + published.error().message);
    Blob& pb = blobs_[f.blob];
    pb.published[k] = 1;
    ++pb.swarm[k];  // the leaseholder seeds it
    if (c_.peers_per_chunk > 0) {
      JoinSwarm(fetch, k);
      Announce(fetch, k, "seed-announce");
    }
    WakeBackground(f.blob);
    DrainWakes();
    At(now_ + half_, [this, fetch] {
      WatcherKick(fetch);
      AskWork(fetch);
    });
  });
}

// ---- agents: ready watcher and window workers
// ---------------------------------------------------------

std::vector<uint32_t> Sim::ReadyWanted(const Fetch& f) const {
  std::vector<uint32_t> wanted;
  const Blob& b = blobs_[f.blob];
  for (uint32_t k = f.contiguous; k < b.chunks && wanted.size() < c_.ready_window; ++k) {
    if (f.origin[k] != 0 || f.in_upstream[k] || f.ready_known[k]) continue;
    wanted.push_back(k);
  }
  return wanted;
}

void Sim::WatcherKick(uint32_t fetch) {
  Fetch& f = fetches_[fetch];
  if (f.watcher_busy || f.done) return;
  std::vector<uint32_t> wanted = ReadyWanted(f);
  if (wanted.empty()) return;  // kicked again when a chunk's state changes
  if (c_.ready_interval_s > 0 && now_ < f.ready_sent + c_.ready_interval_s) {
    if (!f.watcher_waits) {
      f.watcher_waits = true;
      At(f.ready_sent + c_.ready_interval_s, [this, fetch] {
        fetches_[fetch].watcher_waits = false;
        WatcherKick(fetch);
      });
    }
    return;
  }
  f.ready_sent = now_;
  f.watcher_busy = true;
  const double sent = now_;
  Count("ready", true);
  At(now_ + half_, [this, fetch, wanted = std::move(wanted), sent]() mutable {
    TrackerReady(fetch, std::move(wanted), sent, now_ + c_.lease_wait_s, kNone);
    DrainWakes();
  });
}

void Sim::OnReadyAnswer(uint32_t fetch, const std::vector<uint32_t>& ready) {
  Fetch& f = fetches_[fetch];
  f.watcher_busy = false;
  for (uint32_t k : ready) {
    f.ready_known[k] = 1;
    if (f.worker_on[k] == kWaitReady) FromPeers(fetch, k);
  }
  if (c_.background == SimConfig::Background::kWatcher && f.bg_parked > 0 && !ready.empty()) {
    int n = f.bg_parked;
    f.bg_parked = 0;
    for (int i = 0; i < n; ++i) WatcherPick(fetch);
  }
  WatcherKick(fetch);
}

void Sim::WorkerNext(uint32_t fetch) {
  Fetch& f = fetches_[fetch];
  const Blob& b = blobs_[f.blob];
  while (f.next < b.chunks) {
    uint32_t k = f.next++;
    if (f.origin[k] != 0 || f.worker_on[k] == kDownloading) continue;
    if (f.in_upstream[k]) {
      f.worker_on[k] = kWaitUpstream;
      return;
    }
    if (f.ready_known[k]) {
      FromPeers(fetch, k);
      return;
    }
    f.worker_on[k] = kWaitReady;
    WatcherKick(fetch);
    return;
  }
}

void Sim::FromPeers(uint32_t fetch, uint32_t k) {
  Fetch& f = fetches_[fetch];
  f.worker_on[k] = kDownloading;
  ++blobs_[f.blob].swarm[k];
  if (c_.peers_per_chunk > 0) JoinSwarm(fetch, k);
  // The torrent is added and announced; the first request goes out once connections are up.
  CountAnnounce(fetch, "announce");
  At(now_ + rtt_ * (1 + c_.connect_rtts), [this, fetch, k] {
    uint32_t id = static_cast<uint32_t>(downloads_.size());
    downloads_.emplace_back();
    Download& d = downloads_.back();
    d.alive = true;
    d.fetch = fetch;
    d.chunk = k;
    fetches_[fetch].download[k] = id;
    if (c_.peers_per_chunk > 0) {
      // The announce's answer (the tracker counted it above): connect to whom it names. Peers
      // may have connected to us already, since we joined the swarm.
      d.started = d.last_piece = now_;
      if (fetches_[fetch].links[k] > 0) OnLinked(fetch, k);
      Announce(fetch, k, nullptr);
      PeerWatch(id);
    }
    Fill(id);
    MaybeRecompute();
  });
}

// A background stream: asks the tracker for a ready chunk this node lacks and no stream of it
// fetches (the agent names what it holds or fetches, a bitmap of the blob's chunks), and the
// tracker answers with the one whose swarm (peers announced, fetching or seeding) is smallest,
// ties at random; --background-random picks any such chunk at random. With none ready it parks
// until the blob's next publish; with nothing left to take, the stream ends.
void Sim::BackgroundNext(uint32_t fetch) {
  if (fetches_[fetch].done) return;
  if (c_.background == SimConfig::Background::kWatcher) {
    WatcherPick(fetch);
    return;
  }
  Count("rarest", true);
  At(now_ + half_, [this, fetch] { OnBackgroundAnswer(fetch); });
}

void Sim::OnBackgroundAnswer(uint32_t fetch) {
  Fetch& f = fetches_[fetch];
  Blob& b = blobs_[f.blob];
  Count("rarest", false);
  uint32_t pick = kNone;
  uint32_t best = std::numeric_limits<uint32_t>::max(), ties = 0;
  bool unpublished = false;
  for (uint32_t k = 0; k < b.chunks; ++k) {
    if (f.origin[k] != 0 || f.in_upstream[k] || f.worker_on[k] != kIdle) continue;
    if (!b.published[k]) {
      unpublished = true;
      continue;
    }
    const uint32_t n = c_.background == SimConfig::Background::kRandom ? 0 : b.swarm[k];
    if (n < best) {
      best = n;
      ties = 1;
      pick = k;
    } else if (n == best && rng_.Below(++ties) == 0) {
      pick = k;
    }
  }
  if (pick == kNone) {
    if (!unpublished) return;  // nothing left to take: this stream ends
    ++f.bg_parked;
    if (!f.bg_listed) {
      f.bg_listed = true;
      b.bg_waiting.push_back(fetch);
    }
    return;
  }
  // The tracker counts the node in the chunk's swarm when it answers (the announce follows).
  At(now_ + half_, [this, fetch, pick] {
    Fetch& f = fetches_[fetch];
    if (f.origin[pick] != 0 || f.worker_on[pick] != kIdle || f.in_upstream[pick]) {
      BackgroundNext(fetch);  // a head stream or a lease got there first
      return;
    }
    f.background[pick] = 1;
    f.ready_known[pick] = 1;
    FromPeers(fetch, pick);
  });
}

void Sim::WatcherPick(uint32_t fetch) {
  Fetch& f = fetches_[fetch];
  const Blob& b = blobs_[f.blob];
  uint32_t pick = kNone, ties = 0;
  bool left = false;
  for (uint32_t k = 0; k < b.chunks; ++k) {
    if (f.origin[k] != 0 || f.in_upstream[k] || f.worker_on[k] != kIdle) continue;
    left = true;
    if (!f.ready_known[k]) continue;
    if (rng_.Below(++ties) == 0) pick = k;
  }
  if (pick != kNone) {
    f.background[pick] = 1;
    FromPeers(fetch, pick);
    return;
  }
  if (left) ++f.bg_parked;  // woken by the watcher's next answer (OnReadyAnswer)
  WatcherKick(fetch);
}

void Sim::WakeBackground(uint32_t blob) {
  std::vector<uint32_t> waiting;
  waiting.swap(blobs_[blob].bg_waiting);
  for (uint32_t fetch : waiting) {
    Fetch& f = fetches_[fetch];
    f.bg_listed = false;
    int n = f.bg_parked;
    f.bg_parked = 0;
    for (int i = 0; i < n; ++i) {
      Count("rarest", false);  // the parked poll re-asked
      At(now_ + half_, [this, fetch] { OnBackgroundAnswer(fetch); });
    }
  }
}

void Sim::RecordPrefix(const Fetch& f) {
  const Blob& b = blobs_[f.blob];
  const double frac = static_cast<double>(f.contiguous) / static_cast<double>(b.chunks);
  auto mark = [&](std::vector<double>& v, double at) {
    if (frac >= at && v[f.node] < 0) v[f.node] = now_;
  };
  mark(r_.prefix25_s, 0.25);
  mark(r_.prefix50_s, 0.5);
  mark(r_.prefix75_s, 0.75);
}

// The piece of chunk to fetch next (from src when src != kNone, else from anyone): the lowest
// missing one in the chunk the client waits on, else the rarest (ties at random).
bool Sim::PickPiece(const Fetch& f, uint32_t k, uint32_t src, uint32_t* piece) {
  const Blob& b = blobs_[f.blob];
  const Fetch* s = src == kNone ? nullptr : &fetches_[size_t{src} * blobs_.size() + f.blob];
  const bool sequential =
      f.contiguous == k && (c_.sequential == SimConfig::Sequential::kHead ||
                            (c_.sequential == SimConfig::Sequential::kFirst && k == 0));
  size_t best = std::numeric_limits<size_t>::max();
  uint32_t ties = 0;
  bool found = false;
  for (uint32_t i = 0; i < b.piece_count[k]; ++i) {
    uint32_t p = b.piece_off[k] + i;
    if (f.have[p] || f.inflight[p]) continue;
    if (s != nullptr ? !s->have[p] : b.holders[p].empty()) continue;
    if (sequential) {
      *piece = p;
      return true;
    }
    size_t n = b.holders[p].size();
    if (n < best) {
      best = n;
      ties = 1;
      *piece = p;
      found = true;
    } else if (n == best && rng_.Below(++ties) == 0) {
      *piece = p;
    }
  }
  return found;
}

void Sim::Fill(uint32_t id) {
  Download* d = &downloads_[id];
  Fetch& f = fetches_[d->fetch];
  Blob& b = blobs_[f.blob];
  const uint32_t k = d->chunk;
  const uint32_t first = b.piece_off[k], count = b.piece_count[k];
  // As libtorrent does per connection: take a peer that has something we need (the least
  // loaded of a few sampled from the holders of the pieces we miss), then the piece to ask it
  // for (the lowest it has in the chunk the client waits on, else the rarest it has).
  std::vector<uint32_t> needed;
  for (uint32_t p = first; p < first + count; ++p) {
    if (!f.have[p] && !f.inflight[p] && !b.holders[p].empty()) needed.push_back(p);
  }
  int misses = 0;
  while (d->active < c_.max_sources && !needed.empty() && misses < 4) {
    const bool neighbours = c_.peers_per_chunk > 0;
    const uint32_t best = neighbours ? NeighbourSource(*d, f, k) : SampledSource(*d, f, needed);
    if (best == kNone && neighbours) break;
    uint32_t p;
    if (best == kNone || !PickPiece(f, k, best, &p)) {
      ++misses;
      continue;
    }
    f.inflight[p] = 1;
    needed.erase(std::find(needed.begin(), needed.end(), p));
    ++d->active;
    ++uploads_[best];
    FlowId fl = StartFlow(d->fetch, k, p, best, id, b.piece_len[p]);
    d = &downloads_[id];
    d->sources.push_back(best);
    d->flows.push_back(fl);
  }
  // End game: every missing piece is requested; a free slot takes half of the largest part in
  // flight from another holder (libtorrent asks several peers for the blocks of one piece).
  for (int round = 0; round < c_.max_sources && d->active < c_.max_sources; ++round) {
    bool unrequested = false;
    for (uint32_t p = first; p < first + count; ++p) {
      if (!f.have[p] && !f.inflight[p]) unrequested = true;
    }
    if (unrequested) break;
    FlowId split = kNoFlow;
    double largest = 0;
    for (FlowId fl : d->flows) {
      SimFlow& sf = flows_[fl];
      double rem = sf.remaining - net_.rate(fl) * (now_ - sf.last_t);
      if (rem > largest) {
        largest = rem;
        split = fl;
      }
    }
    if (split == kNoFlow || largest < 2.0 * c_.split_min) break;
    const uint32_t p = flows_[split].piece;
    const uint32_t best =
        c_.peers_per_chunk > 0 ? NeighbourHolder(*d, f, k, p) : SampledHolder(*d, f, p);
    if (best == kNone) break;
    SimFlow& old = flows_[split];
    old.remaining = largest / 2;
    old.last_t = now_;
    ScheduleFlow(split);
    ++f.inflight[p];
    ++d->active;
    ++uploads_[best];
    FlowId fl = StartFlow(d->fetch, k, p, best, id, static_cast<uint64_t>(largest / 2));
    d = &downloads_[id];
    d->sources.push_back(best);
    d->flows.push_back(fl);
  }
  bool starved = false;
  if (d->active < c_.max_sources) {
    for (uint32_t p = first; p < first + count; ++p) {
      if (!f.have[p] && !f.inflight[p]) starved = true;
    }
  }
  if (starved && !d->in_hungry && c_.peers_per_chunk == 0) {
    d->in_hungry = true;
    b.hungry[k].push_back(id);
  }
  if (starved && d->active == 0 && !d->tick_pending) {
    // Nothing in flight: only a new piece of this chunk somewhere or a freed upload slot of a
    // holder wakes us (WakeHungry); look again after a second as well (libtorrent's tick), in
    // case the slot freed up serving another chunk.
    d->tick_pending = true;
    At(now_ + 1.0, [this, id] {
      downloads_[id].tick_pending = false;
      if (downloads_[id].alive && downloads_[id].active == 0) Fill(id);
    });
  }
}

// Without neighbours, a source for Fill: the least loaded of up to 12 sampled from the holders of
// the pieces we need (kNone when none sampled has a free upload slot).
uint32_t Sim::SampledSource(const Download& d, const Fetch& f,
                            const std::vector<uint32_t>& needed) {
  const Blob& b = blobs_[f.blob];
  uint32_t best = kNone;
  int best_load = std::numeric_limits<int>::max();
  for (int t = 0; t < 12; ++t) {
    uint32_t p = needed[rng_.Below(needed.size())];
    const auto& h = b.holders[p];
    uint32_t cand = h[rng_.Below(h.size())];
    if (cand == f.node || uploads_[cand] >= c_.max_uploads || uploads_[cand] >= best_load) continue;
    if (std::find(d.sources.begin(), d.sources.end(), cand) != d.sources.end()) continue;
    best_load = uploads_[cand];
    best = cand;
  }
  return best;
}

// Without neighbours, a second source for a piece in flight (end game): the least loaded of up
// to 12 of its holders that is not a source of ours yet.
uint32_t Sim::SampledHolder(const Download& d, const Fetch& f, uint32_t p) {
  const auto& h = blobs_[f.blob].holders[p];
  uint32_t best = kNone;
  int best_load = std::numeric_limits<int>::max();
  for (size_t t = 0; t < std::min<size_t>(h.size(), 12); ++t) {
    uint32_t cand = h.size() <= 12 ? h[t] : h[rng_.Below(h.size())];
    if (cand == f.node || uploads_[cand] >= c_.max_uploads || uploads_[cand] >= best_load) continue;
    if (std::find(d.sources.begin(), d.sources.end(), cand) != d.sources.end()) continue;
    best_load = uploads_[cand];
    best = cand;
  }
  return best;
}

void Sim::WakeHungry(uint32_t blob, uint32_t k, uint32_t from, uint32_t piece) {
  if (c_.peers_per_chunk > 0) {
    WakeNeighbours(FetchOf(from, blob), k, piece);
    return;
  }
  Blob& b = blobs_[blob];
  auto& list = b.hungry[k];
  if (list.empty()) return;
  int woken = 0;
  size_t scanned = 0;
  size_t& cur = b.hungry_cursor[k];
  while (!list.empty() && woken < c_.hungry_wakes && scanned < list.size() * 2 &&
         scanned < size_t(c_.hungry_wakes) * 8) {
    if (cur >= list.size()) cur = 0;
    uint32_t id = list[cur];
    Download& d = downloads_[id];
    ++scanned;
    if (!d.alive || d.active >= c_.max_sources) {
      d.in_hungry = false;
      list[cur] = list.back();
      list.pop_back();
      continue;
    }
    const Fetch& f = fetches_[d.fetch];
    if (piece != kNone && (f.have[piece] || f.inflight[piece] || f.node == from)) {
      ++cur;
      continue;
    }
    d.in_hungry = false;
    list[cur] = list.back();
    list.pop_back();
    Fill(id);
    ++woken;
  }
}

void Sim::OnFlowDone(FlowId fid) {
  SimFlow fl = flows_[fid];
  if (fl.upstream) {
    r_.upstream_bytes += static_cast<double>(blobs_[fetches_[fl.fetch].blob].chunk_len[fl.chunk]);
    r_.upstream_busy_end_s = std::max(r_.upstream_busy_end_s, now_);
    net_.RemoveFlow(fid);
    flow_heap_.Remove(fid);
    UpstreamFlows(fetches_[fl.fetch].node, -1);
    OnUpstreamDone(fl.fetch, fl.chunk);
    MaybeRecompute();
    return;
  }
  Fetch& f = fetches_[fl.fetch];
  Blob& b = blobs_[f.blob];
  ++r_.piece_events;
  // fl.remaining may include a rounding leftover; the part's bytes are what it was given.
  const bool piece_done = --f.inflight[fl.piece] == 0;
  if (piece_done) {
    r_.peer_bytes += static_cast<double>(b.piece_len[fl.piece]);
    GotPiece(fl.fetch, fl.piece);
  }
  Download& d = downloads_[fl.download];
  // The connection goes on with another piece from the same holder if it has one we need.
  uint32_t next;
  if (d.alive && PickPiece(f, fl.chunk, fl.src, &next)) {
    f.inflight[next] = 1;
    SimFlow& live = flows_[fid];
    live.piece = next;
    live.remaining = static_cast<double>(b.piece_len[next]);
    live.last_t = now_;
    ScheduleFlow(fid);
    if (!piece_done) Fill(fl.download);
  } else {
    net_.RemoveFlow(fid);
    flow_heap_.Remove(fid);
    --uploads_[fl.src];
    if (d.alive) {
      --d.active;
      size_t i =
          static_cast<size_t>(std::find(d.flows.begin(), d.flows.end(), fid) - d.flows.begin());
      d.flows.erase(d.flows.begin() + static_cast<std::ptrdiff_t>(i));
      d.sources.erase(d.sources.begin() + static_cast<std::ptrdiff_t>(i));
      Fill(fl.download);
    }
    WakeHungry(f.blob, fl.chunk, fl.src, kNone);
  }
  if (piece_done) WakeHungry(f.blob, fl.chunk, f.node, fl.piece);
  MaybeRecompute();
}

void Sim::GotPiece(uint32_t fetch, uint32_t p) {
  Fetch& f = fetches_[fetch];
  Blob& b = blobs_[f.blob];
  f.have[p] = 1;
  b.holders[p].push_back(f.node);
  const uint32_t k = b.piece_chunk[p];
  if (c_.peers_per_chunk > 0 && f.download[k] != kNone) {
    Download& d = downloads_[f.download[k]];
    d.last_piece = now_;
    d.half_reasked = false;
  }
  if (f.blob == largest_ && p == 0 && r_.first_byte_s[f.node] < 0) r_.first_byte_s[f.node] = now_;
  if (++f.have_count[k] < b.piece_count[k]) return;
  // The download of chunk k is complete (no piece of it is in flight any more).
  f.origin[k] = 1;
  ChunkComplete(fetch, k);
}

void Sim::ChunkComplete(uint32_t fetch, uint32_t k) {
  Fetch& f = fetches_[fetch];
  const Blob& b = blobs_[f.blob];
  ++f.complete_chunks;
  while (f.contiguous < b.chunks && f.have_count[f.contiguous] == b.piece_count[f.contiguous])
    ++f.contiguous;
  if (f.blob == largest_ && k == 0) {
    if (r_.chunk0_first_s == 0) r_.chunk0_first_s = now_;
    r_.chunk0_all_s = std::max(r_.chunk0_all_s, now_);
  }
  if (f.download[k] != kNone) downloads_[f.download[k]].alive = false;
  if (c_.peers_per_chunk > 0 && f.member_pos[k] != kNone) {
    // A leecher turned seeder: the tracker lists it as one, its connections to seeders close,
    // and libtorrent announces the completion (and connects to the leechers it gets).
    if (f.download[k] != kNone) std::vector<uint32_t>().swap(downloads_[f.download[k]].tried);
    LeaveList(fetch, k);
    JoinSwarm(fetch, k);
    CloseRedundant(fetch, k);
    Announce(fetch, k, "seed-announce");
  }
  if (f.blob == largest_) RecordPrefix(f);
  if (f.worker_on[k] == kDownloading) {
    f.worker_on[k] = kIdle;
    // The download record dies with its last flow (see OnFlowDone); the worker moves on.
    if (f.background[k]) {
      At(now_, [this, fetch] { BackgroundNext(fetch); });
    } else {
      At(now_, [this, fetch] { WorkerNext(fetch); });
    }
  }
  if (AllHeld(f) && !f.done) {
    f.done = true;
    if (--blobs_left_[f.node] == 0) r_.completion_s[f.node] = now_;
  }
  WatcherKick(fetch);
}

// ---- neighbours (peers_per_chunk > 0)
// ------------------------------------------------------------------

bool Sim::Linked(const Fetch& f, uint32_t k, uint32_t node) const {
  const uint32_t* p = PeersOf(f, k);
  return std::find(p, p + f.links[k], node) != p + f.links[k];
}

// Into the chunk's swarm as a seeder when it holds the chunk, else as a leecher.
void Sim::JoinSwarm(uint32_t fetch, uint32_t k) {
  Fetch& f = fetches_[fetch];
  if (f.member_pos[k] != kNone) return;
  auto& list = Seeding(f, k) ? blobs_[f.blob].seeders[k] : blobs_[f.blob].leechers[k];
  f.member_pos[k] = static_cast<uint32_t>(list.size());
  list.push_back(f.node);
}

void Sim::LeaveList(uint32_t fetch, uint32_t k) {
  Fetch& f = fetches_[fetch];
  Blob& b = blobs_[f.blob];
  const uint32_t pos = f.member_pos[k];
  auto& list =
      pos < b.seeders[k].size() && b.seeders[k][pos] == f.node ? b.seeders[k] : b.leechers[k];
  const uint32_t moved = list.back();
  list[pos] = moved;
  list.pop_back();
  if (moved != f.node) fetches_[FetchOf(moved, f.blob)].member_pos[k] = pos;
  f.member_pos[k] = kNone;
}

// The tracker's SelectPeers (tracker/swarms/swarm_table.cc) with numwant max(1, P/2): a seeder
// gets leechers only; a leecher a random mix, each seeder seeder_weight times as likely as a
// leecher (randomised rounding of the expected count); never the asker.
std::vector<uint32_t> Sim::SelectPeers(const Fetch& f, uint32_t k, bool seeder) {
  static const double kSeederWeight = tracker::SwarmTableOptions{}.seeder_weight;
  const Blob& b = blobs_[f.blob];
  const auto& seeds = b.seeders[k];
  const auto& leech = b.leechers[k];
  const uint32_t pos = f.member_pos[k];
  const bool in_seeds = pos < seeds.size() && seeds[pos] == f.node;
  const bool in_leech = pos < leech.size() && leech[pos] == f.node;
  const size_t s = seeds.size() - (in_seeds ? 1 : 0), l = leech.size() - (in_leech ? 1 : 0);
  const size_t n = static_cast<size_t>(std::max(1, c_.peers_per_chunk / 2));
  std::vector<uint32_t> out;
  if (seeder) {
    SamplePeers(leech, n, f.node, in_leech, out);
  } else if (s + l <= n) {
    SamplePeers(seeds, s, f.node, in_seeds, out);
    SamplePeers(leech, l, f.node, in_leech, out);
  } else {
    const double weighted = kSeederWeight * static_cast<double>(s);
    const double expected = static_cast<double>(n) * weighted / (weighted + static_cast<double>(l));
    const double whole = std::floor(expected);
    size_t take = static_cast<size_t>(whole);
    if (rng_.Uniform() < expected - whole) ++take;
    take = std::clamp(take, n > l ? n - l : 0, std::min(n, s));
    SamplePeers(seeds, take, f.node, in_seeds, out);
    SamplePeers(leech, n - take, f.node, in_leech, out);
  }
  for (size_t i = out.size(); i > 1; --i) std::swap(out[i - 1], out[rng_.Below(i)]);
  return out;
}

// Appends want distinct members of from, other than self, chosen uniformly.
void Sim::SamplePeers(const std::vector<uint32_t>& from, size_t want, uint32_t self, bool has_self,
                      std::vector<uint32_t>& out) {
  const size_t m = from.size() - (has_self ? 1 : 0);
  want = std::min(want, m);
  if (want == 0) return;
  if (2 * want >= m) {
    std::vector<uint32_t> pool;
    for (uint32_t x : from) {
      if (x != self) pool.push_back(x);
    }
    for (size_t i = 0; i < want; ++i) {
      std::swap(pool[i], pool[i + rng_.Below(pool.size() - i)]);
      out.push_back(pool[i]);
    }
    return;
  }
  const size_t start = out.size();
  while (out.size() - start < want) {
    const uint32_t x = from[rng_.Below(from.size())];
    if (x == self ||
        std::find(out.begin() + static_cast<std::ptrdiff_t>(start), out.end(), x) != out.end())
      continue;
    out.push_back(x);
  }
}

// An announce of chunk k and its answer: connect to each peer named that we have not tried,
// while we have a free slot. route: the request to count (nullptr: counted by the caller).
void Sim::Announce(uint32_t fetch, uint32_t k, const char* route) {
  if (route != nullptr) CountAnnounce(fetch, route);
  Fetch& f = fetches_[fetch];
  const bool seeder = Seeding(f, k);
  const std::vector<uint32_t> named = SelectPeers(f, k, seeder);
  Download* d = !seeder && f.download[k] != kNone ? &downloads_[f.download[k]] : nullptr;
  for (uint32_t node : named) {
    if (f.links[k] >= c_.peers_per_chunk) break;
    if (Linked(f, k, node)) continue;
    if (d != nullptr) {
      if (std::find(d->tried.begin(), d->tried.end(), node) != d->tried.end()) continue;
      d->tried.push_back(node);
    }
    Connect(fetch, k, node);
  }
}

// A connection attempt from fetch's node to node on chunk k: refused when node has P
// connections on it; two seeders do not stay connected (never opened here).
bool Sim::Connect(uint32_t fetch, uint32_t k, uint32_t node) {
  const Fetch& f = fetches_[fetch];
  const uint32_t other = FetchOf(node, f.blob);
  const Fetch& g = fetches_[other];
  if (f.links[k] >= c_.peers_per_chunk || (Seeding(f, k) && Seeding(g, k))) return false;
  if (g.links[k] >= c_.peers_per_chunk) {
    ++r_.refused;
    return false;
  }
  AddLink(fetch, k, node);
  AddLink(other, k, f.node);
  ++r_.connections;
  OnLinked(fetch, k);
  OnLinked(other, k);
  return true;
}

void Sim::AddLink(uint32_t fetch, uint32_t k, uint32_t node) {
  Fetch& f = fetches_[fetch];
  f.peers[size_t{k} * static_cast<size_t>(c_.peers_per_chunk) + f.links[k]] = node;
  ++f.links[k];
  r_.max_chunk_connections = std::max<int>(r_.max_chunk_connections, f.links[k]);
}

void Sim::DropLink(uint32_t fetch, uint32_t k, uint32_t node) {
  Fetch& f = fetches_[fetch];
  uint32_t* p = &f.peers[size_t{k} * static_cast<size_t>(c_.peers_per_chunk)];
  uint32_t* end = p + f.links[k];
  uint32_t* it = std::find(p, end, node);
  if (it == end) return;
  *it = *(end - 1);
  *(end - 1) = kNone;
  --f.links[k];
}

// A new connection of fetch's node on chunk k: its download (if one runs) looks for pieces.
void Sim::OnLinked(uint32_t fetch, uint32_t k) {
  const uint32_t id = fetches_[fetch].download[k];
  if (id == kNone || !downloads_[id].alive) return;
  Download& d = downloads_[id];
  if (!d.linked) {
    d.linked = true;
    r_.longest_no_peer_s = std::max(r_.longest_no_peer_s, now_ - d.started);
  }
  if (d.active < c_.max_sources) Fill(id);
}

// libtorrent's close_redundant_connections: a node that completed chunk k drops its seeders.
void Sim::CloseRedundant(uint32_t fetch, uint32_t k) {
  const Fetch& f = fetches_[fetch];
  const uint32_t* p = PeersOf(f, k);
  std::vector<uint32_t> seeds;
  for (uint32_t i = 0; i < f.links[k]; ++i) {
    if (Seeding(fetches_[FetchOf(p[i], f.blob)], k)) seeds.push_back(p[i]);
  }
  for (uint32_t node : seeds) {
    DropLink(fetch, k, node);
    DropLink(FetchOf(node, f.blob), k, f.node);
    ++r_.redundant_closed;
  }
}

// A chunk given up after a stall: the connections without a flow on them close (the agent
// removes the torrent and adds it again).
void Sim::DropIdleLinks(uint32_t fetch, uint32_t k) {
  const Fetch& f = fetches_[fetch];
  const uint32_t* p = PeersOf(f, k);
  std::vector<uint32_t> idle;
  for (uint32_t i = 0; i < f.links[k]; ++i) {
    const uint32_t id = fetches_[FetchOf(p[i], f.blob)].download[k];
    if (id != kNone && downloads_[id].alive) {
      const auto& src = downloads_[id].sources;
      if (std::find(src.begin(), src.end(), f.node) != src.end()) continue;  // we feed it
    }
    idle.push_back(p[i]);
  }
  for (uint32_t node : idle) {
    DropLink(fetch, k, node);
    DropLink(FetchOf(node, f.blob), k, f.node);
  }
}

// The agent's watch over a chunk download (ChunkFetcher::FromPeers), every reannounce_s while
// it runs: with no connection, re-announce (and count it once past no_peer_limit_s); once per
// new piece, re-announce after peer_stall_s / 2 without one; after peer_stall_s without one and
// nothing in flight, give the chunk up and add it again.
void Sim::PeerWatch(uint32_t id) {
  At(now_ + c_.reannounce_s, [this, id] {
    Download& d = downloads_[id];
    if (!d.alive) return;
    const uint32_t fetch = d.fetch, k = d.chunk;
    const double idle = now_ - d.last_piece;
    constexpr double kEps = 1e-9;
    bool again = false;
    if (fetches_[fetch].links[k] == 0) {
      again = true;
      if (!d.no_peer_counted && now_ - d.started >= c_.no_peer_limit_s - kEps) {
        d.no_peer_counted = true;
        ++r_.no_peer_stalls;
      }
    } else if (idle >= c_.peer_stall_s - kEps && d.active == 0) {
      ++r_.peer_stalls;
      DropIdleLinks(fetch, k);
      d.tried.clear();
      d.last_piece = now_;
      d.half_reasked = false;
      again = true;
    } else if (idle >= c_.peer_stall_s / 2 - kEps && !d.half_reasked) {
      d.half_reasked = true;
      again = true;
    }
    if (again) {
      ++r_.reannounces;
      Announce(fetch, k, "reannounce");
    }
    PeerWatch(id);
  });
}

// Fetch's node got piece (kNone: freed an upload slot) of chunk k: its neighbours' downloads
// that lack the piece (or, for a slot, wait for one) look again.
void Sim::WakeNeighbours(uint32_t fetch, uint32_t k, uint32_t piece) {
  const Fetch& f = fetches_[fetch];
  if (piece == kNone && uploads_[f.node] != c_.max_uploads - 1) return;
  const uint32_t* p = PeersOf(f, k);
  for (uint32_t i = 0; i < f.links[k]; ++i) {
    const Fetch& g = fetches_[FetchOf(p[i], f.blob)];
    const uint32_t id = g.download[k];
    if (id == kNone) continue;
    const Download& d = downloads_[id];
    if (!d.alive || d.active >= c_.max_sources || d.active >= g.links[k]) continue;
    if (piece != kNone && (g.have[piece] || g.inflight[piece])) continue;
    if (std::find(d.sources.begin(), d.sources.end(), f.node) != d.sources.end()) continue;
    Fill(id);
  }
}

// With neighbours: the least loaded connected peer of chunk k with a free upload slot, not a
// source of ours yet, for which `serves(fetch of that peer)` holds (kNone: none).
template <typename Serves>
uint32_t Sim::LeastLoadedNeighbour(const Download& d, const Fetch& f, uint32_t k,
                                   Serves serves) const {
  const uint32_t* peers = PeersOf(f, k);
  uint32_t best = kNone;
  int best_load = std::numeric_limits<int>::max();
  for (uint32_t i = 0; i < f.links[k]; ++i) {
    const uint32_t cand = peers[i];
    if (uploads_[cand] >= c_.max_uploads || uploads_[cand] >= best_load) continue;
    if (std::find(d.sources.begin(), d.sources.end(), cand) != d.sources.end()) continue;
    if (!serves(fetches_[FetchOf(cand, f.blob)])) continue;
    best_load = uploads_[cand];
    best = cand;
  }
  return best;
}

// A source for Fill: a neighbour with a piece we need that nobody brings us.
uint32_t Sim::NeighbourSource(const Download& d, const Fetch& f, uint32_t k) const {
  const Blob& b = blobs_[f.blob];
  return LeastLoadedNeighbour(d, f, k, [&](const Fetch& s) {
    for (uint32_t q = b.piece_off[k]; q < b.piece_off[k] + b.piece_count[k]; ++q) {
      if (!f.have[q] && !f.inflight[q] && s.have[q]) return true;
    }
    return false;
  });
}

// A second source for piece p in flight (end game): a neighbour that holds it.
uint32_t Sim::NeighbourHolder(const Download& d, const Fetch& f, uint32_t k, uint32_t p) const {
  return LeastLoadedNeighbour(d, f, k, [p](const Fetch& s) { return s.have[p]; });
}

// ---- run
// ----------------------------------------------------------------------------------------------

SimResult Sim::Run() {
  auto wall0 = std::chrono::steady_clock::now();
  if (c_.nodes == 0 || c_.blobs.empty()) throw std::runtime_error("no nodes or no blobs");
  if (c_.peers_per_chunk < 0 || c_.peers_per_chunk > 255)
    throw std::runtime_error("peers per chunk: 0 to 255");
  rtt_ = c_.rtt_s;
  half_ = c_.rtt_s / 2;
  const double eff = c_.wire_efficiency;
  nat_ = net_.AddLink(c_.upstream_mbit * 1e6 / 8 * eff);
  for (size_t i = 0; i < c_.nodes; ++i) {
    up_.push_back(net_.AddLink(c_.node_mbit * 1e6 / 8 * eff));
    down_.push_back(net_.AddLink(c_.node_mbit * 1e6 / 8 * eff));
    agent_ids_.push_back("node" + std::to_string(i + 1));
    if (c_.upstream_reserve > 0) peer_down_.push_back(net_.AddLink(c_.node_mbit * 1e6 / 8 * eff));
  }
  upstream_flows_.assign(c_.nodes, 0);
  uploads_.assign(c_.nodes, 0);
  table_.SetListener([this](tracker::BlobEvent e, const Digest& d) {
    uint32_t b = kNone;
    for (uint32_t i = 0; i < blobs_.size(); ++i) {
      if (blobs_[i].digest == d) b = i;
    }
    switch (e) {
      case tracker::BlobEvent::kGranted:
        return;
      case tracker::BlobEvent::kExpired:
        ++r_.leases_expired;
        [[fallthrough]];
      case tracker::BlobEvent::kReleased:
        pending_cap_wake_ = true;
        [[fallthrough]];
      default:
        if (b != kNone) pending_blob_wakes_.push_back(b);
    }
  });
  // The image.
  for (size_t i = 0; i < c_.blobs.size(); ++i) {
    Blob b;
    char hex[65];
    std::snprintf(hex, sizeof hex, "%064zx", i + 1);
    b.digest = Digest::FromSha256Hex(hex);
    b.source = tracker::BlobSource{c_.blobs[i], "registry.sim", "sim/app"};
    auto layout = table_.LayoutFor(c_.blobs[i]);
    if (!layout) throw std::runtime_error("layout: " + layout.error().message);
    b.layout = layout.value();
    b.chunks = b.layout.chunk_count();
    for (uint32_t k = 0; k < b.chunks; ++k) {
      b.chunk_len.push_back(b.layout.chunk_length(k));
      b.piece_off.push_back(static_cast<uint32_t>(b.piece_len.size()));
      b.piece_count.push_back(b.layout.piece_count(k));
      uint64_t left = b.layout.chunk_length(k);
      const uint32_t ps = b.layout.piece_size_of(k);
      std::vector<swarm::Sha1> hashes;
      for (uint32_t p = 0; p < b.layout.piece_count(k); ++p) {
        b.piece_len.push_back(std::min<uint64_t>(ps, left));
        b.piece_chunk.push_back(k);
        left -= std::min<uint64_t>(ps, left);
        swarm::Sha1 h{};
        h[0] = static_cast<uint8_t>(i);
        h[1] = static_cast<uint8_t>(k);
        h[2] = static_cast<uint8_t>(k >> 8);
        h[3] = static_cast<uint8_t>(p);
        h[19] = 1;  // libtorrent takes an all-zero hash for "not set"
        hashes.push_back(h);
      }
      auto torrent = swarm::BuildChunkTorrent(std::string(hex) + "." + std::to_string(k),
                                              b.layout.chunk_length(k), ps, std::move(hashes),
                                              c_.table.root_cert);
      if (!torrent) throw std::runtime_error("chunk torrent: " + torrent.error().message);
      b.metainfo.push_back(std::move(torrent.value().metainfo));
    }
    b.holders.resize(b.piece_len.size());
    b.hungry.resize(b.chunks);
    b.published.assign(b.chunks, 0);
    b.swarm.assign(b.chunks, 0);
    b.hungry_cursor.assign(b.chunks, 0);
    if (c_.peers_per_chunk > 0) {
      b.seeders.resize(b.chunks);
      b.leechers.resize(b.chunks);
    }
    r_.layouts.push_back(LayoutInfo{c_.blobs[i], b.chunks, b.layout.chunk_size, b.layout.piece_size,
                                    b.layout.first_chunk_size});
    r_.image_bytes += static_cast<double>(c_.blobs[i]);
    if (c_.blobs[i] > c_.blobs[largest_]) largest_ = static_cast<uint32_t>(i);
    blobs_.push_back(std::move(b));
  }
  blob_waiters_.resize(blobs_.size());
  for (uint32_t n = 0; n < c_.nodes; ++n) {
    for (uint32_t i = 0; i < blobs_.size(); ++i) {
      Fetch f;
      f.node = n;
      f.blob = i;
      const Blob& b = blobs_[i];
      f.origin.assign(b.chunks, 0);
      f.in_upstream.assign(b.chunks, 0);
      f.ready_known.assign(b.chunks, 0);
      f.worker_on.assign(b.chunks, kIdle);
      f.background.assign(b.chunks, 0);
      f.lease.assign(b.chunks, "");
      f.have.assign(b.piece_len.size(), 0);
      f.inflight.assign(b.piece_len.size(), 0);
      f.have_count.assign(b.chunks, 0);
      f.download.assign(b.chunks, kNone);
      if (c_.peers_per_chunk > 0) {
        f.member_pos.assign(b.chunks, kNone);
        f.links.assign(b.chunks, 0);
        f.peers.assign(size_t{b.chunks} * static_cast<size_t>(c_.peers_per_chunk), kNone);
      }
      fetches_.push_back(std::move(f));
    }
  }
  blobs_left_.assign(c_.nodes, static_cast<uint32_t>(blobs_.size()));
  r_.completion_s.assign(c_.nodes, -1);
  r_.first_byte_s.assign(c_.nodes, -1);
  r_.prefix25_s.assign(c_.nodes, -1);
  r_.prefix50_s.assign(c_.nodes, -1);
  r_.prefix75_s.assign(c_.nodes, -1);
  // Every node's client starts at 0, the pulls' common start.
  for (uint32_t fetch = 0; fetch < fetches_.size(); ++fetch) {
    At(c_.client_start_s, [this, fetch] { StartBlob(fetch); });
  }
  if (c_.timeline_step_s > 0) {
    auto sample = std::make_shared<std::function<void()>>();
    auto last = std::make_shared<SimResult::Sample>();
    *sample = [this, sample, last] {
      SimResult::Sample s;
      s.t = now_;
      s.upstream_bytes = r_.upstream_bytes - last->upstream_bytes;
      s.peer_bytes = r_.peer_bytes - last->peer_bytes;
      s.leases = table_.totals().leases;
      s.flows = net_.flow_count();
      s.nodes_done = static_cast<size_t>(std::count_if(
          r_.completion_s.begin(), r_.completion_s.end(), [](double t) { return t >= 0; }));
      for (size_t i = 0; i < c_.nodes; ++i) {
        s.up_use += net_.used(up_[i]) / net_.capacity(up_[i]) / static_cast<double>(c_.nodes);
        s.down_use += net_.used(down_[i]) / net_.capacity(down_[i]) / static_cast<double>(c_.nodes);
      }
      s.nat_use = net_.used(nat_) / net_.capacity(nat_);
      last->upstream_bytes = r_.upstream_bytes;
      last->peer_bytes = r_.peer_bytes;
      r_.timeline.push_back(s);
      if (s.nodes_done < c_.nodes) At(now_ + c_.timeline_step_s, *sample);
    };
    At(c_.timeline_step_s, *sample);
  }
  if (c_.progress) {
    auto tick = std::make_shared<std::function<void()>>();
    *tick = [this, tick, wall0] {
      size_t n = static_cast<size_t>(std::count_if(r_.completion_s.begin(), r_.completion_s.end(),
                                                   [](double t) { return t >= 0; }));
      std::fprintf(stderr,
                   "shoal-sim: t = %.0f s, %zu of %zu nodes done, %llu events, %zu flows, "
                   "%.0f s of run time\n",
                   now_, n, c_.nodes, static_cast<unsigned long long>(r_.events), net_.flow_count(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count());
      if (n < c_.nodes) At(now_ + 10, *tick);
    };
    At(10, *tick);
  }
  size_t done = 0;
  while (!events_.empty() || !flow_heap_.empty()) {
    ++r_.events;
    // Closures first at equal times (a re-solve due now runs before the flows it would move).
    if (!events_.empty() && (flow_heap_.empty() || events_.top().t <= flow_heap_.top_time())) {
      Event e = events_.top();
      events_.pop();
      now_ = e.t;
      std::function<void()> fn = std::move(closures_[e.closure]);
      closures_[e.closure] = nullptr;
      free_closures_.push_back(e.closure);
      fn();
    } else {
      FlowId f = flow_heap_.top();
      now_ = std::max(now_, flow_heap_.top_time());
      flow_heap_.Remove(f);
      OnFlowDone(f);
    }
    MaybeRecompute();
    if ((r_.events & 0xfff) == 0) {
      done = static_cast<size_t>(std::count_if(r_.completion_s.begin(), r_.completion_s.end(),
                                               [](double t) { return t >= 0; }));
      if (done == c_.nodes) break;  // only the agents' idle polls are left
    }
    if (now_ > 1e6) throw std::runtime_error("simulation runs past 1e6 s: a stuck pull");
  }
  for (double t : r_.completion_s) {
    if (t < 0) throw std::runtime_error("a node never completed (a simulator bug)");
  }
  r_.sim_end_s = now_;
  r_.recomputes = net_.recomputes();
  for (uint64_t v : req_buckets_)
    r_.calls.peak_requests_per_s = std::max(r_.calls.peak_requests_per_s, v);
  for (uint64_t v : call_buckets_)
    r_.calls.peak_table_calls_per_s = std::max(r_.calls.peak_table_calls_per_s, v);
  r_.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return r_;
}

}  // namespace

SimResult RunSim(const SimConfig& config) {
  Sim sim(config);
  return sim.Run();
}

}  // namespace shoal::sim
