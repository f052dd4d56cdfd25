#pragma once
// Fills one BlobFetch chunk by chunk. Each chunk comes from peers (its torrent is ready), from
// upstream under a tracker lease (we fetch it, hash its pieces, seed it and publish its
// metainfo), or waits for whoever holds the lease. While the tracker is healthy this agent never
// fetches from upstream on its own; when no tracker answers for `tracker_grace` it fetches
// straight from upstream (never worse than no mirror) and says so in logs and metrics. A full
// tracker (503) is waited for longer (`tracker_busy_grace`), at the pace its Retry-After sets.
// Without a tracker configured every chunk comes from upstream.

#include <utility>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include "agent/blob_fetch.h"
#include "agent/seed_book.h"
#include "agent/tracker_client.h"
#include "agent/upstream_reserve.h"
#include "lib/swarm/chunk_torrent.h"
#include "lib/swarm/session.h"
#include "lib/upstream/registry_client.h"

namespace shoal::agent {

struct ChunkFetchOptions {
  // Chunk and piece sizes used when no tracker dictates them (blob_size is set per blob).
  swarm::ChunkLayout local_layout;
  int window = 4;  // chunks of one blob worked on at once
  // Of the window, the streams that take the chunks in order (what the client reads first);
  // with a swarm the others are background streams that take any chunk the blob's ready watcher
  // knows is ready, at random: nodes then hold different chunks to give each other, where in
  // order they all want the same few (shoal-sim at 250 nodes and 10 Gbit/s: p99 3.99x the
  // bound in order, 1.64x with one head stream; docs/benchmarks.md).
  int head_streams = 1;
  std::chrono::milliseconds lease_wait{5000};
  // The blob's ready watcher polls the tracker no sooner than this after its last poll.
  std::chrono::milliseconds ready_interval{250};
  std::chrono::milliseconds tracker_grace{10000};  // tracker errors tolerated before going direct
  // A full tracker (503 + Retry-After) is waited for this long before going direct.
  std::chrono::milliseconds tracker_busy_grace{30000};
  std::chrono::milliseconds peer_stall{30000};     // no verified piece for this long: re-lease
  // Failed upstream chunk fetches (each already retried by the client) before the blob fails,
  // counted over all of the blob's chunks.
  int upstream_attempts = 2;
};

// The agent's counters for where blob bytes came from and how chunk fetching went.
struct ChunkFetchMetrics {
  explicit ChunkFetchMetrics(prometheus::Registry& registry);
  prometheus::Counter& upstream_bytes;  // shoal_upstream_blob_bytes_total
  prometheus::Counter& peer_bytes;      // shoal_swarm_peer_bytes_total (verified pieces)
  prometheus::Family<prometheus::Counter>& chunks;     // shoal_swarm_chunks_total{source}
  prometheus::Family<prometheus::Counter>& fallbacks;  // shoal_swarm_fallback_total{reason}
  prometheus::Counter& leases;                         // shoal_swarm_leases_granted_total
  prometheus::Counter& lease_lost;                     // shoal_swarm_leases_lost_total
  prometheus::Counter& stalls;                         // shoal_swarm_peer_stalls_total
  prometheus::Counter& republished;  // shoal_swarm_chunks_republished_total (handed back to us)
};

// What every blob fetch shares; owned by the agent. tracker/swarm/seeds may be null (no swarm).
struct FetchServices {
  boost::asio::io_context& ioc;
  upstream::RegistryClient& client;
  TrackerClient* tracker;
  swarm::Swarm* swarm;
  SeedBook* seeds;
  ChunkFetchOptions options;
  ChunkFetchMetrics& metrics;
  UpstreamReserve* reserve = nullptr;  // held for each leased upstream fetch (null: none)
};

// Learns the blob's layout (tracker table, else local), then works through its chunks until the
// fetch ends. Call after fetch->Open(size). Network thread only.
boost::asio::awaitable<void> RunChunkFetch(FetchServices& services, std::shared_ptr<BlobFetch> fetch,
                                           upstream::RegistryEndpoint endpoint, BlobSource source);

}  // namespace shoal::agent
