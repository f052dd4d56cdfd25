#include "tests/sim/relay_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <queue>
#include <unordered_map>

namespace shoal::sim {
namespace {

// Nearest-rank percentile of sorted values.
double SortedPercentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

// Adds busy time [start, end) to per-second buckets.
void AddBusy(std::vector<double>& seconds, double start, double end) {
  while (start < end) {
    size_t s = static_cast<size_t>(std::max(0.0, start));
    double cut = std::min(end, static_cast<double>(s + 1));
    if (seconds.size() <= s) seconds.resize(s + 1, 0);
    seconds[s] += cut - start;
    start = cut;
  }
}

double Max(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

// UDP: every announce is one datagram, served in arrival order.
void ModelUdp(const std::vector<SentAnnounce>& in, const RelayModelConfig& c, ReplicaLoad& out) {
  const double half = c.rtt_s / 2, work = c.udp_us * 1e-6;
  double free_at = 0;
  std::vector<double> waits, busy;
  waits.reserve(in.size());
  for (const SentAnnounce& a : in) {  // sorted by t
    double start = std::max(a.t + half, free_at);
    free_at = start + work;
    AddBusy(busy, start, free_at);
    waits.push_back(free_at + half - a.t);
  }
  std::sort(waits.begin(), waits.end());
  out.udp_core_s = static_cast<double>(in.size()) * work;
  out.udp_peak_second = Max(busy);
  out.udp_wait_p50_s = SortedPercentile(waits, 0.5);
  out.udp_wait_p99_s = SortedPercentile(waits, 0.99);
  out.udp_wait_max_s = waits.empty() ? 0 : waits.back();
}

// Batches: per node one request in flight; a replica serves requests in arrival order.
void ModelBatches(const std::vector<SentAnnounce>& in, const RelayModelConfig& c,
                  ReplicaLoad& out) {
  const double half = c.rtt_s / 2;
  struct Relay {
    bool busy = false;
    std::vector<double> queued;  // send times of announces waiting for the next batch
  };
  std::unordered_map<uint32_t, Relay> relays;
  // Events: an answer reaching a node (kind 0) or a batch reaching the tracker (kind 1).
  struct Event {
    double t;
    int kind;
    uint32_t node;
    uint32_t batch;  // index into batches
    bool operator>(const Event& o) const { return t != o.t ? t > o.t : kind > o.kind; }
  };
  std::vector<std::vector<double>> batches;  // per batch: its announces' send times
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  double free_at = 0, last_answer = 0;
  std::vector<double> waits, busy, sizes_by_announce;
  std::vector<size_t> sizes;
  waits.reserve(in.size());
  auto send = [&](uint32_t node, std::vector<double> times, double now) {
    batches.push_back(std::move(times));
    events.push({now + half, 1, node, static_cast<uint32_t>(batches.size() - 1)});
    relays[node].busy = true;
  };
  auto take = [&](Relay& r) {
    size_t n = std::min(r.queued.size(), c.max_batch);
    std::vector<double> times(r.queued.begin(), r.queued.begin() + static_cast<ptrdiff_t>(n));
    r.queued.erase(r.queued.begin(), r.queued.begin() + static_cast<ptrdiff_t>(n));
    return times;
  };
  // Handles every event before time `until`.
  auto run_until = [&](double until) {
    while (!events.empty() && events.top().t <= until) {
      Event e = events.top();
      events.pop();
      if (e.kind == 1) {  // the tracker takes the batch when it is free
        const auto& b = batches[e.batch];
        double start = std::max(e.t, free_at);
        free_at = start + (c.batch_us + c.announce_us * static_cast<double>(b.size())) * 1e-6;
        AddBusy(busy, start, free_at);
        out.core_s += free_at - start;
        events.push({free_at + half, 0, e.node, e.batch});
      } else {  // the answer: every announce of the batch is answered; the next batch leaves
        last_answer = e.t;
        for (double sent : batches[e.batch]) waits.push_back(e.t - sent);
        sizes.push_back(batches[e.batch].size());
        for (size_t i = 0; i < batches[e.batch].size(); ++i)
          sizes_by_announce.push_back(static_cast<double>(batches[e.batch].size()));
        batches[e.batch].clear();
        batches[e.batch].shrink_to_fit();
        Relay& r = relays[e.node];
        r.busy = false;
        if (!r.queued.empty()) send(e.node, take(r), e.t);
      }
    }
  };
  for (const SentAnnounce& a : in) {  // sorted by t
    run_until(a.t);
    Relay& r = relays[a.node];
    if (r.busy) {
      r.queued.push_back(a.t);
    } else {
      send(a.node, {a.t}, a.t);
    }
  }
  run_until(1e300);
  out.batches = sizes.size();
  out.batch_mean = sizes.empty() ? 0
                                 : static_cast<double>(std::accumulate(
                                       sizes.begin(), sizes.end(), size_t{0})) /
                                       static_cast<double>(sizes.size());
  out.batch_max = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  std::sort(sizes_by_announce.begin(), sizes_by_announce.end());
  out.batch_p50 = SortedPercentile(sizes_by_announce, 0.5);
  out.batch_p99 = SortedPercentile(sizes_by_announce, 0.99);
  out.peak_second = Max(busy);
  std::sort(waits.begin(), waits.end());
  out.wait_p50_s = SortedPercentile(waits, 0.5);
  out.wait_p99_s = SortedPercentile(waits, 0.99);
  out.wait_max_s = waits.empty() ? 0 : waits.back();
  if (!in.empty()) out.span_s = last_answer - in.front().t;
}

}  // namespace

std::vector<ReplicaLoad> ModelRelay(std::vector<SentAnnounce> announces,
                                    const std::vector<uint64_t>& blob_bytes,
                                    const RelayModelConfig& config) {
  const size_t replicas = std::max<size_t>(config.replicas, 1);
  // Owners: blobs by size, largest first, dealt round-robin.
  std::vector<uint32_t> order(blob_bytes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return blob_bytes[a] > blob_bytes[b]; });
  std::vector<size_t> owner(blob_bytes.size(), 0);
  for (size_t i = 0; i < order.size(); ++i) owner[order[i]] = i % replicas;
  std::vector<std::vector<SentAnnounce>> by_replica(replicas);
  for (const SentAnnounce& a : announces) {
    size_t r = a.blob < owner.size() ? owner[a.blob] : owner.empty() ? 0 : owner[0];
    by_replica[r].push_back(a);
  }
  announces.clear();
  announces.shrink_to_fit();
  std::vector<ReplicaLoad> out(replicas);
  for (size_t r = 0; r < replicas; ++r) {
    auto& in = by_replica[r];
    std::stable_sort(in.begin(), in.end(),
                     [](const SentAnnounce& a, const SentAnnounce& b) { return a.t < b.t; });
    out[r].replica = r;
    out[r].announces = in.size();
    ModelUdp(in, config, out[r]);
    ModelBatches(in, config, out[r]);
    in.clear();
    in.shrink_to_fit();
  }
  return out;
}

}  // namespace shoal::sim
