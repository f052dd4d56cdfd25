// `shoalctl doctor`: checks one node against what the 2,500-node cluster taught
// (../shared/reference/seed-lessons.md) and prints each finding as ok / warn / fail with the
// fix. Files are read under --root (/host in the agent's pod, a fixture tree in tests); the
// agent and the trackers are asked over HTTP. Exit code: 0 all ok, 1 warnings, 2 failures.
#include <utility>  // before Asio (GCC 12 + Boost 1.74)

#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/http/client.h"
#include "lib/http/udp_probe.h"
#include "lib/http/url.h"
#include "lib/store/blob_store.h"
#include "snapshotter/client.h"
#include "tools/shoalctl/commands.h"
#include "tools/shoalctl/containerd_toml.h"
#include "tools/shoalctl/node_files.h"
#include "tools/shoalctl/runtime_config.h"

namespace shoal::ctl {
namespace {
namespace fs = std::filesystem;

struct DoctorOptions {
  std::string root = "/";
  std::string agent = "127.0.0.1:5000";
  std::vector<std::string> trackers;
  std::vector<std::string> registries = {"docker.io"};
  std::string cache_dir;  // as this process sees it (not under --root)
  std::string cache_budget = "0";
  long cluster_nodes = 0;
  std::string kubelet_config = "/var/lib/kubelet/config.yaml";
  std::string dockerd_config = "/etc/docker/daemon.json";
  std::string containerd_config = "/etc/containerd/config.toml";
  std::string containerd_certs_dir;  // default: config_path from config.toml
  std::string crio_dir = "/etc/containers/registries.conf.d";
  std::string snapshotter_socket;  // the agent's --snapshotter-socket on the node; "": from config
  bool json = false;
};

enum class Level { kOk, kWarn, kFail };

struct Finding {
  std::string check;
  Level level;
  std::string message;
  std::string fix;
};

const char* LevelName(Level l) {
  return l == Level::kOk ? "ok" : l == Level::kWarn ? "warn" : "fail";
}

class Report {
 public:
  void Ok(const std::string& check, const std::string& msg) { Add(check, Level::kOk, msg, ""); }
  void Warn(const std::string& check, const std::string& msg, const std::string& fix) {
    Add(check, Level::kWarn, msg, fix);
  }
  void Fail(const std::string& check, const std::string& msg, const std::string& fix) {
    Add(check, Level::kFail, msg, fix);
  }
  const std::vector<Finding>& findings() const { return findings_; }

 private:
  void Add(const std::string& check, Level l, const std::string& msg, const std::string& fix) {
    findings_.push_back({check, l, msg, fix});
  }
  std::vector<Finding> findings_;
};

// A file system's magic number -> its name and whether it is on the network.
struct FsKind {
  std::string name;
  bool network = false;
  bool memory = false;
  bool overlay = false;
};

FsKind KindOf(unsigned long magic) {
  switch (magic) {
    case 0xEF53:
      return {"ext4"};
    case 0x58465342:
      return {"xfs"};
    case 0x9123683E:
      return {"btrfs"};
    case 0x2FC12FC1:
      return {"zfs"};
    case 0x01021994:
      return {"tmpfs", false, true};
    case 0x858458F6:
      return {"ramfs", false, true};
    case 0x794C7630:
      return {"overlay", false, false, true};
    case 0x6969:
      return {"nfs", true};
    case 0xFF534D42:
      return {"cifs", true};
    case 0xFE534D42:
      return {"smb2", true};
    case 0x517B:
      return {"smb", true};
    case 0x65735546:
      return {"fuse", true};
    case 0x01021997:
      return {"9p", true};
    case 0x00C36400:
      return {"ceph", true};
    case 0x0BD00BD0:
      return {"lustre", true};
    case 0x47504653:
      return {"gpfs", true};
    default: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "0x%lx", magic);
      return {buf};
    }
  }
}

// The nearest existing ancestor of path (statfs needs one).
std::string Existing(std::string path) {
  std::error_code ec;
  while (!path.empty() && path != "/" && !fs::exists(path, ec)) path = fs::path(path).parent_path();
  return path.empty() ? "/" : path;
}

std::string Gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

// GET url; the HTTP status, or 0 when nothing answered within 3 s.
unsigned HttpStatus(const std::string& url_text) {
  auto url = http::Url::Parse(url_text);
  if (!url) return 0;
  boost::asio::io_context ioc;
  http::ClientConfig config;
  config.connect_timeout = std::chrono::seconds(3);
  config.idle_timeout = std::chrono::seconds(3);
  http::Client client(ioc.get_executor(), config);
  http::Request req;
  req.url = url.value();
  unsigned status = 0;
  boost::asio::co_spawn(
      ioc,
      [&]() -> boost::asio::awaitable<void> {
        auto res = co_await client.Open(req);
        if (res) status = res.value()->status();
      },
      boost::asio::detached);
  ioc.run();
  return status;
}

// Non-comment lines of a file (# comments), for flag and key searches.
std::string Uncommented(const std::string& text) {
  std::string out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    size_t first = line.find_first_not_of(" \t");
    if (first != std::string::npos && line[first] != '#') out += line + "\n";
    pos = end + 1;
  }
  return out;
}

// --- kubelet ---

// The running kubelet's command line (NUL-separated args joined by spaces), from <root>/proc.
std::string KubeletCmdline(const std::string& root) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(UnderRoot(root, "/proc"), ec)) {
    std::string name = e.path().filename();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    auto comm = ReadIfExists(e.path() / "comm");
    if (!comm || !comm.value() || comm.value()->rfind("kubelet", 0) != 0) continue;
    auto cmd = ReadIfExists(e.path() / "cmdline");
    if (!cmd || !cmd.value()) continue;
    std::string s = *cmd.value();
    std::replace(s.begin(), s.end(), '\0', ' ');
    return s;
  }
  return "";
}

