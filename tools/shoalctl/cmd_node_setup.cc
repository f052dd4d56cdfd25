// `shoalctl node-setup`: points a node's container runtimes at its agent (the agent
// DaemonSet's init container), and `--cleanup` takes it back (the chart's post-delete hook).
// Only the parts given a path are touched; every write is atomic and skipped when the file
// already holds the same bytes; files shoal did not write are never changed; no runtime is
// restarted (dockerd, opted in, gets SIGHUP, which reloads the mirror keys; containerd, opted in
// to the agent's snapshotter, gets marked lines in config.toml and must be restarted by the
// operator).
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/shoalctl/commands.h"
#include "tools/shoalctl/containerd_toml.h"
#include "tools/shoalctl/node_files.h"
#include "tools/shoalctl/runtime_config.h"

namespace shoal::ctl {
namespace {

struct SetupOptions {
  bool cleanup = false;
  std::string root = "/";
  std::string agent = "127.0.0.1:5000";
  std::vector<std::string> registries = {"docker.io"};
  std::string containerd_certs_dir;     // e.g. /etc/containerd/certs.d; empty: containerd untouched
  std::string containerd_config;        // config.toml: read; edited only for the snapshotter
  bool containerd_snapshotter = false;  // opt-in: config.toml names the agent's snapshotter
  std::string snapshotter_socket = "/run/shoal/snapshotter.sock";  // the agent's, on the node
  std::string crio_drop_in;    // e.g. /etc/containers/registries.conf.d/50-shoal.conf
  std::string dockerd_config;  // e.g. /etc/docker/daemon.json; empty: dockerd untouched
  std::string dockerd_pid_file = "/var/run/docker.pid";
  std::string proc = "/proc";       // this process's view of /proc (hostPID for dockerd)
  std::vector<long> arp_gc_thresh;  // gc_thresh1,2,3; empty: untouched
};

// Prints one line of what was done; the pod's log is the record of node setup.
void Say(const std::string& part, const std::string& what) {
  std::cout << "node-setup: " << part << ": " << what << std::endl;
}
void Warn(const std::string& part, const std::string& what) {
  std::cout << "node-setup: warning: " << part << ": " << what << std::endl;
}

const char* Verb(WriteOutcome o) {
  switch (o) {
    case WriteOutcome::kUnchanged:
      return "unchanged";
    case WriteOutcome::kCreated:
      return "created";
    case WriteOutcome::kReplaced:
      return "updated";
  }
  return "";
}

bool IsManaged(const std::string& content) { return content.rfind(kManagedMarker, 0) == 0; }

// Writes a shoal-managed file unless an unmanaged one is there. Returns false on an error.
bool WriteManaged(const std::string& part, const std::string& path, const std::string& content) {
  auto old = ReadIfExists(path);
  if (!old) {
    Warn(part, old.error().message);
    return false;
  }
  if (old.value() && !IsManaged(*old.value())) {
    Warn(part, path + " exists and was not written by shoal: left as it is (remove it, or add " +
                   "the agent to it yourself)");
    return true;
  }
  auto done = WriteAtomic(path, content);
  if (!done) {
    Warn(part, done.error().message);
    return false;
  }
  Say(part, path + " " + Verb(done.value()));
  return true;
}

// Removes a shoal-managed file (never the operator's) and its directory when empty.
bool RemoveManaged(const std::string& part, const std::string& path, bool remove_dir) {
  auto old = ReadIfExists(path);
  if (!old) {
    Warn(part, old.error().message);
    return false;
  }
  if (!old.value()) return true;
  if (!IsManaged(*old.value())) {
    Say(part, path + " was not written by shoal: kept");
    return true;
  }
  if (auto st = RemoveIfExists(path); !st) {
    Warn(part, st.error().message);
    return false;
  }
  Say(part, path + " removed");
  if (remove_dir) {
    std::error_code ec;
    std::filesystem::remove(std::filesystem::path(path).parent_path(), ec);  // only if empty
  }
  return true;
}

// Says whether containerd's config.toml (with its imports, merged as containerd 1.6 does) sets
// the CRI's config_path (without it containerd ignores certs.d).
void CheckContainerdConfigPath(const SetupOptions& o) {
  if (o.containerd_config.empty()) return;
  ContainerdConfig config = LoadContainerdConfig(o.root, o.containerd_config);
  for (const std::string& e : config.errors) {
    Warn("containerd", e + ": containerd does not start with it (config.toml left alone)");
  }
  if (!config.errors.empty()) return;
  if (config.files.empty()) {
    Warn("containerd", o.containerd_config + " not found: containerd's defaults do not set " +
                           "config_path, so it does not read " + o.containerd_certs_dir);
    return;
  }
  if (ConfigVersion(config) == 3) {
    Warn("containerd", o.containerd_config +
                           " is version 3 (containerd 2): node-setup does not check its "
                           "config_path (not supported yet); containerd 2 reads it under [" +
                           CriRegistryTable(3) + "]");
    return;
  }
  ContainerdSetting set =
      SectionSetting(config, "plugins", kCriPlugin, {"registry", "config_path"});
  const std::string* path =
      set.value && set.value->is_string() ? &set.value->as_string()->get() : nullptr;
  if (!path) {
    Warn("containerd",
         "config_path is not set in " + o.containerd_config +
             ": containerd ignores the hosts.toml files until it is (set config_path = \"" +
             o.containerd_certs_dir +
             "\" under [plugins.\"io.containerd.grpc.v1.cri\".registry] and restart containerd "
             "when convenient; node-setup does not set it and never restarts containerd)");
  } else if (*path != o.containerd_certs_dir) {
    Warn("containerd", "config_path is \"" + *path + "\", not " + o.containerd_certs_dir +
                           ": containerd does not read the hosts.toml files written here");
  } else {
    Say("containerd", "config_path = \"" + *path + "\" in " + set.file);
  }
}

bool Containerd(const SetupOptions& o, const std::string& agent,
                const std::vector<std::string>& registries) {
  bool ok = true;
  for (const auto& r : registries) {
    std::string path = UnderRoot(o.root, o.containerd_certs_dir + "/" + r + "/hosts.toml");
    ok = (o.cleanup ? RemoveManaged("containerd", path, true)
                    : WriteManaged("containerd", path, ContainerdHostsToml(agent, r, true))) &&
         ok;
  }
  if (!o.cleanup) CheckContainerdConfigPath(o);
  return ok;
}

// The opt-in: config.toml gets the agent's proxy snapshotter and the CRI uses it (marked lines,
// containerd_toml.h), or, with --cleanup, loses them again. The original is kept once as
// config.toml.shoal-backup. containerd reads config.toml only at start: it is never restarted
// here.
bool ContainerdSnapshotter(const SetupOptions& o) {
  const std::string part = "containerd-snapshotter";
  std::string path = UnderRoot(o.root, o.containerd_config);
  std::string backup_path = path + ".shoal-backup";
  auto text = ReadIfExists(path);
  if (!text) {
    Warn(part, text.error().message);
    return false;
  }
  if (!text.value()) {
    if (o.cleanup) return true;
    Warn(part, o.containerd_config + " does not exist: not created (containerd runs on its " +
                   "defaults there; write them with `containerd config default > " +
                   o.containerd_config + "` and run node-setup again)");
    return false;
  }
  const std::string& original = *text.value();
  if (o.cleanup) {
    bool changed = false;
    auto restored = DisableShoalSnapshotter(original, o.containerd_config, &changed);
    if (!restored) {
      Warn(part, restored.error().message + ": left as it is");
      return false;
    }
    if (!changed) {
      Say(part, o.containerd_config + ": nothing of shoal's to remove");
      (void)RemoveIfExists(backup_path);
      return true;
    }
    auto done = WriteAtomic(path, restored.value());
    if (!done) {
      Warn(part, done.error().message);
      return false;
    }
    (void)RemoveIfExists(backup_path);
    Say(part, path + " updated: shoal's proxy plugin and CRI snapshotter lines taken back, " +
                  "every other line kept");
    Say(part,
        "restart containerd (`systemctl restart containerd`, on a drained node) to go back "
        "to its own snapshotter: until then it keeps asking the agent's socket. Images whose "
        "layers the agent prepared have none in containerd's content store: remove them "
        "(`ctr -n k8s.io images rm`) so that the kubelet pulls them again");
    return true;
  }
  auto edit = EnableShoalSnapshotter(original, o.snapshotter_socket, o.containerd_config);
  if (!edit) {
    Warn(part, edit.error().message + ": left as it is");
    return false;
  }
  for (const auto& d : edit.value().done) Say(part, d);
  if (!edit.value().left.empty()) {
    for (const auto& l : edit.value().left) Warn(part, l);
    Warn(part, o.containerd_config + " left as it is (nothing changed)");
    return false;
  }
  if (edit.value().text == original) {
    Say(part, path + " unchanged");
    return true;
  }
  auto backup = ReadIfExists(backup_path);
  if (backup && !backup.value()) {
    auto b = WriteAtomic(backup_path, original, 0600);
    if (!b) {
      Warn(part, b.error().message);
      return false;
    }
    Say(part, "kept the original as " + backup_path);
  }
  auto done = WriteAtomic(path, edit.value().text);
  if (!done) {
    Warn(part, done.error().message);
    return false;
  }
  Say(part, path + " " + Verb(done.value()) + " (each line shoal added or changed is marked " +
                kTomlMarker + ")");
  Say(part,
      "containerd reads config.toml only when it starts: restart it (`systemctl restart "
      "containerd`, best on a drained node) to load the shoal snapshotter; node-setup does "
      "not. From then on the kubelet's pulls and container starts need the agent's "
      "snapshotter on " +
          o.snapshotter_socket);
  return true;
}

bool Crio(const SetupOptions& o, const std::string& agent,
          const std::vector<std::string>& registries) {
  std::string path = UnderRoot(o.root, o.crio_drop_in);
  if (o.cleanup) return RemoveManaged("crio", path, false);
  bool ok = WriteManaged("crio", path, CrioDropIn(agent, registries, true));
  if (ok)
    Say("crio",
        "CRI-O reads drop-ins at its next reload (`systemctl reload crio`); podman at once");
  return ok;
}

// Adds value to the array at key (first, for mirrors: tried in order) unless it is there.
void AddToArray(nlohmann::ordered_json& j, const std::string& key, const std::string& value,
                bool front) {
  if (!j.contains(key) || !j[key].is_array()) j[key] = nlohmann::ordered_json::array();
  for (const auto& v : j[key]) {
    if (v == value) return;
  }
  if (front) {
    j[key].insert(j[key].begin(), value);
  } else {
    j[key].push_back(value);
  }
}

// Removes value from the array at key, keeping the key even when the array ends up empty:
// dockerd 20.10's SIGHUP reload only applies keys present in the file (seen: with the key gone,
// `docker info` kept listing the removed mirror until a restart).
void RemoveFromArray(nlohmann::ordered_json& j, const std::string& key, const std::string& value) {
  if (!j.contains(key) || !j[key].is_array()) return;
  auto& a = j[key];
  a.erase(std::remove(a.begin(), a.end(), nlohmann::ordered_json(value)), a.end());
}

// SIGHUP to the dockerd named by its pid file (after checking that the pid is a dockerd).
bool ReloadDockerd(const SetupOptions& o) {
  auto pid_text = ReadIfExists(UnderRoot(o.root, o.dockerd_pid_file));
  if (!pid_text || !pid_text.value()) {
    Say("dockerd", "no " + o.dockerd_pid_file + ": dockerd is not running; it reads the new " +
                       "daemon.json when it starts");
    return true;
  }
  long pid = std::atol(pid_text.value()->c_str());
  auto comm = ReadIfExists(o.proc + "/" + std::to_string(pid) + "/comm");
  if (pid <= 1 || !comm || !comm.value() || comm.value()->rfind("dockerd", 0) != 0) {
    Warn("dockerd", "pid " + std::to_string(pid) + " from " + o.dockerd_pid_file +
                        " is not a running dockerd in this pid namespace (the pod needs " +
                        "hostPID): not reloaded; `kill -HUP $(pidof dockerd)` applies it");
    return true;
  }
  if (::kill(static_cast<pid_t>(pid), SIGHUP) != 0) {
    Warn("dockerd",
         "SIGHUP to dockerd (pid " + std::to_string(pid) + ") failed: " + std::strerror(errno));
    return false;
  }
  Say("dockerd", "sent SIGHUP to dockerd (pid " + std::to_string(pid) +
                     "): registry-mirrors, insecure-registries and max-concurrent-downloads "
                     "reload without a restart");
  return true;
}

// Merges the mirror keys into daemon.json (every other key kept; the original kept once as
// daemon.json.shoal-backup), or, with --cleanup, takes them out again.
bool Dockerd(const SetupOptions& o, const std::string& agent) {
  std::string path = UnderRoot(o.root, o.dockerd_config);
  std::string backup_path = path + ".shoal-backup";
  auto text = ReadIfExists(path);
  if (!text) {
    Warn("dockerd", text.error().message);
    return false;
  }
  std::string original = text.value() ? *text.value() : "";
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!original.empty()) {
    j = nlohmann::ordered_json::parse(original, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      Warn("dockerd", path + " is not a JSON object: left as it is");
      return false;
    }
  }
  auto backup_text = ReadIfExists(backup_path);
  if (!backup_text) {
    Warn("dockerd", backup_text.error().message);
    return false;
  }
  nlohmann::ordered_json merged = j;
  if (o.cleanup) {
    if (original.empty()) {
      Say("dockerd", path + " does not exist: nothing to remove");
      (void)RemoveIfExists(backup_path);
      return true;
    }
    if (!backup_text.value()) {
      Say("dockerd", path + ": nothing of shoal's to remove (no backup)");
      return true;
    }
    auto backup = nlohmann::ordered_json::parse(*backup_text.value(), nullptr, false);
    RemoveFromArray(merged, "registry-mirrors", DockerdMirror(agent));
    RemoveFromArray(merged, "insecure-registries", agent);
    // The original value, or dockerd's default (3) written out: a missing key would not be
    // reloaded.
    if (backup.is_object() && backup.contains("max-concurrent-downloads")) {
      merged["max-concurrent-downloads"] = backup["max-concurrent-downloads"];
    } else {
      merged["max-concurrent-downloads"] = 3;
    }
  } else {
    AddToArray(merged, "registry-mirrors", DockerdMirror(agent), true);
    AddToArray(merged, "insecure-registries", agent, false);
    if (!merged.contains("max-concurrent-downloads") ||
        !merged["max-concurrent-downloads"].is_number_integer() ||
        merged["max-concurrent-downloads"].get<long>() < 10) {
      merged["max-concurrent-downloads"] = 10;
    }
  }
  if (merged == j && !original.empty()) {
    Say("dockerd", path + " unchanged");
    if (o.cleanup) (void)RemoveIfExists(backup_path);
    return true;
  }
  if (!o.cleanup && !backup_text.value()) {
    // 0600: the original may hold settings the operator keeps private.
    auto b = WriteAtomic(backup_path, original.empty() ? "{}\n" : original, 0600);
    if (!b) {
      Warn("dockerd", b.error().message);
      return false;
    }
    Say("dockerd", "kept the original as " + backup_path);
  }
  auto done = WriteAtomic(path, merged.dump(2) + "\n");
  if (!done) {
    Warn("dockerd", done.error().message);
    return false;
  }
  Say("dockerd", path + " " + Verb(done.value()) +
                     (o.cleanup ? ": shoal's mirror removed, every other key kept"
                                : ": registry-mirrors " + DockerdMirror(agent) +
                                      ", max-concurrent-downloads, every other key kept"));
  if (o.cleanup) (void)RemoveIfExists(backup_path);
  return ReloadDockerd(o);
}

// Raises net.ipv4.neigh.default.gc_thresh1..3 to the given values (never lowers them).
bool Arp(const SetupOptions& o) {
  if (o.cleanup) {
    Say("arp", "thresholds are left as they are (raising them is harmless; a reboot resets them)");
    return true;
  }
  bool ok = true;
  for (size_t i = 0; i < 3; ++i) {
    std::string path = o.proc + "/sys/net/ipv4/neigh/default/gc_thresh" + std::to_string(i + 1);
    auto cur = ReadIfExists(path);
    if (!cur || !cur.value()) {
      Warn("arp", "cannot read " + path);
      ok = false;
      continue;
    }
    long now = std::atol(cur.value()->c_str());
    if (now >= o.arp_gc_thresh[i]) {
      Say("arp", "gc_thresh" + std::to_string(i + 1) + " = " + std::to_string(now) + " (kept)");
      continue;
    }
    // /proc/sys files take a plain write (no rename there).
    FILE* f = std::fopen(path.c_str(), "w");
    bool wrote = f && std::fprintf(f, "%ld\n", o.arp_gc_thresh[i]) > 0;
    if (f) wrote = std::fclose(f) == 0 && wrote;
    if (!wrote) {
      Warn("arp",
           "cannot write " + path + " (needs a privileged container): " + std::strerror(errno));
      ok = false;
      continue;
    }
    Say("arp", "gc_thresh" + std::to_string(i + 1) + " " + std::to_string(now) + " -> " +
                   std::to_string(o.arp_gc_thresh[i]));
  }
  return ok;
}

int Run(const SetupOptions& o) {
  auto agent = AgentHostPort(o.agent);
  auto registries = Registries(o.registries);
  if (!agent || !registries) {
    std::cerr << "shoalctl: " << (!agent ? agent.error().message : registries.error().message)
              << "\n";
    return 2;
  }
  if (!o.arp_gc_thresh.empty() && o.arp_gc_thresh.size() != 3) {
    std::cerr << "shoalctl: --arp-gc-thresh takes three values: gc_thresh1,gc_thresh2,gc_thresh3\n";
    return 2;
  }
  if (o.containerd_snapshotter) {
    if (o.containerd_config.empty()) {
      std::cerr << "shoalctl: --containerd-snapshotter needs --containerd-config (config.toml)\n";
      return 2;
    }
    if (auto st = ValidateSnapshotterSocket(o.snapshotter_socket); !st) {
      std::cerr << "shoalctl: " << st.error().message << "\n";
      return 2;
    }
  }
  bool any = !o.containerd_certs_dir.empty() || !o.crio_drop_in.empty() ||
             !o.dockerd_config.empty() || !o.arp_gc_thresh.empty() || o.containerd_snapshotter;
  if (!any) {
    Say("all", "nothing enabled: nothing written");
    return 0;
  }
  bool ok = true;
  if (!o.containerd_certs_dir.empty()) ok = Containerd(o, agent.value(), registries.value()) && ok;
  if (o.containerd_snapshotter) ok = ContainerdSnapshotter(o) && ok;
  if (!o.crio_drop_in.empty()) ok = Crio(o, agent.value(), registries.value()) && ok;
  if (!o.dockerd_config.empty()) ok = Dockerd(o, agent.value()) && ok;
  if (!o.arp_gc_thresh.empty()) ok = Arp(o) && ok;
  Say("all", ok ? "done" : "done with errors (above)");
  return ok ? 0 : 1;
}

}  // namespace

