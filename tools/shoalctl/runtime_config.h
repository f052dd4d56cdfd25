#pragma once
// The runtime configuration that sends a node's pulls through its agent, as each runtime expects
// it (docs/runtimes.md): shared by `shoalctl config` (prints it), `node-setup` (writes it onto a
// node) and `doctor` (checks it is there).

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/core/error.h"

namespace shoal::ctl {

// First line of every file node-setup writes: files without it are the operator's, never touched.
inline constexpr char kManagedMarker[] = "# Written by shoal (shoalctl node-setup)";

// kubelet flags printed with every runtime's configuration.
inline constexpr char kKubeletFlags[] =
    "--serialize-image-pulls=false --image-pull-progress-deadline=30m";

// "HOST:PORT" of the agent's shim; a leading http:// is accepted. Errors: kInvalidArgument.
Result<std::string> AgentHostPort(std::string agent);
// Normalised, validated registry hosts, without duplicates. Errors: kInvalidArgument.
Result<std::vector<std::string>> Registries(const std::vector<std::string>& given);

// The registry's own endpoint (docker.io: https://registry-1.docker.io).
std::string RegistryServer(const std::string& registry);
// containerd's certs.d/<registry>/hosts.toml: the agent first, then the registry. With
// `managed`, it starts with kManagedMarker.
std::string ContainerdHostsToml(const std::string& agent, const std::string& registry,
                                bool managed = false);
// A registries.conf.d drop-in (CRI-O, podman) with one mirror entry per registry.
std::string CrioDropIn(const std::string& agent, const std::vector<std::string>& registries,
                       bool managed = false);
// The mirror URL dockerd's registry-mirrors gets: http://AGENT.
std::string DockerdMirror(const std::string& agent);

}  // namespace shoal::ctl