void CheckKubelet(const DoctorOptions& o, Report& r) {
  // Flags win over the config file; they may be on the running kubelet or in its unit files.
  std::string flags = KubeletCmdline(o.root);
  std::string flag_source = flags.empty() ? "" : "the running kubelet's flags";
  for (const char* f : {"/etc/default/kubelet", "/etc/sysconfig/kubelet"}) {
    auto t = ReadIfExists(UnderRoot(o.root, f));
    if (t && t.value()) {
      flags += " " + Uncommented(*t.value());
      if (flag_source.empty()) flag_source = f;
    }
  }
  std::error_code ec;
  for (const auto& e :
       fs::directory_iterator(UnderRoot(o.root, "/etc/systemd/system/kubelet.service.d"), ec)) {
    auto t = ReadIfExists(e.path());
    if (t && t.value()) flags += " " + Uncommented(*t.value());
  }
  std::string config_path = o.kubelet_config;
  std::smatch m;
  static const std::regex kConfigFlag(R"(--config[= ](\S+))");
  if (std::regex_search(flags, m, kConfigFlag)) config_path = m[1];
  auto config = ReadIfExists(UnderRoot(o.root, config_path));
  std::string yaml = config && config.value() ? Uncommented(*config.value()) : "";
  const std::string fix =
      "kubelet --serialize-image-pulls=false, or serializeImagePulls: false in " + config_path;
  if (flags.empty() && yaml.empty()) {
    r.Warn("kubelet", "no kubelet found (no process, flags file or " + config_path + ")",
           "run doctor with --root at the node's / (the pod mounts it at /host); " + fix);
    return;
  }
  static const std::regex kSerializeFlag(R"(--serialize-image-pulls(=(\w+))?)");
  static const std::regex kSerializeKey(R"((^|\n)serializeImagePulls:\s*(\w+))");
  std::string value, where;
  if (std::regex_search(flags, m, kSerializeFlag)) {
    value = m[2].matched ? m[2].str() : "true";
    where = "flag";
  } else if (std::regex_search(yaml, m, kSerializeKey)) {
    value = m[2];
    where = config_path;
  }
  if (value == "false") {
    r.Ok("kubelet", "image pulls run in parallel (serialize-image-pulls=false, " + where + ")");
  } else {
    r.Fail("kubelet",
           "image pulls are serialized (" + (value.empty() ? "the default" : where) +
               "): one big image blocks every other pull on the node",
           fix);
  }
  static const std::regex kParallelKey(R"((^|\n)maxParallelImagePulls:\s*(\d+))");
  if (std::regex_search(yaml, m, kParallelKey)) {
    int n = std::stoi(m[2]);
    if (n < 3) {
      r.Warn("kubelet", "maxParallelImagePulls is " + m[2].str(),
             "raise maxParallelImagePulls (or leave it unset: no limit)");
    } else {
      r.Ok("kubelet", "maxParallelImagePulls is " + m[2].str());
    }
  }
  // --image-pull-progress-deadline is a dockershim flag (kubelet 1.23 and older, runtime
  // docker); CRI runtimes have no such kubelet deadline.
  static const std::regex kDeadline(R"(--image-pull-progress-deadline[= ](\S+))");
  static const std::regex kDockershim(R"(--container-runtime[= ]docker\b)");
  if (std::regex_search(flags, kDockershim)) {
    if (std::regex_search(flags, m, kDeadline)) {
      r.Ok("kubelet", "image pull progress deadline " + m[1].str() + " (dockershim)");
    } else {
      r.Warn("kubelet",
             "dockershim with the default 1 m image pull progress deadline: large layers fail "
             "with \"net/http: request canceled\"",
             "kubelet --image-pull-progress-deadline=30m");
    }
  }
}

// --- dockerd ---

void CheckDataRoot(const std::string& check, const std::string& path_on_node,
                   const DoctorOptions& o, Report& r) {
  std::string p = Existing(UnderRoot(o.root, path_on_node));
  struct statfs sfs {};
  if (::statfs(p.c_str(), &sfs) != 0) {
    r.Warn(check, "cannot read the file system of " + path_on_node, "");
    return;
  }
  FsKind k = KindOf(static_cast<unsigned long>(sfs.f_type));
  if (k.network) {
    r.Fail(check, "data-root " + path_on_node + " is on " + k.name + ", a network file system",
           "put data-root on the node's local SSD (e.g. \"data-root\": \"/mnt/docker\")");
  } else if (k.memory) {
    r.Warn(check, "data-root " + path_on_node + " is on " + k.name + " (memory)",
           "put data-root on the node's local SSD");
  } else {
    r.Ok(check, "data-root " + path_on_node + " is on " + k.name +
                    " (local; make sure it is the instance SSD, not a network-attached disk)");
  }
}

