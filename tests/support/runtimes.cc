#include "tests/support/runtimes.h"

#include <signal.h>
#include <sys/mount.h>

#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

namespace shoal::testkit {
namespace {

// The Debian client: /usr/local/bin/docker (a newer client) comes first in PATH here and speaks
// an API version dockerd 20.10 refuses.
constexpr char kDockerClient[] = "/usr/bin/docker";

// First whitespace-separated fields of each line of `text`.
std::vector<std::vector<std::string>> Table(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::vector<std::string> row;
    std::string f;
    while (fields >> f) row.push_back(f);
    if (!row.empty()) rows.push_back(std::move(row));
  }
  return rows;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  while (!s.empty() && (s.front() == '\n' || s.front() == ' ')) s.erase(s.begin());
  return s;
}

// Stops a daemon gently: SIGTERM to the daemon alone, so it can stop its own children (dockerd
// stops its containerd), then Process::Stop for whatever is left of its group.
void StopDaemon(Process& p, std::chrono::seconds grace) {
  if (!p.Running()) return;
  p.Signal(SIGTERM);
  WaitUntil([&] { return !p.Running(); }, grace, std::chrono::milliseconds(50));
  p.Stop(std::chrono::seconds(2));
}

}  // namespace

// ---- dockerd ---------------------------------------------------------------------------------

Result<std::unique_ptr<Dockerd>> Dockerd::Start(const std::string& settings,
                                                std::vector<std::string> extra_env) {
  std::unique_ptr<Dockerd> d(new Dockerd());
  nlohmann::json cfg = nlohmann::json::parse(settings, nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "dockerd settings are not a JSON object: " + settings);
  }
  const TempDir& dir = *d->dir_;
  cfg["data-root"] = dir.Sub("data");
  cfg["exec-root"] = dir.Sub("exec");
  cfg["pidfile"] = dir.Sub("docker.pid");
  cfg["hosts"] = nlohmann::json::array({"unix://" + dir.Sub("docker.sock")});
  // overlay2 (what shoalctl recommends for nodes) would work here too, but vfs needs no mounts
  // per layer and leaves nothing behind.
  cfg["storage-driver"] = "vfs";
  cfg["iptables"] = false;
  cfg["ip6tables"] = false;
  cfg["bridge"] = "none";
  cfg["log-level"] = "debug";
  WriteFile(dir.Sub("daemon.json"), cfg.dump(2));
  std::filesystem::create_directories(dir.Sub("client"));
  d->WriteClientConfig("{}");
  auto proc = Process::Start({"dockerd", "--config-file", dir.Sub("daemon.json")},
                             dir.Sub("dockerd.log"), std::move(extra_env));
  if (!proc) return proc.error();
  d->process_ = std::move(proc.value());
  Result<std::string> version = MakeError(ErrorCode::kUnavailable, "not asked");
  bool up = WaitUntil(
      [&] {
        if (!d->process_->Running()) return true;
        if (!std::filesystem::exists(dir.Sub("docker.sock"))) return false;
        version =
            d->Docker({"version", "--format", "{{.Server.Version}}"}, std::chrono::seconds(10));
        return version.has_value();
      },
      std::chrono::seconds(60), std::chrono::milliseconds(100));
  if (!up || !d->process_->Running() || !version) {
    return MakeError(ErrorCode::kUnavailable, "dockerd did not start: " + d->LogTail());
  }
  return d;
}

Dockerd::~Dockerd() { Shutdown(); }

void Dockerd::Shutdown() {
  if (process_) StopDaemon(*process_, std::chrono::seconds(20));
  // dockerd bind-mounts its data-root onto itself; a clean stop usually undoes it, a kill not.
  for (const std::string& sub : {std::string("data"), std::string("exec")}) {
    for (int i = 0; i < 4 && ::umount2(dir_->Sub(sub).c_str(), MNT_DETACH) == 0; ++i) {
    }
  }
}

Result<std::string> Dockerd::Docker(std::vector<std::string> args, std::chrono::seconds timeout) {
  args.insert(args.begin(), kDockerClient);
  return RunCommand(std::move(args), timeout,
                    {"DOCKER_HOST=unix://" + dir_->Sub("docker.sock"),
                     "DOCKER_CONFIG=" + dir_->Sub("client"), "DOCKER_CLI_EXPERIMENTAL=disabled"});
}

