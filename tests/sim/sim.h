#pragma once
// shoal-sim's simulator: N simulated agents pull one image at once under a simulated clock,
// scheduled by the REAL tracker tables (tracker::BlobTable: layouts, work grants, leases with
// their TTL and renewals, the cluster / per-agent / per-blob caps, the head start, publication
// of real chunk torrents), over a flow-level network (tests/sim/flow_model.h): every node has
// an uplink and a downlink of B, the upstream registry one link of U (the shared NAT), and the
// flows on them share max-min fairly.
//
// What a simulated agent does follows agent/chunk_fetcher.cc for each blob of the image (all
// blobs at once, as skopeo pulls them): one Table call; an upstream worker that long-polls
// Work, fetches a granted chunk from upstream (renewing the lease every TTL/3), seeds it and
// publishes it; a ready watcher that long-polls Ready for the 16 lowest chunks it neither holds,
// knows ready nor fetches; --range-streams window workers that take the chunks in order and
// download each ready one from peers (an announce, a connection set-up, then pieces: the chunk
// the client waits on in order, the others rarest first). Every tracker request costs a round
// trip; long-polls park on the tracker and are re-evaluated when the blob's table changes (and,
// for cap waiters, when any lease ends), at their recheck time and at their deadline, oldest
// first, as tracker/blobs/blob_api.cc and tracker/lease_waiters.cc do.
//
// Granularity: a peer transfer is one piece of a chunk torrent from one holder (a node that has
// verified it) to one node over one flow, which goes on with the next piece that holder has; a
// node fetches up to max_sources pieces of a chunk at once, each from a different holder, and in
// end game a free slot takes half of the largest part in flight from another holder; an upload
// slot limit per node stands in for libtorrent's connection limit. Not modelled: TCP slow start,
// losses and RTT unfairness, blocks downloaded twice, bad reports and re-fetches, disk and CPU.
//
// Neighbours (peers_per_chunk P > 0; with 0 every holder of a piece is a possible source). Each
// chunk torrent of each node has at most P connections, incoming and outgoing, as the agent's
// --peers-per-chunk sets libtorrent's per-torrent max_connections. A node joins a chunk's swarm
// when it starts the download (a leecher) or publishes the chunk (a seeder); a leecher that
// completes becomes a seeder. Every announce (the join, a leecher's re-announce, the seeder's
// announce at publish and at completion) gets max(1, P/2) members as the tracker's SelectPeers
// picks them (tracker/swarms/swarm_table.cc: at random, seeders weighted by seeder_weight, never
// the asker; a seeder gets leechers only), and the node connects to each it has not tried yet
// while it has a free slot. A target with P connections refuses; a refused or closed peer is not
// tried again (libtorrent waits min_reconnect_time, 60 s, before retrying a peer). Connections
// are symmetric and count against both ends; two seeders never stay connected (libtorrent's
// close_redundant_connections): when a node completes, its connections to seeders close. A node
// fetches a piece only from a connected neighbour that holds it, and a neighbour's new piece
// wakes only its neighbours. The agent's watch over a chunk download (agent/chunk_fetcher.cc):
// with no connection it re-announces every reannounce_s (1.25 s) until it has one; with no new
// piece for peer_stall_s / 2 it re-announces once; with none for peer_stall_s it gives the chunk
// up and adds it again (here: its idle connections close, it forgets whom it tried, and it
// re-announces). Not modelled with neighbours: the agent's ReportBad after a stall and its
// fall-back to upstream after 4 failures (the stalls are counted, see SimResult), libtorrent's
// peer turnover, connection set-up time per connection (one connect_rtts per chunk, as before),
// seeders' periodic re-announces (every 300 s, longer than the pulls simulated).

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lib/swarm/chunk_torrent.h"
#include "tests/sim/relay_model.h"
#include "tracker/blobs/blob_table.h"

