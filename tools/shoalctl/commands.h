#pragma once
// shoalctl's subcommands; each registers its flags on the app and runs when chosen.

#include <CLI/CLI.hpp>

namespace shoal::ctl {

// `shoalctl pull IMAGE...`: pulls images through a node's agent so they are cached there.
void AddPullCommand(CLI::App& app);
// `shoalctl status`: a node agent's health and cache/upstream counters.
void AddStatusCommand(CLI::App& app);

}  // namespace shoal::ctl
