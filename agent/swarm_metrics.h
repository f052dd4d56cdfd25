#pragma once
// Prometheus counters mirrored from the libtorrent session's cumulative stats.

#include <cstdint>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "lib/swarm/session.h"

namespace shoal::agent {

class SwarmMetrics {
 public:
  explicit SwarmMetrics(prometheus::Registry& registry);
  // Adds what changed since the last call (stats are cumulative since the session started).
  void Update(const swarm::SwarmStats& stats);

 private:
  prometheus::Counter& downloaded_;
  prometheus::Counter& redundant_;
  prometheus::Counter& uploaded_;
  prometheus::Counter& hash_failures_;
  prometheus::Counter& banned_;
  prometheus::Counter& tls_refused_;
  prometheus::Counter& stall_reannounces_;  // shoal_swarm_stall_reannounces_total
  prometheus::Family<prometheus::Counter>& announces_;  // shoal_swarm_announces_total{result}
  prometheus::Counter& announces_ok_;
  prometheus::Counter& announces_error_;
  prometheus::Family<prometheus::Counter>& hashed_;  // shoal_swarm_piece_hashed_bytes_total{source}
  prometheus::Counter& hashed_memory_;
  prometheus::Counter& hashed_file_;
  prometheus::Gauge& torrents_;
  prometheus::Gauge& peers_;  // shoal_swarm_peers_connected
  std::vector<prometheus::Counter*> wasted_;  // by swarm::kWasteReasons
  swarm::SwarmStats last_;
};

}  // namespace shoal::agent
