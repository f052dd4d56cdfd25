#pragma once
// Runs a whole tracker process: swarm table, HTTP server, metrics, upkeep, signals.

#include "tracker/config.h"

namespace shoal::tracker {

// Serves until SIGTERM or SIGINT, then shuts down gracefully. Returns the process exit code
// (0 on a clean shutdown, 1 when startup failed; the reason is logged).
int RunTracker(const TrackerConfig& config);

}  // namespace shoal::tracker