void Dockerd::WriteClientConfig(const std::string& json) {
  WriteFile(dir_->Sub("client/config.json"), json);
}

Result<std::string> Dockerd::RepoDigest(const std::string& image) {
  auto out = Docker({"image", "inspect", "--format", "{{json .RepoDigests}}", image});
  if (!out) return out.error();
  nlohmann::json digests = nlohmann::json::parse(Trim(out.value()), nullptr, false);
  if (digests.is_array()) {
    for (const auto& d : digests) {
      if (!d.is_string()) continue;
      std::string s = d.get<std::string>();
      auto at = s.find('@');
      if (at != std::string::npos) return s.substr(at + 1);
    }
  }
  return MakeError(ErrorCode::kNotFound, "no repo digest for " + image + ": " + out.value());
}

std::string Dockerd::LogTail() const { return process_ ? process_->LogTail(6000) : ""; }

// ---- containerd ------------------------------------------------------------------------------

std::string Containerd::CriImageConfig(const std::string& snapshotter,
                                       const std::string& hosts_dir) {
  return "[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"" + snapshotter +
         "\"\n  disable_snapshot_annotations = false\n" +
         "[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"" + hosts_dir +
         "\"\n";
}

std::string Containerd::ProxySnapshotterConfig(const std::string& name,
                                               const std::string& socket_path) {
  return "[proxy_plugins]\n  [proxy_plugins." + name + "]\n    type = \"snapshot\"\n" +
         "    address = \"" + socket_path + "\"\n";
}

Result<std::unique_ptr<Containerd>> Containerd::Start(
    const std::string& extra_config, bool cri,
    const std::function<void(const std::string& config_path)>& before_start) {
  std::unique_ptr<Containerd> c(new Containerd());
  const TempDir& dir = *c->dir_;
  std::string cfg;
  cfg += "version = 2\n";
  cfg += "root = \"" + dir.Sub("root") + "\"\n";
  cfg += "state = \"" + dir.Sub("state") + "\"\n";
  if (!cri) cfg += "disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n";
  cfg += "[grpc]\n  address = \"" + dir.Sub("containerd.sock") + "\"\n";
  cfg += "[ttrpc]\n  address = \"" + dir.Sub("containerd-ttrpc.sock") + "\"\n";
  cfg += "[debug]\n  address = \"\"\n  level = \"debug\"\n";
  cfg += "[metrics]\n  address = \"\"\n";
  if (cri) {
    std::filesystem::create_directories(dir.Sub("cni/conf"));
    std::filesystem::create_directories(dir.Sub("cni/bin"));
    cfg += "[plugins.\"io.containerd.grpc.v1.cri\"]\n";
    cfg += "  disable_tcp_service = true\n";
    cfg += "  stream_server_address = \"127.0.0.1\"\n  stream_server_port = \"0\"\n";
    cfg += "  enable_selinux = false\n  disable_apparmor = true\n";
    cfg += "  restrict_oom_score_adj = true\n";
    cfg += "  [plugins.\"io.containerd.grpc.v1.cri\".cni]\n";
    cfg += "    bin_dir = \"" + dir.Sub("cni/bin") + "\"\n";
    cfg += "    conf_dir = \"" + dir.Sub("cni/conf") + "\"\n";
  }
  cfg += extra_config;
  WriteFile(dir.Sub("config.toml"), cfg);
  if (before_start) before_start(dir.Sub("config.toml"));
  auto proc =
      Process::Start({"containerd", "--config", dir.Sub("config.toml")}, dir.Sub("containerd.log"));
  if (!proc) return proc.error();
  c->process_ = std::move(proc.value());
  bool up = WaitUntil(
      [&] {
        if (!c->process_->Running()) return true;
        if (!std::filesystem::exists(dir.Sub("containerd.sock"))) return false;
        return c->Ctr({"version"}, std::chrono::seconds(10)).has_value();
      },
      std::chrono::seconds(30), std::chrono::milliseconds(50));
  if (!up || !c->process_->Running()) {
    return MakeError(ErrorCode::kUnavailable, "containerd did not start: " + c->LogTail());
  }
  return c;
}