void AddNodeSetupCommand(CLI::App& app) {
  auto o = std::make_shared<SetupOptions>();
  CLI::App* cmd = app.add_subcommand(
      "node-setup",
      "Point this node's container runtimes at its agent (only the parts given a path; atomic, "
      "idempotent writes; never restarts a runtime), or take it back with --cleanup");
  cmd->add_flag("--cleanup", o->cleanup,
                "Remove what node-setup wrote (shoal's files and daemon.json keys), keep the rest")
      ->envname("SHOAL_NODE_SETUP_CLEANUP");
  cmd->add_option("--root", o->root, "The node's / as this process sees it (/host in the pod)")
      ->envname("SHOAL_HOST_ROOT")
      ->capture_default_str();
  cmd->add_option("--agent", o->agent, "The agent's shim address HOST:PORT that runtimes use")
      ->envname("SHOAL_AGENT_ADDR")
      ->capture_default_str();
  cmd->add_option("--registry", o->registries,
                  "Registries to send through the agent (repeatable or comma-separated)")
      ->envname("SHOAL_REGISTRIES")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--containerd-certs-dir", o->containerd_certs_dir,
                  "containerd: write <dir>/<registry>/hosts.toml (containerd's config_path, e.g. "
                  "/etc/containerd/certs.d)")
      ->envname("SHOAL_CONTAINERD_CERTS_DIR");
  cmd->add_option("--containerd-config", o->containerd_config,
                  "containerd's config.toml, read to say whether config_path is set (edited only "
                  "with --containerd-snapshotter)")
      ->envname("SHOAL_CONTAINERD_CONFIG");
  cmd->add_flag("--containerd-snapshotter", o->containerd_snapshotter,
                "containerd (opt-in, needs a containerd restart): add the agent's snapshotter to "
                "--containerd-config ([proxy_plugins.shoal] and the CRI's snapshotter = \"shoal\", "
                "disable_snapshot_annotations = false; marked lines, backup kept)")
      ->envname("SHOAL_CONTAINERD_SNAPSHOTTER");
  cmd->add_option("--snapshotter-socket", o->snapshotter_socket,
                  "The agent's --snapshotter-socket as the node sees it (for "
                  "--containerd-snapshotter)")
      ->envname("SHOAL_SNAPSHOTTER_SOCKET")
      ->capture_default_str();
  cmd->add_option("--crio-drop-in", o->crio_drop_in,
                  "CRI-O/podman: write this registries.conf.d drop-in, e.g. "
                  "/etc/containers/registries.conf.d/50-shoal.conf")
      ->envname("SHOAL_CRIO_DROP_IN");
  cmd->add_option("--dockerd-config", o->dockerd_config,
                  "dockerd (opt-in): merge registry-mirrors and max-concurrent-downloads into "
                  "this daemon.json (backup kept) and reload dockerd with SIGHUP")
      ->envname("SHOAL_DOCKERD_CONFIG");
  cmd->add_option("--dockerd-pid-file", o->dockerd_pid_file, "dockerd's pid file (under --root)")
      ->envname("SHOAL_DOCKERD_PID_FILE")
      ->capture_default_str();
  cmd->add_option("--proc", o->proc, "procfs to read pids and write sysctls through")
      ->envname("SHOAL_PROC")
      ->capture_default_str();
  cmd->add_option("--arp-gc-thresh", o->arp_gc_thresh,
                  "Raise net.ipv4.neigh.default.gc_thresh1,2,3 to these values (never lowers; "
                  "needs a privileged container), e.g. 80000,90000,100000")
      ->envname("SHOAL_ARP_GC_THRESH")
      ->delimiter(',');
  cmd->callback([o] { throw CLI::RuntimeError(Run(*o)); });
}

}  // namespace shoal::ctl
