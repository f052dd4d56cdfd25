#pragma once
// shoalctl's subcommands; each registers its flags on the app and runs when chosen.

#include <CLI/CLI.hpp>

namespace shoal::ctl {

// `shoalctl pull IMAGE...`: pulls images through a node's agent so they are cached there.
void AddPullCommand(CLI::App& app);
// `shoalctl status`: a node agent's health and cache/upstream counters.
void AddStatusCommand(CLI::App& app);
// `shoalctl extract IMAGE DIR`: pulls an image through a node's agent and extracts its layers
// into DIR in overlay2's layout, extracting while downloading.
void AddExtractCommand(CLI::App& app);
// `shoalctl save IMAGE... -o file.tar`: writes images from a node's agent into a docker-archive
// that `docker load` reads.
void AddSaveCommand(CLI::App& app);
// `shoalctl cache ls|pin|unpin|gc`: a node agent's cache: contents, pins and eviction.
void AddCacheCommand(CLI::App& app);
// `shoalctl prefetch IMAGE... [--node|--cluster]`: warms one node's cache through its agent, or
// many nodes' through the tracker, with live progress and a result table.
void AddPrefetchCommand(CLI::App& app);
// `shoalctl config dockerd|containerd|crio`: runtime configuration for pulling through an agent.
void AddConfigCommand(CLI::App& app);
// `shoalctl node-setup [--cleanup]`: writes (or removes) the runtime configuration on a node.
void AddNodeSetupCommand(CLI::App& app);
// `shoalctl doctor`: checks one node's kubelet, runtimes, kernel, cache disk, agent and trackers.
void AddDoctorCommand(CLI::App& app);

}  // namespace shoal::ctl