Containerd::~Containerd() {
  if (process_) StopDaemon(*process_, std::chrono::seconds(10));
}

Result<std::string> Containerd::Ctr(std::vector<std::string> args, std::chrono::seconds timeout) {
  args.insert(args.begin(), {"ctr", "--address", dir_->Sub("containerd.sock")});
  return RunCommand(std::move(args), timeout);
}

Result<std::string> Containerd::Pull(const std::string& hosts_dir, const std::string& ref,
                                     const std::string& snapshotter) {
  return Ctr({"images", "pull", "--snapshotter", snapshotter, "--hosts-dir", hosts_dir, ref});
}

Result<std::string> Containerd::ImageDigest(const std::string& ref) {
  auto out = Ctr({"images", "ls"});
  if (!out) return out.error();
  // REF TYPE DIGEST SIZE PLATFORMS LABELS
  for (const auto& row : Table(out.value())) {
    if (row.size() >= 3 && row[0] == ref) return row[2];
  }
  return MakeError(ErrorCode::kNotFound, "containerd has no image " + ref + ": " + out.value());
}

std::string Containerd::LogTail() const { return process_ ? process_->LogTail(6000) : ""; }

// ---- podman ----------------------------------------------------------------------------------

Result<std::string> Podman::Run(const std::string& registries_conf, std::vector<std::string> args,
                                std::chrono::seconds timeout) {
  const TempDir& dir = *dir_;
  if (!std::filesystem::exists(dir.Sub("policy.json"))) {
    WriteFile(dir.Sub("policy.json"), R"({"default":[{"type":"insecureAcceptAnything"}]})");
    WriteFile(dir.Sub("auth.json"), "{}");
    WriteFile(dir.Sub("containers.conf"), "");
    // podman refuses a storage.conf without both roots, even when flags set them.
    WriteFile(dir.Sub("storage.conf"), "[storage]\ndriver = \"vfs\"\nrunroot = \"" +
                                           dir.Sub("runroot") + "\"\ngraphroot = \"" +
                                           dir.Sub("root") + "\"\n");
    std::filesystem::create_directories(dir.Sub("tmp"));
  }
  std::vector<std::string> argv = {"podman",
                                   "--root",
                                   dir.Sub("root"),
                                   "--runroot",
                                   dir.Sub("runroot"),
                                   "--tmpdir",
                                   dir.Sub("tmp"),
                                   "--storage-driver",
                                   "vfs",
                                   "--cgroup-manager",
                                   "cgroupfs",
                                   "--events-backend",
                                   "none"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(
      std::move(argv), timeout,
      {"CONTAINERS_REGISTRIES_CONF=" + registries_conf,
       "CONTAINERS_CONF=" + dir.Sub("containers.conf"),
       "CONTAINERS_STORAGE_CONF=" + dir.Sub("storage.conf"),
       "REGISTRY_AUTH_FILE=" + dir.Sub("auth.json"), "XDG_RUNTIME_DIR=" + dir.Sub("tmp")});
}

Result<std::string> Podman::ImageDigest(const std::string& registries_conf,
                                        const std::string& ref) {
  auto out = Run(registries_conf, {"image", "inspect", "--format", "{{.Digest}}", ref});
  if (!out) return out.error();
  std::string digest = Trim(out.value());
  if (digest.rfind("sha256:", 0) != 0) {
    return MakeError(ErrorCode::kNotFound, "podman has no digest for " + ref + ": " + digest);
  }
  return digest;
}

Result<std::string> Podman::Pull(const std::string& registries_conf, const std::string& ref) {
  // Creates the isolation files on first use, then pulls with this dir's signature policy.
  auto info = Run(registries_conf, {"version"});
  if (!info) return info.error();
  return Run(registries_conf, {"pull", "--signature-policy", dir_->Sub("policy.json"), ref});
}

// ---- shoalctl --------------------------------------------------------------------------------

Result<std::string> Shoalctl(std::vector<std::string> args) {
  args.insert(args.begin(), SHOAL_CTL_BIN);
  return RunCommand(std::move(args), std::chrono::seconds(30));
}

}  // namespace shoal::testkit