void CheckDockerd(const DoctorOptions& o, const std::string& agent, Report& r) {
  auto text = ReadIfExists(UnderRoot(o.root, o.dockerd_config));
  if (!text || !text.value()) {
    std::error_code ec;
    if (!fs::exists(UnderRoot(o.root, "/var/run/docker.pid"), ec) &&
        !fs::exists(UnderRoot(o.root, "/var/run/docker.sock"), ec)) {
      r.Ok("dockerd", "not running on this node (no daemon.json, pid file or socket): skipped");
      return;
    }
  }
  nlohmann::json j = nlohmann::json::object();
  if (text && text.value()) {
    j = nlohmann::json::parse(*text.value(), nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      r.Fail("dockerd", o.dockerd_config + " is not a JSON object: dockerd will not start",
             "fix the JSON syntax");
      return;
    }
  }
  bool mirrored = false;
  if (j.contains("registry-mirrors") && j["registry-mirrors"].is_array()) {
    for (const auto& m : j["registry-mirrors"]) {
      if (m.is_string() && (m == DockerdMirror(agent) || m == DockerdMirror(agent) + "/"))
        mirrored = true;
    }
  }
  if (mirrored) {
    r.Ok("dockerd", "registry-mirrors has " + DockerdMirror(agent));
  } else {
    r.Warn("dockerd", "registry-mirrors does not name this agent (" + DockerdMirror(agent) + ")",
           "helm value nodeSetup.dockerd.enabled=true (merges it and sends SIGHUP), or "
           "`shoalctl config dockerd`");
  }
  int downloads =
      j.contains("max-concurrent-downloads") && j["max-concurrent-downloads"].is_number_integer()
          ? j["max-concurrent-downloads"].get<int>()
          : 3;
  if (downloads >= 10) {
    r.Ok("dockerd", "max-concurrent-downloads is " + std::to_string(downloads));
  } else {
    r.Warn("dockerd",
           "max-concurrent-downloads is " + std::to_string(downloads) +
               (j.contains("max-concurrent-downloads") ? "" : " (the default)"),
           "\"max-concurrent-downloads\": 10 in daemon.json (reloaded by SIGHUP)");
  }
  std::string driver = j.contains("storage-driver") && j["storage-driver"].is_string()
                           ? j["storage-driver"].get<std::string>()
                           : "";
  if (driver.empty()) {
    r.Ok("dockerd", "storage-driver unset: dockerd picks overlay2 where the kernel supports it");
  } else if (driver == "overlay2") {
    r.Ok("dockerd", "storage-driver is overlay2");
  } else if (driver == "vfs" || driver == "devicemapper" || driver == "aufs") {
    r.Fail("dockerd", "storage-driver is " + driver + ": slow layer extraction and disk use",
           "\"storage-driver\": \"overlay2\" (needs a dockerd restart and re-pulled images)");
  } else {
    r.Warn("dockerd", "storage-driver is " + driver, "\"storage-driver\": \"overlay2\"");
  }
  std::string data_root = j.contains("data-root") && j["data-root"].is_string()
                              ? j["data-root"].get<std::string>()
                              : "/var/lib/docker";
  CheckDataRoot("dockerd", data_root, o, r);
}

// --- containerd ---

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// "path:line:column" of a node parsed from the file at path.
std::string Where(const std::string& path, const toml::node& n) {
  return path + ":" + std::to_string(n.source().begin.line) + ":" +
         std::to_string(n.source().begin.column);
}

// certs.d/<registry>/hosts.toml, read with toml++ as containerd's loader reads it
// (remotes/docker/config/hosts.go in 1.6: go-toml, then server, the [host."URL"] tables and their
// capabilities). A file that loader cannot decode is logged ("failed to decode hosts.toml") and
// skipped: the registry is then pulled from directly, without the agent.
void CheckHostsToml(const DoctorOptions& o, const std::string& agent, const std::string& certs,
                    const std::string& reg, Report& r) {
  const std::string path = certs + "/" + reg + "/hosts.toml";
  const std::string agent_url = "http://" + agent;
  const std::string rewrite = "`shoalctl config containerd --agent " + agent + " --registry " +
                              reg + " -o " + certs + "` writes it again";
  const std::string want =
      "[host.\"" + agent_url + "\"] with capabilities = [\"pull\", \"resolve\"]";
  auto text = ReadIfExists(UnderRoot(o.root, path));
  if (!text) {
    r.Fail("containerd", text.error().message, "check the file's permissions");
    return;
  }
  if (!text.value()) {
    r.Warn("containerd", "no " + path + ": " + reg + " is pulled without the agent",
           "helm value nodeSetup.containerd.enabled=true, or `shoalctl config containerd -o " +
               certs + "`");
    return;
  }
  const std::string skipped = ": containerd cannot decode it and pulls " + reg +
                              " straight from the registry, without the agent (its log says "
                              "\"failed to decode hosts.toml\")";
  auto parsed = ParseToml(*text.value(), path);
  if (!parsed) {
    r.Fail("containerd", parsed.error().message + skipped, "correct it there, or " + rewrite);
    return;
  }
  const toml::table& t = parsed.value();
  // What containerd's decoder refuses besides TOML syntax: the wrong types, unknown capabilities.
  std::string refused;
  const toml::node* server = t.get("server");
  if (server && !server->is_string()) refused = Where(path, *server) + ": server is not a string";
  const toml::node* hosts = t.get("host");
  if (refused.empty() && hosts && !hosts->is_table()) {
    refused = Where(path, *hosts) + ": host is not a table of [host.\"URL\"] tables";
  }
  const toml::table* agent_host = nullptr;
  const toml::node* agent_caps = nullptr;
  if (refused.empty() && hosts) {
    for (auto&& [url, entry] : *hosts->as_table()) {
      if (!refused.empty()) break;
      const std::string name(url.str());
      if (!entry.is_table()) {
        refused = Where(path, entry) + ": host.\"" + name + "\" is not a table";
        break;
      }
      const toml::node* caps = entry.as_table()->get("capabilities");
      if (caps && !caps->is_array()) {
        refused = Where(path, *caps) + ": capabilities of \"" + name + "\" is not an array";
      } else if (caps) {
        for (const toml::node& c : *caps->as_array()) {
          const std::string v = c.is_string() ? Lower(c.as_string()->get()) : "";
          if (v != "pull" && v != "resolve" && v != "push") {
            refused = Where(path, c) + ": capability " + TomlText(&c) + " of \"" + name +
                      "\" is not \"pull\", \"resolve\" or \"push\"";
            break;
          }
        }
      }
      if (name == agent_url) {
        agent_host = entry.as_table();
        agent_caps = caps;
      }
    }
  }
  if (!refused.empty()) {
    r.Fail("containerd", refused + skipped, "correct it there, or " + rewrite);
    return;
  }
  if (!agent_host) {
    r.Warn("containerd", path + " does not point at this agent (" + agent + ")",
           "add " + want + ", or " + rewrite);
    return;
  }
  // No capabilities: containerd gives the host all three.
  bool pull = !agent_caps, resolve = !agent_caps;
  if (agent_caps) {
    for (const toml::node& c : *agent_caps->as_array()) {
      const std::string v = Lower(c.as_string()->get());
      pull = pull || v == "pull";
      resolve = resolve || v == "resolve";
    }
  }
  if (!pull || !resolve) {
    r.Warn("containerd",
           Where(path, *agent_caps) + ": [host.\"" + agent_url +
               "\"] has capabilities = " + TomlText(agent_caps) + ": " +
               (!pull ? "containerd fetches no blob through the agent"
                      : "containerd resolves tags at the registry, not through the agent"),
           "capabilities = [\"pull\", \"resolve\"] there, or " + rewrite);
    return;
  }
  const std::string fallback =
      server ? server->as_string()->get()
             : (reg == "docker.io" ? "https://registry-1.docker.io" : "https://" + reg);
  if (fallback == agent_url || fallback == agent) {
    r.Warn("containerd",
           Where(path, *server) + ": server is the agent itself: while the agent is down, " +
               "containerd has no registry to fall back to",
           "server = \"" + RegistryServer(reg) + "\" there, or " + rewrite);
    return;
  }
  r.Ok("containerd", path + " points at " + agent + ", then " + fallback);
}

