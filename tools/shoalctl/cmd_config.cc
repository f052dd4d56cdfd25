// `shoalctl config dockerd|containerd|crio`: the runtime configuration that sends a node's pulls
// through its shoal agent, in the form each runtime expects (see docs/runtimes.md); `dockerd
// --proxy` for the agent's HTTPS proxy mode, `containerd --snapshotter` for the agent's
// containerd snapshotter.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/core/error.h"
#include "lib/oci/reference.h"
#include "tools/shoalctl/commands.h"
#include "tools/shoalctl/containerd_toml.h"
#include "tools/shoalctl/runtime_config.h"

namespace shoal::ctl {
namespace {

struct ConfigOptions {
  std::string agent = "127.0.0.1:5000";
  std::vector<std::string> registries = {"docker.io"};
  std::string output_dir;  // empty: print everything to stdout
  std::string data_root;   // dockerd only
  bool proxy = false;      // dockerd only: the agent's HTTPS proxy mode
  // containerd only: the agent's snapshotter settings for config.toml, and their config version.
  bool snapshotter = false;
  std::string snapshotter_socket = "/run/shoal/snapshotter.sock";
  int config_version = 2;
};

// A generated file: where it belongs on a node, and its content.
struct File {
  std::string node_path;  // e.g. /etc/docker/daemon.json
  std::string name;       // relative path under --output-dir
  std::string content;
  // Settings to merge into the file at node_path, not a file to install: always printed.
  bool merge = false;
};

// Writes the files under output_dir (creating directories) or prints them with their node path
// as a header, then prints the notes. Returns the exit code.
int Emit(const ConfigOptions& o, const std::vector<File>& files,
         const std::vector<std::string>& notes) {
  for (const auto& f : files) {
    if (o.output_dir.empty() || f.merge) {
      std::cout << "# ---- " << f.node_path << "\n" << f.content;
      if (!f.content.empty() && f.content.back() != '\n') std::cout << "\n";
      std::cout << "\n";
      continue;
    }
    std::filesystem::path p = std::filesystem::path(o.output_dir) / f.name;
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << f.content;
    out.close();
    if (ec || !out) {
      std::cerr << "shoalctl: cannot write " << p.string() << "\n";
      return 1;
    }
    std::cout << "# wrote " << p.string() << " (install as " << f.node_path << ")\n";
  }
  for (const auto& n : notes) std::cout << "# " << n << "\n";
  return 0;
}

int ConfigDockerd(const ConfigOptions& o, const std::string& agent,
                  const std::vector<std::string>& registries) {
  nlohmann::ordered_json daemon = {
      {"registry-mirrors", {DockerdMirror(agent)}},
      {"insecure-registries", {agent}},
      {"max-concurrent-downloads", 10},
      {"storage-driver", "overlay2"},
  };
  if (!o.data_root.empty()) daemon["data-root"] = o.data_root;
  std::vector<std::string> notes = {
      "Merge these keys into /etc/docker/daemon.json; `kill -HUP $(pidof dockerd)` reloads "
      "registry-mirrors and insecure-registries, the rest needs a restart.",
      o.data_root.empty() ? "data-root: put it on the node's local SSD (e.g. \"data-root\": "
                            "\"/mnt/disks/ssd0/docker\"); layer extraction is disk-bound."
                          : "data-root " + o.data_root + " should be on the node's local SSD.",
      "registry-mirrors only applies to Docker Hub (docker.io) images.",
  };
  std::vector<File> files = {{"/etc/docker/daemon.json", "daemon.json", daemon.dump(2) + "\n"}};
  if (o.proxy) {
    // dockerd 20.10 has no "proxies" key in daemon.json (added in 23.0): the proxy is set in
    // its environment. dockerd then dials only the agent, with CONNECT host:443.
    files.push_back({"/etc/systemd/system/docker.service.d/shoal-proxy.conf",
                     "docker.service.d/shoal-proxy.conf",
                     "# dockerd reaches HTTPS registries through the shoal agent's proxy mode.\n"
                     "[Service]\nEnvironment=\"HTTPS_PROXY=http://" +
                         agent + "\"\n"});
    notes.push_back(
        "Proxy mode: run the agent with --https-proxy (SHOAL_HTTPS_PROXY=true); it "
        "answers CONNECT on " +
        agent +
        ". Install the drop-in, then `systemctl "
        "daemon-reload && systemctl restart docker` (daemon.json \"proxies\" needs "
        "dockerd 23.0; 20.10 reads HTTPS_PROXY from its environment).");
  }
  for (const auto& r : registries) {
    if (r == "docker.io") continue;
    if (o.proxy) {
      notes.push_back("Trust the agent's node CA for " + r + ": mkdir -p /etc/docker/certs.d/" + r +
                      " && curl -fsS http://" + agent +
                      "/shoal/v1/proxy/ca.crt -o /etc/docker/certs.d/" + r +
                      "/ca.crt (the certificate only; the key never leaves the agent's cache "
                      "dir). Then pull " +
                      r + "/<repo>:<tag> by its own name.");
    } else {
      notes.push_back("dockerd has no mirror setting for " + r + ": pull it as " + agent + "/" + r +
                      "/<repo>:<tag> (the shim reads the registry from the name), or use "
                      "--proxy.");
    }
  }
  if (o.proxy) {
    notes.push_back(
        "docker.io keeps going through registry-mirrors (dockerd reads no certs.d for "
        "Docker Hub); the proxy tunnels its CONNECTs, like every registry the "
        "agent's upstream map does not name (--proxy-tunnel=deny refuses them).");
  }
  notes.push_back(std::string("kubelet flags: ") + kKubeletFlags);
  return Emit(o, files, notes);
}

int ConfigContainerd(const ConfigOptions& o, const std::string& agent,
                     const std::vector<std::string>& registries) {
  std::vector<File> files;
  for (const auto& r : registries) {
    files.push_back({"/etc/containerd/certs.d/" + r + "/hosts.toml", r + "/hosts.toml",
                     ContainerdHostsToml(agent, r)});
  }
  const std::string version = std::to_string(o.config_version);
  const std::string containerd = o.config_version == 3 ? "containerd 2" : "containerd 1.6";
  std::vector<std::string> notes = {
      "In /etc/containerd/config.toml (version " + version + ", " + containerd +
          "), then restart containerd:",
      "  [" + CriRegistryTable(o.config_version) + "]",
      "    config_path = \"/etc/containerd/certs.d\"",
      "ctr: `ctr images pull --hosts-dir /etc/containerd/certs.d <image>`.",
  };
  if (o.snapshotter) {
    // The same settings node-setup --containerd-snapshotter writes (containerd_toml.h).
    files.push_back({"/etc/containerd/config.toml (merge these settings into it; version " +
                         version + ", " + containerd + ")",
                     "", ShoalSnapshotterSnippet(o.snapshotter_socket, o.config_version), true});
    notes.push_back("The agent serves the snapshotter with --snapshotter-socket " +
                    o.snapshotter_socket +
                    " (helm value agent.snapshotter.enabled=true); containerd loads it only "
                    "when it starts: restart it on a drained node. From then on that node's "
                    "pulls and container starts need the agent.");
    if (o.config_version == 2) {
      notes.push_back(
          "`shoalctl node-setup --containerd-config /etc/containerd/config.toml "
          "--containerd-snapshotter --snapshotter-socket " +
          o.snapshotter_socket + "` makes the same edit in place (marked lines, backup kept).");
    } else {
      notes.push_back(
          "Version 3: containerd 2's names from its docs/cri/config.md; not tested with a "
          "containerd 2 here, and node-setup and doctor do not handle version 3 files yet. "
          "Check the result with `containerd config dump`.");
    }
  }
  notes.push_back(std::string("kubelet flags: ") + kKubeletFlags);
  return Emit(o, files, notes);
}

int ConfigCrio(const ConfigOptions& o, const std::string& agent,
               const std::vector<std::string>& registries) {
  std::string conf = CrioDropIn(agent, registries);
  std::vector<File> files = {
      {"/etc/containers/registries.conf.d/50-shoal.conf", "50-shoal.conf", conf}};
  std::vector<std::string> notes = {
      "CRI-O and podman read registries.conf.d drop-ins; restart CRI-O (or `systemctl reload "
      "crio`) to apply.",
      "insecure = true lets them use the agent's plain-HTTP shim (HTTPS is tried first).",
      std::string("kubelet flags: ") + kKubeletFlags,
  };
  return Emit(o, files, notes);
}

}  // namespace

void AddConfigCommand(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "config", "Print a container runtime's configuration for pulling through a node's agent");
  cmd->require_subcommand(1);
  struct Runtime {
    const char* name;
    const char* help;
    int (*run)(const ConfigOptions&, const std::string&, const std::vector<std::string>&);
  };
  const Runtime runtimes[] = {
      {"dockerd",
       "daemon.json: registry-mirrors, insecure-registries, downloads, overlay2; with --proxy "
       "the HTTPS proxy drop-in and certs.d",
       ConfigDockerd},
      {"containerd", "one hosts.toml per registry (certs.d layout)", ConfigContainerd},
      {"crio", "registries.conf mirror entries for CRI-O and podman", ConfigCrio},
  };
  for (const Runtime& rt : runtimes) {
    auto o = std::make_shared<ConfigOptions>();
    CLI::App* sub = cmd->add_subcommand(rt.name, rt.help);
    sub->add_option("--agent", o->agent, "The node agent's shim address HOST:PORT")
        ->envname("SHOAL_AGENT_ADDR")
        ->capture_default_str();
    sub->add_option("--registry", o->registries,
                    "Registry to send through the agent (repeatable or comma-separated)")
        ->envname("SHOAL_REGISTRIES")
        ->delimiter(',')
        ->capture_default_str();
    sub->add_option("-o,--output-dir", o->output_dir,
                    "Write the files under this directory instead of printing them")
        ->envname("SHOAL_CONFIG_OUTPUT_DIR");
    if (std::string(rt.name) == "containerd") {
      sub->add_flag("--snapshotter", o->snapshotter,
                    "Also print the config.toml settings for the agent's containerd snapshotter "
                    "([proxy_plugins.shoal] and the CRI's snapshotter = \"shoal\", "
                    "disable_snapshot_annotations = false), as node-setup "
                    "--containerd-snapshotter writes them")
          ->envname("SHOAL_CONTAINERD_SNAPSHOTTER");
      sub->add_option("--snapshotter-socket", o->snapshotter_socket,
                      "The agent's --snapshotter-socket as the node sees it (for --snapshotter)")
          ->envname("SHOAL_SNAPSHOTTER_SOCKET")
          ->capture_default_str();
      sub->add_option("--config-version", o->config_version,
                      "config.toml's version: 2 (containerd 1.6) or 3 (containerd 2, from its "
                      "docs; untested here)")
          ->envname("SHOAL_CONTAINERD_CONFIG_VERSION")
          ->check(CLI::IsMember({2, 3}))
          ->capture_default_str();
    }
    if (std::string(rt.name) == "dockerd") {
      sub->add_option("--data-root", o->data_root,
                      "dockerd data-root to set (a directory on the local SSD)")
          ->envname("SHOAL_DOCKER_DATA_ROOT");
      sub->add_flag("--proxy", o->proxy,
                    "Use the agent's HTTPS proxy mode (agent --https-proxy) so that images keep "
                    "their gcr.io/... names: adds a systemd drop-in with HTTPS_PROXY and the "
                    "certs.d steps")
          ->envname("SHOAL_DOCKER_PROXY");
    }
    auto run = rt.run;
    sub->callback([o, run] {
      auto agent = AgentHostPort(o->agent);
      auto registries = Registries(o->registries);
      if (!agent || !registries) {
        std::cerr << "shoalctl: " << (!agent ? agent.error().message : registries.error().message)
                  << "\n";
        throw CLI::RuntimeError(2);
      }
      if (o->snapshotter) {
        if (auto st = ValidateSnapshotterSocket(o->snapshotter_socket); !st) {
          std::cerr << "shoalctl: " << st.error().message << "\n";
          throw CLI::RuntimeError(2);
        }
      }
      throw CLI::RuntimeError(run(*o, agent.value(), registries.value()));
    });
  }
}

}  // namespace shoal::ctl