namespace shoal::sim {

struct SimConfig {
  size_t nodes = 6;
  double node_mbit = 100;     // B, each direction of each node's link
  double upstream_mbit = 50;  // U, the one link of the upstream registry (the NAT)
  // Payload share of a link's bit rate (TCP/IP framing: 1448 payload bytes per 1514-byte frame).
  double wire_efficiency = 1448.0 / 1514.0;
  std::vector<uint64_t> blobs;        // the image's blobs (config and layers), bytes
  tracker::BlobTableOptions table;    // the tracker's settings (its defaults: see SimDefaults)
  int range_streams = 4;              // the agent's --range-streams
  // Of those streams, how many take the chunks in order (the head the client streams); the
  // others are background streams (see background). -1: every stream in order (the agent
  // before session 18).
  int head_streams = 1;
  // How a background stream picks its chunk:
  //   kRarest: asks the tracker, which answers with the ready chunk the node lacks (the agent
  //            names what it holds or fetches) that has the fewest peers in its swarm;
  //   kRandom: the same request, answered with any such chunk at random;
  //   kWatcher: no request of its own: a random chunk among those the blob's ready watcher
  //            (the 16 lowest chunks not held) has learned are ready, else it waits for the
  //            watcher's next answer (what the agent can do with today's tracker API).
  enum class Background { kRarest, kRandom, kWatcher };
  Background background = Background::kWatcher;  // the agent's
  // While a node fetches from upstream, its peer downloads are held to (1 - this) of its
  // downlink, so that its upstream flows keep up (an agent's libtorrent download rate limit
  // while it holds a lease). 0: no limit (the agent's default).
  double upstream_reserve = 0;
  // Which chunk a node downloads in order (the others rarest first): kHead, the chunk its
  // in-order prefix ends in (the chunk a streaming client waits on); kFirst, that chunk only
  // while it is the blob's chunk 0; kNone, no chunk.
  enum class Sequential { kHead, kFirst, kNone };
  Sequential sequential = Sequential::kFirst;  // the agent's (kHead before session 22)
  size_t ready_window = 16;           // chunks one ready long-poll names (kReadyWindow)
  // > 0: a blob's ready watcher sends its next poll no sooner than this after its last one (an
  // answer then carries every chunk published meanwhile; the agent's default since session 32).
  // 0: at once.
  double ready_interval_s = 0.25;
  double lease_wait_s = 5;            // the agent's long-poll wait (--lease-wait-ms)
  double rtt_s = 0.001;               // round trip between any two hosts (tracker, registry, peers)
  double registry_latency_s = 0.005;  // the registry's time to its first body byte after a GET
  double connect_rtts = 2;            // round trips before a new chunk torrent's first request
  double client_start_s = 0.5;        // the client's start, manifest and config before blob GETs
  int max_sources = 8;                // pieces of one chunk a node fetches at once
  int max_uploads = 400;              // upload flows a node serves at once (connection limit)
  // Connections per chunk torrent and node (the agent's --peers-per-chunk; see the neighbour
  // model above). 0: no neighbour model, every holder of a piece is a possible source.
  int peers_per_chunk = 0;
  double reannounce_s = 1.25;    // a chunk download with no connection re-announces this often
  double no_peer_limit_s = 2.5;  // the agent gives up a chunk with no connection for this long
  double peer_stall_s = 15;      // ... or with no new piece for this long (--peer-stall-ms)
  // Bytes a peer connection keeps requested (16 blocks of 16 KiB): caps its rate at window/RTT.
  uint64_t request_window = 16 * 16 * 1024;
  uint64_t split_min = 64 * 1024;  // end game splits a part in flight only above 2x this
  int hungry_wakes = 16;           // waiting downloaders told of one new piece
  double quantum_s = 0.001;        // rates are re-solved at most this often
  double timeline_step_s = 0;      // > 0: sample the timeline this often
  bool progress = false;           // a line on stderr every 10 simulated seconds
  bool log_announces = false;      // keep every announce in SimResult::announces
  uint64_t seed = 1;
};

// The tracker's defaults (tracker/config.h) as BlobTableOptions.
tracker::BlobTableOptions TrackerDefaults();

struct CallStats {
  // HTTP requests agents sent, by route.
  std::map<std::string, uint64_t> requests;
  // BlobTable calls the tracker made for them (a parked long-poll re-asks on every wake-up).
  std::map<std::string, uint64_t> table_calls;
  // Requests and table calls in the busiest second.
  uint64_t peak_requests_per_s = 0;
  uint64_t peak_table_calls_per_s = 0;
  uint64_t total_requests = 0;
  uint64_t total_table_calls = 0;
};

struct LayoutInfo {
  uint64_t size = 0;
  uint32_t chunks = 0;
  uint64_t chunk_size = 0;
  uint32_t piece_size = 0;
  uint64_t first_chunk = 0;
};

struct SimResult {
  std::vector<double> completion_s;  // per node: from the common start to its last blob
  std::vector<double> first_byte_s;  // per node: first byte of the largest blob
  // Per node: when the in-order prefix of the largest blob (what a client streaming it, or an
  // extraction reading it, can consume) first reached a quarter, half, three quarters of it.
  std::vector<double> prefix25_s, prefix50_s, prefix75_s;
  double image_bytes = 0;
  double upstream_bytes = 0;
  double peer_bytes = 0;
  // Chunk 0 of the largest blob: when the first node and when the last node had all of it.
  double chunk0_first_s = 0, chunk0_all_s = 0;
  double upstream_busy_end_s = 0;  // when the last upstream flow ended
  std::vector<LayoutInfo> layouts;
  // Sampled every timeline_step_s: bytes completed in the step (upstream chunks, peer pieces),
  // active leases, live flows and nodes done at its end.
  struct Sample {
    double t = 0, upstream_bytes = 0, peer_bytes = 0;
    size_t leases = 0, flows = 0, nodes_done = 0;
    // At the sample's instant: the mean share of capacity in use over the nodes' uplinks and
    // downlinks, and over the upstream link.
    double up_use = 0, down_use = 0, nat_use = 0;
  };
  std::vector<Sample> timeline;
  CallStats calls;
  uint64_t leases_granted = 0, leases_expired = 0;
  // The neighbour model (peers_per_chunk > 0): connections made, attempts refused (the target
  // had P), seed-to-seed connections closed, re-announces of chunk downloads (no connection, or
  // no piece for peer_stall_s / 2); chunk downloads still without a connection no_peer_limit_s
  // after they started (the agent would give them up and report them bad), and those with no
  // new piece for peer_stall_s; the longest wait of a chunk download for its first connection;
  // the most connections one node had on one chunk.
  uint64_t connections = 0, refused = 0, redundant_closed = 0, reannounces = 0;
  uint64_t no_peer_stalls = 0, peer_stalls = 0;
  double longest_no_peer_s = 0;
  int max_chunk_connections = 0;
  // Every announce sent (with SimConfig::log_announces), for the relay model.
  std::vector<SentAnnounce> announces;
  // The simulator's own cost.
  double wall_s = 0;
  uint64_t events = 0, piece_events = 0, recomputes = 0;
  size_t peak_flows = 0;
  double sim_end_s = 0;
};

// Runs one cold pull. Throws std::runtime_error on a tracker error (a bug, not a result).
SimResult RunSim(const SimConfig& config);

// Nearest-rank percentile (p in [0, 1]) as the bench programs compute it.
double Percentile(std::vector<double> v, double p);

}  // namespace shoal::sim