void CheckContainerd(const DoctorOptions& o, const std::string& agent,
                     const std::vector<std::string>& registries, Report& r) {
  ContainerdConfig config = LoadContainerdConfig(o.root, o.containerd_config);
  std::string certs = o.containerd_certs_dir;
  if (!config.errors.empty()) {
    for (const std::string& e : config.errors) {
      r.Fail("containerd", e + ": containerd does not start with it",
             "correct it there (`containerd --config " + o.containerd_config +
                 " config dump` reads it as containerd does), then restart containerd");
    }
  } else if (config.files.empty()) {
    std::error_code ec;
    bool running = fs::exists(UnderRoot(o.root, "/run/containerd/containerd.sock"), ec);
    if (!running && certs.empty()) {
      r.Ok("containerd", "not running on this node (no config.toml or socket): skipped");
      return;
    }
    r.Warn("containerd",
           "no " + o.containerd_config +
               ": containerd's defaults leave config_path unset, so it reads no hosts.toml",
           "config_path = \"/etc/containerd/certs.d\" under "
           "[plugins.\"io.containerd.grpc.v1.cri\".registry], then restart containerd");
  } else if (ConfigVersion(config) == 3) {
    r.Warn("containerd",
           o.containerd_config +
               " is version 3 (containerd 2): doctor reads containerd 1.6's version 2 settings "
               "only (containerd 2 is not supported yet), so config_path is not checked",
           "check that `containerd config dump` shows config_path = \"/etc/containerd/certs.d\" "
           "under [" +
               CriRegistryTable(3) +
               "], and give --containerd-certs-dir to check the hosts.toml files");
  } else {
    ContainerdSetting set =
        SectionSetting(config, "plugins", kCriPlugin, {"registry", "config_path"});
    if (set.value && set.value->is_string()) {
      const std::string& path = set.value->as_string()->get();
      r.Ok("containerd", "config_path = \"" + path + "\"");
      if (certs.empty()) certs = path;
    } else {
      r.Fail("containerd",
             "config_path is not set in " + o.containerd_config +
                 ": containerd (and the kubelet's CRI) ignores every hosts.toml",
             "config_path = \"/etc/containerd/certs.d\" under "
             "[plugins.\"io.containerd.grpc.v1.cri\".registry], then restart containerd when "
             "convenient (node setup does not set config_path)");
    }
  }
  if (certs.empty()) return;
  for (const auto& reg : registries) CheckHostsToml(o, agent, certs, reg, r);
}

// --- containerd's snapshotter (the agent's, opted in) ---

