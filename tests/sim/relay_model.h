#pragma once
// The announce relay's batches, modelled over the announces of a simulated pull (shoal-sim
// --relay-replicas). Each node's relay (agent/announce_relay.cc) keeps one POST /v1/announces
// in flight per replica: an announce that finds none in flight leaves at once, alone; the others
// queue and leave together, at most max_batch, when the answer comes back. Every announce of a
// cold pull is urgent (started, completed, or still downloading), so the relay's 1 s linger for
// seeders' periodic announces plays no part. A replica is one FIFO server (the tracker's single
// thread) whose work per batch is batch_us + announces x announce_us. UDP, the default, is the
// same server taking one announce of udp_us per datagram.
//
// The model is fed the announce times of a pull simulated with immediate answers; it does not
// feed the answers' delays back into that pull, so its delays are right only while they are
// small next to the pull (it reports them, so the reader can see whether they are).

#include <cstddef>
#include <cstdint>
#include <vector>

namespace shoal::sim {

// One announce a node's libtorrent session sent during the simulated pull.
struct SentAnnounce {
  double t = 0;       // seconds from the common start
  uint32_t node = 0;  // the sender
  uint32_t blob = 0;  // which blob's chunk torrent (its owner replica answers it)
};

struct RelayModelConfig {
  size_t replicas = 3;
  // Blob b's owner: blobs by size, largest first, dealt round-robin from replica 0, so replica 0
  // answers the largest blob and every replicas-th of the others (rendezvous hashing's spread
  // in expectation, with the largest blob placed like any other).
  // Measured by shoal-bench-tracker on a keep-alive connection, batches of 8 and 64 (session 34).
  double batch_us = 18;      // tracker CPU per batch request (HTTP, routing, token check)
  double announce_us = 2.2;  // tracker CPU per announce in a batch
  double udp_us = 14.9;      // tracker CPU per UDP announce
  double rtt_s = 0.001;      // a node's round trip to the tracker
  size_t max_batch = 512;    // the tracker's kMaxBatchAnnounces
};

struct ReplicaLoad {
  size_t replica = 0;
  uint64_t announces = 0, batches = 0;
  // Announces per batch: mean, and the size of the batch that an announce at the 50th / 99th
  // percentile rides in (announce-weighted), and the largest.
  double batch_mean = 0, batch_p50 = 0, batch_p99 = 0;
  size_t batch_max = 0;
  // Tracker CPU over the pull, core-seconds, and the busiest second's share of one core.
  double core_s = 0, peak_second = 0;
  double udp_core_s = 0, udp_peak_second = 0;
  // From an announce leaving libtorrent to its answer: p50, p99, max (s), batches and UDP.
  double wait_p50_s = 0, wait_p99_s = 0, wait_max_s = 0;
  double udp_wait_p50_s = 0, udp_wait_p99_s = 0, udp_wait_max_s = 0;
  double span_s = 0;  // first announce to last answer
};

// The load of each replica (index = replica), from announces in any order. blob_bytes[b] is
// blob b's size (for the owner assignment); an announce of a blob beyond it counts as blob 0.
std::vector<ReplicaLoad> ModelRelay(std::vector<SentAnnounce> announces,
                                    const std::vector<uint64_t>& blob_bytes,
                                    const RelayModelConfig& config);

}  // namespace shoal::sim
