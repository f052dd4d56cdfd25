#include "tests/support/registry.h"

#include <chrono>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "tests/support/http_client.h"
#include "tests/support/image.h"

namespace shoal::testkit {
namespace {

constexpr auto kStartTimeout = std::chrono::seconds(30);

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// YAML double-quoted scalar (paths and URLs in tests never contain control characters).
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

Registry::Registry(RegistryOptions options)
    : options_(std::move(options)), dir_(std::make_unique<TempDir>("shoal-registry")) {}

Registry::~Registry() { Stop(); }

Result<std::unique_ptr<Registry>> Registry::Start(RegistryOptions options) {
  bool fixed_port = options.port != 0;
  std::unique_ptr<Registry> reg(new Registry(std::move(options)));
  std::filesystem::create_directories(reg->StorageRoot());
  if (reg->options_.auth == RegistryOptions::Auth::kHtpasswd) {
    auto line = RunCommand({"htpasswd", "-Bbn", reg->options_.user, reg->options_.password},
                           std::chrono::seconds(60));
    if (!line) return line.error();
    WriteFile(reg->dir_->Sub("htpasswd"), Trim(line.value()) + "\n");
  }
  // FreePort() can race with other processes; retry with a new port if binding fails.
  Status st = MakeError(ErrorCode::kUnavailable, "registry never started");
  for (int attempt = 0; attempt < (fixed_port ? 1 : 4); ++attempt) {
    if (!fixed_port) reg->options_.port = FreePort();
    st = reg->Launch();
    if (st) return reg;
  }
  return st.error();
}

Status Registry::Launch() {
  const RegistryOptions& o = options_;
  std::string cfg;
  cfg += "version: 0.1\n";
  cfg += "log:\n  level: info\n  formatter: text\n";
  cfg += "storage:\n";
  cfg += "  filesystem:\n    rootdirectory: " + Quote(StorageRoot()) + "\n";
  cfg += "  delete:\n    enabled: true\n";
  cfg += "  maintenance:\n    uploadpurging:\n      enabled: false\n";
  cfg += "http:\n  addr: 127.0.0.1:" + std::to_string(o.port) + "\n";
  cfg += "health:\n  storagedriver:\n    enabled: false\n";
  if (o.auth == RegistryOptions::Auth::kHtpasswd) {
    cfg += "auth:\n  htpasswd:\n    realm: shoal-test\n    path: " + Quote(dir_->Sub("htpasswd")) +
           "\n";
  } else if (o.auth == RegistryOptions::Auth::kToken) {
    cfg += "auth:\n  token:\n";
    cfg += "    realm: " + Quote(o.token_realm) + "\n";
    cfg += "    service: " + Quote(o.token_service) + "\n";
    cfg += "    issuer: " + Quote(o.token_issuer) + "\n";
    cfg += "    rootcertbundle: " + Quote(o.token_rootcert) + "\n";
  }
  if (!o.proxy_remote_url.empty()) {
    cfg += "proxy:\n  remoteurl: " + Quote(o.proxy_remote_url) + "\n";
    if (!o.proxy_username.empty()) {
      cfg += "  username: " + Quote(o.proxy_username) + "\n";
      cfg += "  password: " + Quote(o.proxy_password) + "\n";
    }
  }
  WriteFile(dir_->Sub("config.yml"), cfg);

  auto proc = Process::Start({"docker-registry", "serve", dir_->Sub("config.yml")}, LogPath());
  if (!proc) return proc.error();
  process_ = std::move(proc.value());
  // Done once /v2/ answers (401 counts), or failed once the process exits (port taken).
  bool up = WaitUntil(
      [&] {
        if (!process_->Running()) return true;
        return static_cast<bool>(
            HttpRequest("GET", Url() + "/v2/", {}, "", std::chrono::milliseconds(500)));
      },
      kStartTimeout);
  if (up && process_->Running()) {
    spdlog::debug("testkit: docker-registry on {} (root {})", HostPort(), StorageRoot());
    return Ok();
  }
  process_->Stop();
  return MakeError(ErrorCode::kUnavailable, "docker-registry on " + HostPort() +
                                                " did not start; log " + LogPath() + ":\n" +
                                                process_->LogTail());
}

std::string Registry::HostPort() const { return "127.0.0.1:" + std::to_string(options_.port); }

std::string Registry::Url() const { return "http://" + HostPort(); }

std::string Registry::Creds() const {
  if (options_.auth == RegistryOptions::Auth::kNone) return "";
  return options_.user + ":" + options_.password;
}

std::string Registry::StorageRoot() const { return dir_->Sub("storage"); }

std::string Registry::BlobDataPath(const Digest& digest) const {
  return StorageRoot() + "/docker/registry/v2/blobs/sha256/" + digest.hex().substr(0, 2) + "/" +
         digest.hex() + "/data";
}

std::string Registry::LogPath() const { return dir_->Sub("registry.log"); }

void Registry::Stop() {
  if (process_) process_->Stop();
}

Status Registry::Restart() {
  Stop();
  return Launch();
}

bool Registry::Running() { return process_ && process_->Running(); }

Status PushImage(const Registry& reg, const std::string& layout_dir, const std::string& tag,
                 const std::string& dest_name) {
  return PushImage(reg, layout_dir, tag, dest_name, tag);
}

Status PushImage(const Registry& reg, const std::string& layout_dir, const std::string& tag,
                 const std::string& dest_name, const std::string& dest_tag) {
  auto layout = ReadLayout(layout_dir, tag);
  if (!layout) return layout.error();
  TempDir tmp("shoal-push");
  std::string digest_file = tmp.Sub("digest");
  std::vector<std::string> args = {
      "copy",         "--all",    "--preserve-digests", "--quiet", "--dest-tls-verify=false",
      "--digestfile", digest_file};
  if (!reg.Creds().empty()) {
    args.push_back("--dest-creds");
    args.push_back(reg.Creds());
  }
  args.push_back("oci:" + layout_dir + ":" + tag);
  args.push_back("docker://" + reg.HostPort() + "/" + dest_name + ":" + dest_tag);
  auto out = Skopeo(std::move(args));
  if (!out) return out.error();
  std::string pushed = Trim(ReadFile(digest_file));
  if (pushed != layout.value().manifest_digest.str()) {
    return MakeError(ErrorCode::kDigestMismatch, "push of " + layout_dir + ":" + tag + " to " +
                                                     reg.HostPort() + "/" + dest_name +
                                                     ": registry has " + pushed + ", layout has " +
                                                     layout.value().manifest_digest.str());
  }
  return Ok();
}

Result<BuiltImage> PushOneLayerImage(const Registry& reg, const std::string& layout_dir,
                                     const std::string& dest_name, uint64_t big, uint64_t seed) {
  ImageSpec spec;
  spec.layers.push_back(LayerSpec{Compression::kGzip, 4, {big}, seed});
  auto built = BuildImage(spec, layout_dir, "1");
  if (!built) return built.error();
  if (auto pushed = PushImage(reg, layout_dir, "1", dest_name); !pushed) return pushed.error();
  return built.value();
}

}  // namespace shoal::testkit
