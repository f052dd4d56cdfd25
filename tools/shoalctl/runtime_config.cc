// The runtime configuration each runtime expects for pulling through an agent (see the header).
#include "tools/shoalctl/runtime_config.h"

#include <algorithm>

#include "lib/oci/reference.h"

namespace shoal::ctl {

// "HOST:PORT" of the agent's shim; a leading http:// is accepted. Errors: kInvalidArgument.
Result<std::string> AgentHostPort(std::string agent) {
  if (agent.rfind("http://", 0) == 0) agent = agent.substr(7);
  while (!agent.empty() && agent.back() == '/') agent.pop_back();
  if (agent.rfind("https://", 0) == 0 || agent.find('/') != std::string::npos) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "--agent \"" + agent + "\" must be HOST:PORT (the shim speaks plain HTTP)");
  }
  if (agent.find(':') == std::string::npos) {
    return MakeError(ErrorCode::kInvalidArgument, "--agent \"" + agent + "\" needs a port");
  }
  if (auto st = oci::ValidateRegistryHost(agent); !st) {
    return MakeError(ErrorCode::kInvalidArgument, "--agent: " + st.error().message);
  }
  return agent;
}

// Normalised, validated registry hosts, without duplicates. Errors: kInvalidArgument.
Result<std::vector<std::string>> Registries(const std::vector<std::string>& given) {
  std::vector<std::string> out;
  for (const auto& r : given) {
    if (r.empty()) continue;
    if (auto st = oci::ValidateRegistryHost(r); !st) {
      return MakeError(ErrorCode::kInvalidArgument, "--registry: " + st.error().message);
    }
    std::string host = oci::NormalizeRegistryHost(r);
    if (std::find(out.begin(), out.end(), host) == out.end()) out.push_back(host);
  }
  if (out.empty()) return MakeError(ErrorCode::kInvalidArgument, "no --registry given");
  return out;
}

std::string RegistryServer(const std::string& registry) {
  return registry == "docker.io" ? "https://registry-1.docker.io" : "https://" + registry;
}

std::string ContainerdHostsToml(const std::string& agent, const std::string& registry,
                                bool managed) {
  // containerd appends /v2 and adds ?ns=<registry> to every request to this host.
  std::string server = RegistryServer(registry);
  std::string head = managed ? std::string(kManagedMarker) + "; removed on uninstall.\n" : "";
  return head + "# Pulls of " + registry + " go through the shoal agent first, then " + server +
         ".\nserver = \"" + server + "\"\n\n[host.\"http://" + agent +
         "\"]\n  capabilities = [\"pull\", \"resolve\"]\n";
}

std::string CrioDropIn(const std::string& agent, const std::vector<std::string>& registries,
                       bool managed) {
  std::string conf = managed ? std::string(kManagedMarker) + "; removed on uninstall.\n" : "";
  conf += "# Pulls go through the shoal agent first, then the registry itself.\n";
  for (const auto& r : registries) {
    // The mirror location carries the registry as a path prefix: gcr.io/proj/img becomes
    // GET /v2/gcr.io/proj/img/... on the agent.
    conf += "\n[[registry]]\nprefix = \"" + r + "\"\nlocation = \"" + r +
            "\"\n\n[[registry.mirror]]\nlocation = \"" + agent + "/" + r + "\"\ninsecure = true\n";
  }
  return conf;
}

std::string DockerdMirror(const std::string& agent) { return "http://" + agent; }

}  // namespace shoal::ctl
