#pragma once
// Runs a whole agent process: cache, upstream client, registry shim, metrics, signals.

#include "agent/config.h"

namespace shoal::agent {

// Serves until SIGTERM or SIGINT, then shuts down gracefully. Returns the process exit code
// (0 on a clean shutdown, 1 when startup failed; the reason is logged).
int RunAgent(const AgentConfig& config);

}  // namespace shoal::agent