// The output of a command line run through sh with a 10 s limit; nullopt if it could not run.
std::optional<std::string> Capture(const std::string& command, int* status) {
  FILE* p = ::popen(("timeout 10 " + command + " 2>&1").c_str(), "r");
  if (!p) return std::nullopt;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *status = ::pclose(p);
  return out;
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// `ctr` on this machine: PATH, then the node's own binaries under --root.
std::string FindCtr(const std::string& root) {
  std::error_code ec;
  if (const char* path = std::getenv("PATH")) {
    std::string dirs = path;
    size_t pos = 0;
    while (pos <= dirs.size()) {
      size_t end = dirs.find(':', pos);
      std::string d = dirs.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
      if (!d.empty() && ::access((d + "/ctr").c_str(), X_OK) == 0) return d + "/ctr";
      if (end == std::string::npos) break;
      pos = end + 1;
    }
  }
  for (const char* c : {"/usr/bin/ctr", "/usr/local/bin/ctr"}) {
    std::string p = UnderRoot(root, c);
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// A string setting's value; nullopt when it is not set or not a string.
std::optional<std::string> StringOf(const ContainerdSetting& s) {
  if (!s.value || !s.value->is_string()) return std::nullopt;
  return s.value->as_string()->get();
}

void CheckSnapshotter(const DoctorOptions& o, Report& r) {
  const std::string check = "snapshotter";
  const std::string cri = kCriContainerdTable;
  const ContainerdConfig config = LoadContainerdConfig(o.root, o.containerd_config);
  ContainerdSetting type = SectionSetting(config, "proxy_plugins", "shoal", {"type"});
  ContainerdSetting address = SectionSetting(config, "proxy_plugins", "shoal", {"address"});
  ContainerdSetting snap =
      SectionSetting(config, "plugins", kCriPlugin, {"containerd", "snapshotter"});
  ContainerdSetting annotations =
      SectionSetting(config, "plugins", kCriPlugin, {"containerd", "disable_snapshot_annotations"});
  std::optional<std::string> cri_snapshotter = StringOf(snap);
  if (o.snapshotter_socket.empty() && config.errors.empty() && !address.section_found &&
      cri_snapshotter != "shoal") {
    r.Ok(check,
         "the agent's containerd snapshotter is not enabled (no --snapshotter-socket, and "
         "containerd's config names no shoal snapshotter): skipped");
    return;
  }
  std::optional<std::string> named = StringOf(address);
  const std::string socket =
      !o.snapshotter_socket.empty() ? o.snapshotter_socket : named.value_or("");
  const std::string restart =
      ", then restart containerd (`systemctl restart containerd`, best "
      "on a drained node)";
  const std::string socket_arg = socket.empty() ? "SOCKET" : socket;
  const std::string setup =
      ConfigVersion(config) == 3
          ? "the settings `shoalctl config containerd --snapshotter --config-version 3 "
            "--snapshotter-socket " +
                socket_arg + "` prints, by hand (containerd 2: node-setup does not edit it)" +
                restart
          : "`shoalctl node-setup --containerd-config " + o.containerd_config +
                " --containerd-snapshotter --snapshotter-socket " + socket_arg +
                "` (in the node image, or on the node)" + restart;

  // What containerd's configuration says.
  if (!config.errors.empty()) {
    // Which settings containerd would run with is unknown: it does not start.
    for (const std::string& e : config.errors) {
      r.Fail(check, e + ": containerd does not start with it, so neither does its snapshotter",
             "correct it there (`containerd --config " + o.containerd_config +
                 " config dump` reads it as containerd does)" + restart);
    }
    if (socket.empty()) return;
  } else if (config.files.empty()) {
    r.Fail(check, "no " + o.containerd_config + ": containerd knows no shoal snapshotter", setup);
  } else {
    const toml::node* version = config.files.front().table.get("version");
    const bool v2 = version && version->is_integer() && version->as_integer()->get() == 2;
    if (ConfigVersion(config) == 3) {
      r.Fail(check, o.containerd_config + ": " + ContainerdV3Unsupported(socket),
             "`containerd config dump` shows what containerd 2 reads; docs/runtimes.md "
             "(containerd 2) has the settings");
    } else if (!v2) {
      r.Fail(check,
             o.containerd_config + " is " +
                 (version ? "version " + TomlText(version)
                          : std::string("version 1 (no version = 2)")) +
                 ": doctor checks containerd 1.6's version 2 settings only",
             "version = 2 with the settings of docs/runtimes.md (containerd snapshotter)");
    }
    std::optional<std::string> kind = StringOf(type);
    if (!address.section_found) {
      r.Fail(check,
             "containerd's config has no [proxy_plugins.shoal]: containerd cannot reach the "
             "agent's snapshotter",
             setup);
    } else if (kind != "snapshot") {
      r.Fail(check,
             "[proxy_plugins.shoal] in " + address.file + " has type = " +
                 (type.value ? TomlText(type.value) : std::string("(none)")) + ", not \"snapshot\"",
             "type = \"snapshot\" in [proxy_plugins.shoal]" + restart);
    } else if (named != socket) {
      r.Fail(check,
             "[proxy_plugins.shoal] in " + address.file + " has address = " +
                 (address.value ? TomlText(address.value) : std::string("(none)")) +
                 ", but the agent serves " + socket,
             "address = \"" + socket + "\" in [proxy_plugins.shoal]" + restart);
    } else {
      r.Ok(check, "[proxy_plugins.shoal] type = \"snapshot\", address = \"" + socket + "\" (" +
                      address.file + ")");
    }
    // The CRI's settings are where containerd 1.6 reads them; other versions failed above.
    if (v2) {
      const std::string where = snap.section_found ? snap.file : o.containerd_config;
      if (cri_snapshotter != "shoal") {
        r.Fail(
            check,
            "the CRI's snapshotter is " +
                (snap.value ? TomlText(snap.value) : std::string("\"overlayfs\" (the default)")) +
                " in " + where +
                ", not \"shoal\": the kubelet's pulls do not use the agent's snapshotter",
            "snapshotter = \"shoal\" under [" + cri + "] in " + o.containerd_config +
                " itself (containerd 1.6 replaces the whole CRI section with an imported "
                "file's)" +
                restart);
      } else {
        r.Ok(check, "the CRI's snapshotter is \"shoal\" (" + where + ")");
      }
      bool disabled = !annotations.value || !annotations.value->is_boolean() ||
                      annotations.value->as_boolean()->get();
      if (disabled) {
        r.Warn(check,
               "disable_snapshot_annotations is " +
                   (annotations.value ? TomlText(annotations.value)
                                      : std::string("true (containerd 1.6's default)")) +
                   " in " + where +
                   ": the CRI passes no layer labels, so the agent prepares no layer and "
                   "containerd fetches and unpacks every one itself",
               "disable_snapshot_annotations = false under [" + cri + "]" + restart);
      } else {
        r.Ok(check,
             "snapshot annotations are on (disable_snapshot_annotations = false): the agent "
             "prepares the layers of the kubelet's pulls");
      }
    }
  }

  // The agent's socket, asked what containerd would ask.
  if (socket.empty()) {
    r.Fail(check, "no snapshotter socket named (no --snapshotter-socket, no address)", setup);
  } else {
    const std::string fix = "run the agent with --snapshotter-socket " + socket +
                            " (helm value agent.snapshotter.enabled=true); kubectl -n "
                            "<namespace> logs ds/<release>-agent -c agent (on this node)";
    std::string on_disk = UnderRoot(o.root, socket);
    std::error_code ec;
    if (!fs::exists(on_disk, ec)) {
      r.Fail(check,
             "no snapshotter socket at " + socket +
                 ": the agent does not serve it, and containerd's pulls and container starts "
                 "with snapshotter shoal fail meanwhile",
             fix);
    } else if (auto n = snapshotter::CountSnapshots(on_disk, std::chrono::seconds(3)); !n) {
      r.Fail(check, socket + " does not answer containerd's snapshots API: " + n.error().message,
             fix);
    } else {
      r.Ok(check,
           socket + " answers the snapshots API (" + std::to_string(n.value()) + " snapshots)");
    }
  }

  // What the running containerd loaded (it reads config.toml only when it starts).
  std::string containerd_socket = StringOf(PlainSetting(config, {"grpc", "address"})).value_or("");
  if (containerd_socket.empty()) containerd_socket = "/run/containerd/containerd.sock";
  std::error_code ec;
  if (!fs::exists(UnderRoot(o.root, containerd_socket), ec)) {
    r.Ok(check, "containerd is not running (no " + containerd_socket +
                    "): the plugins it loads are not checked");
    return;
  }
  std::string ctr = FindCtr(o.root);
  if (ctr.empty()) {
    r.Ok(check, "no ctr here: the plugins containerd loaded are not checked");
    return;
  }
  int status = 0;
  auto out = Capture(ShellQuote(ctr) + " --address " +
                         ShellQuote(UnderRoot(o.root, containerd_socket)) + " plugins ls",
                     &status);
  if (!out || status != 0) {
    r.Warn(check, "`ctr plugins ls` failed: " + out.value_or("could not run " + ctr),
           "run it on the node: ctr --address " + containerd_socket + " plugins ls");
    return;
  }
  std::string row_status;
  std::istringstream rows(*out);
  for (std::string row; std::getline(rows, row);) {
    std::istringstream cols(row);
    std::string t, id, platforms, st;
    cols >> t >> id >> platforms >> st;
    if (t == "io.containerd.snapshotter.v1" && id == "shoal") row_status = st;
  }
  if (row_status == "ok") {
    r.Ok(check, "containerd loaded it: io.containerd.snapshotter.v1 shoal ok (ctr plugins ls)");
  } else if (row_status.empty()) {
    r.Fail(check,
           "the running containerd has no shoal snapshotter (not in `ctr plugins ls`): it "
           "started before its config named it",
           "systemctl restart containerd (best on a drained node)");
  } else {
    r.Fail(check,
           "containerd's shoal snapshotter plugin is \"" + row_status + "\" (ctr plugins ls)",
           "check the socket above, then restart containerd (`ctr plugins ls -d` shows why)");
  }
}

// --- CRI-O / podman ---

void CheckCrio(const DoctorOptions& o, const std::string& agent,
               const std::vector<std::string>& registries, Report& r) {
  std::error_code ec;
  std::string dir = UnderRoot(o.root, o.crio_dir);
  bool crio = fs::exists(UnderRoot(o.root, "/etc/crio"), ec) ||
              fs::exists(UnderRoot(o.root, "/var/run/crio/crio.sock"), ec);
  if (!fs::is_directory(dir, ec)) {
    if (crio) {
      r.Warn("crio", "CRI-O is here but " + o.crio_dir + " does not exist",
             "helm value nodeSetup.crio.enabled=true");
    } else {
      r.Ok("crio", "no CRI-O on this node and no " + o.crio_dir + ": skipped");
    }
    return;
  }
  std::string all;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".conf") continue;
    auto t = ReadIfExists(e.path());
    if (t && t.value()) all += Uncommented(*t.value());
  }
  for (const auto& reg : registries) {
    std::regex loc(
        "location\\s*=\\s*\"" +
        std::regex_replace(agent + "/" + reg, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") +
        "\"");
    if (std::regex_search(all, loc)) {
      r.Ok("crio", reg + " has the mirror " + agent + "/" + reg + " in " + o.crio_dir);
    } else if (crio) {
      r.Warn("crio", "no mirror " + agent + "/" + reg + " in " + o.crio_dir,
             "helm value nodeSetup.crio.enabled=true, or `shoalctl config crio`");
    } else {
      r.Ok("crio",
           "no CRI-O on this node; " + o.crio_dir + " names no mirror for " + reg + " (podman)");
    }
  }
}

// --- kernel ---

void CheckArp(const DoctorOptions& o, Report& r) {
  long t[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    auto v = ReadIfExists(
        UnderRoot(o.root, "/proc/sys/net/ipv4/neigh/default/gc_thresh" + std::to_string(i + 1)));
    if (!v || !v.value()) {
      r.Warn("arp", "cannot read net.ipv4.neigh.default.gc_thresh" + std::to_string(i + 1), "");
      return;
    }
    t[i] = std::atol(v.value()->c_str());
  }
  std::string now = "gc_thresh1/2/3 = " + std::to_string(t[0]) + "/" + std::to_string(t[1]) + "/" +
                    std::to_string(t[2]);
  const std::string fix =
      "helm value nodeSetup.arpSysctls.enabled=true (80000/90000/100000), or sysctl -w "
      "net.ipv4.neigh.default.gc_thresh1=80000 gc_thresh2=90000 gc_thresh3=100000";
  if (o.cluster_nodes <= 0) {
    r.Ok("arp", now + " (give --cluster-nodes to check them against the cluster's size)");
  } else if (t[2] < o.cluster_nodes) {
    // Beyond gc_thresh3 the kernel refuses new neighbours: "neighbor table overflow!".
    r.Fail("arp",
           now + ": the neighbour table holds fewer entries than the cluster's " +
               std::to_string(o.cluster_nodes) + " nodes (neighbor table overflow, DNS failures)",
           fix);
  } else if (t[0] < o.cluster_nodes) {
    r.Warn("arp",
           now + ": garbage collection of neighbours starts below the cluster's " +
               std::to_string(o.cluster_nodes) + " nodes",
           fix);
  } else {
    r.Ok("arp", now + " for " + std::to_string(o.cluster_nodes) + " nodes");
  }
}

// --- the cache ---

void CheckCache(const DoctorOptions& o, Report& r) {
  if (o.cache_dir.empty()) {
    r.Warn("cache", "no --cache-dir given (SHOAL_CACHE_DIR in the agent's pod): not checked", "");
    return;
  }
  std::error_code ec;
  if (!fs::is_directory(o.cache_dir, ec)) {
    r.Fail("cache", o.cache_dir + " does not exist",
           "the agent creates it; check the hostPath volume");
    return;
  }
  struct statfs sfs {};
  struct statvfs svfs {};
  if (::statfs(o.cache_dir.c_str(), &sfs) != 0 || ::statvfs(o.cache_dir.c_str(), &svfs) != 0) {
    r.Fail("cache", "cannot read the file system of " + o.cache_dir, "");
    return;
  }
  FsKind k = KindOf(static_cast<unsigned long>(sfs.f_type));
  double total = static_cast<double>(svfs.f_blocks) * svfs.f_frsize;
  double avail = static_cast<double>(svfs.f_bavail) * svfs.f_frsize;
  if (k.network) {
    r.Fail("cache", o.cache_dir + " is on " + k.name + ", a network file system",
           "agent.cache.hostPath on the node's local SSD (Azure: /mnt)");
  } else if (k.memory || k.overlay) {
    r.Warn("cache",
           o.cache_dir + " is on " + k.name +
               (k.memory ? " (memory)" : " (the container's own layer, not a hostPath)"),
           "agent.cache.hostPath on the node's local SSD");
  } else {
    r.Ok("cache", o.cache_dir + " is on " + k.name + ", " + Gib(avail) + " free of " + Gib(total));
  }
  if (::access(o.cache_dir.c_str(), W_OK) != 0) {
    r.Fail("cache", o.cache_dir + " is not writable",
           "check the hostPath volume and the agent's user");
  }
  auto budget = store::ParseBudget(o.cache_budget, o.cache_dir);
  if (!budget) {
    r.Fail("cache", "budget \"" + o.cache_budget + "\": " + budget.error().message,
           "agent.cache.budget: 50GiB, 80% or 0");
    return;
  }
  if (budget.value() == 0) {
    r.Warn("cache", "no cache budget: the cache can fill the disk",
           "agent.cache.budget (e.g. 80%)");
    return;
  }
  double used = 0;
  for (auto it = fs::recursive_directory_iterator(
           o.cache_dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) used += static_cast<double>(it->file_size(ec));
  }
  double b = static_cast<double>(budget.value());
  if (b > used + avail) {
    r.Warn("cache",
           "budget " + Gib(b) + " is more than the cache can grow to (" + Gib(used) + " cached + " +
               Gib(avail) + " free)",
           "a smaller agent.cache.budget, or a percentage (80%)");
  } else {
    r.Ok("cache", "budget " + Gib(b) + " (" + Gib(used) + " cached)");
  }
}

// --- agent and trackers ---

// Agents announce over UDP to an http:// replica on its port number (--tracker-announce udp, the
// default) and fall back to HTTP, at about twice the tracker CPU per announce, where UDP does
// not arrive. Same probe as the agent's (3 BEP 15 connects, 300 ms each).
void CheckUdpAnnounce(const std::string& base, Report& r) {
  auto url = http::Url::Parse(base);
  if (!url || url.value().scheme != "http") return;  // https replicas take HTTPS announces
  const std::string where = url.value().HostPort();
  switch (http::ProbeUdpAnnounce(url.value(), 3, std::chrono::milliseconds(300))) {
    case http::UdpReach::kAnswers:
      r.Ok("tracker-udp", "UDP announces to " + where + " are answered");
      break;
    case http::UdpReach::kTcpOnly:
      r.Warn("tracker-udp",
             "UDP to " + where + " is not answered while its TCP port is: agents on this node "
             "announce there over HTTP (about twice the tracker CPU per announce)",
             "allow UDP port " + std::to_string(url.value().port) + " from the nodes to the "
             "trackers (NetworkPolicy, firewall, Service), or ignore if the tracker runs with "
             "--udp-announce=false");
      break;
    case http::UdpReach::kNeither: break;  // the HTTP check above already said what answers
  }
}

void CheckServices(const DoctorOptions& o, const std::string& agent, Report& r) {
  unsigned s = HttpStatus("http://" + agent + "/healthz");
  if (s == 200) {
    r.Ok("agent", "http://" + agent + "/healthz answers 200");
  } else {
    r.Fail("agent",
           s == 0 ? "no agent answers on " + agent
                  : "http://" + agent + "/healthz answers " + std::to_string(s),
           "kubectl -n <namespace> logs ds/<release>-agent -c agent (on this node); runtimes pull "
           "from the registries meanwhile");
  }
  if (o.trackers.empty()) {
    r.Warn("tracker",
           "no --tracker given (SHOAL_TRACKERS in the agent's pod): agents without trackers fetch "
           "every blob from upstream",
           "");
    return;
  }
  size_t up = 0;
  for (const auto& t : o.trackers) {
    std::string base = t;
    while (!base.empty() && base.back() == '/') base.pop_back();
    unsigned ts = HttpStatus(base + "/healthz");
    if (ts == 200) {
      ++up;
      r.Ok("tracker", base + " is healthy");
      CheckUdpAnnounce(base, r);
    } else {
      r.Warn("tracker", base + (ts == 0 ? " does not answer" : " answers " + std::to_string(ts)),
             "kubectl -n <namespace> get pods -l app.kubernetes.io/component=tracker");
    }
  }
  if (up == 0) {
    r.Fail("tracker", "no tracker replica answers: no swarm, every node pulls from upstream",
           "check the tracker StatefulSet");
  }
}

int Run(const DoctorOptions& o) {
  auto agent = AgentHostPort(o.agent);
  auto registries = Registries(o.registries);
  if (!agent || !registries) {
    std::cerr << "shoalctl: " << (!agent ? agent.error().message : registries.error().message)
              << "\n";
    return 3;
  }
  Report r;
  CheckKubelet(o, r);
  CheckDockerd(o, agent.value(), r);
  CheckContainerd(o, agent.value(), registries.value(), r);
  CheckSnapshotter(o, r);
  CheckCrio(o, agent.value(), registries.value(), r);
  CheckArp(o, r);
  CheckCache(o, r);
  CheckServices(o, agent.value(), r);
  Level worst = Level::kOk;
  for (const auto& f : r.findings()) worst = std::max(worst, f.level);
  if (o.json) {
    nlohmann::ordered_json out = {{"status", LevelName(worst)},
                                  {"findings", nlohmann::ordered_json::array()}};
    for (const auto& f : r.findings()) {
      nlohmann::ordered_json j = {
          {"check", f.check}, {"status", LevelName(f.level)}, {"message", f.message}};
      if (!f.fix.empty()) j["fix"] = f.fix;
      out["findings"].push_back(j);
    }
    std::cout << out.dump(2) << "\n";
  } else {
    for (const auto& f : r.findings()) {
      std::printf("%-4s  %-10s  %s\n", LevelName(f.level), f.check.c_str(), f.message.c_str());
      if (!f.fix.empty()) std::printf("      %-10s  fix: %s\n", "", f.fix.c_str());
    }
    std::printf("doctor: %s\n", LevelName(worst));
  }
  return worst == Level::kOk ? 0 : worst == Level::kWarn ? 1 : 2;
}

}  // namespace

void AddDoctorCommand(CLI::App& app) {
  auto o = std::make_shared<DoctorOptions>();
  CLI::App* cmd = app.add_subcommand(
      "doctor",
      "Check this node: kubelet pull settings, dockerd/containerd/CRI-O mirrors, the containerd "
      "snapshotter, ARP thresholds, "
      "the cache disk, the agent and the trackers (ok/warn/fail with the fix; exit 0 ok, 1 "
      "warnings, 2 failures)");
  cmd->add_option("--root", o->root, "The node's / as this process sees it (/host in the pod)")
      ->envname("SHOAL_HOST_ROOT")
      ->capture_default_str();
  // SHOAL_LISTEN: in the agent's pod (kubectl exec) the agent's own listen address.
  cmd->add_option("--agent", o->agent, "This node's agent shim HOST:PORT (default: SHOAL_LISTEN)")
      ->envname("SHOAL_LISTEN")
      ->capture_default_str();
  cmd->add_option("--tracker", o->trackers, "Tracker replica URLs (comma-separated)")
      ->envname("SHOAL_TRACKERS")
      ->delimiter(',');
  cmd->add_option("--registry", o->registries, "Registries that should go through the agent")
      ->envname("SHOAL_REGISTRIES")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--cache-dir", o->cache_dir,
                  "The agent's cache directory as this process sees it (not under --root)")
      ->envname("SHOAL_CACHE_DIR");
  cmd->add_option("--cache-budget", o->cache_budget, "The agent's cache budget (50GiB, 80%, 0)")
      ->envname("SHOAL_CACHE_BUDGET")
      ->capture_default_str();
  cmd->add_option("--cluster-nodes", o->cluster_nodes,
                  "Nodes in the cluster, for the ARP thresholds")
      ->envname("SHOAL_CLUSTER_NODES")
      ->check(CLI::Range(0L, 10'000'000L));
  cmd->add_option("--kubelet-config", o->kubelet_config,
                  "kubelet's config file (under --root) when its flags name none")
      ->capture_default_str();
  cmd->add_option("--dockerd-config", o->dockerd_config, "dockerd's daemon.json (under --root)")
      ->capture_default_str();
  cmd->add_option("--containerd-config", o->containerd_config,
                  "containerd's config.toml (under --root)")
      ->capture_default_str();
  cmd->add_option("--containerd-certs-dir", o->containerd_certs_dir,
                  "containerd's hosts.toml directory (under --root); default: config_path");
  cmd->add_option("--snapshotter-socket", o->snapshotter_socket,
                  "The agent's containerd snapshotter socket (under --root; default: the "
                  "address of [proxy_plugins.shoal]); checked when given or configured")
      ->envname("SHOAL_SNAPSHOTTER_SOCKET");
  cmd->add_option("--crio-dir", o->crio_dir, "registries.conf.d directory (under --root)")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print the findings as JSON");
  cmd->callback([o] { throw CLI::RuntimeError(Run(*o)); });
}

}  // namespace shoal::ctl
