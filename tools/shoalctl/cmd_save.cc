// `shoalctl save IMAGE... -o file.tar`: writes a docker-archive (the classic `docker save`
// format that `docker load` reads: manifest.json, <config hex>.json, <diff id hex>/layer.tar)
// from the node's agent. Each blob comes through the agent's shim (so it is served from, or
// lands in, the node's cache) and is verified against its digest; layers are decompressed
// (gzip through ISA-L, zstd) into uncompressed tar and checked against the config's diff_ids.
// The archive is written under a temp name and renamed at the end: a failed save leaves nothing.
#include <utility>  // before Asio (GCC 12 + Boost 1.74)

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include "lib/core/sha256.h"
#include "lib/extract/byte_source.h"
#include "lib/extract/decompress.h"
#include "lib/http/client.h"
#include "lib/oci/manifest.h"
#include "lib/oci/media_types.h"
#include "lib/oci/reference.h"
#include "tools/shoalctl/agent_client.h"
#include "tools/shoalctl/commands.h"
#include "tools/shoalctl/human.h"

namespace shoal::ctl {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using asio::awaitable;

struct SaveFlags {
  std::vector<std::string> images;
  std::string output;
  std::string agent = "http://127.0.0.1:5000";
  std::string platform = "linux/amd64";
  bool json = false;
};

constexpr size_t kMaxConfig = 16 << 20;

Status WriteAll(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return MakeError(ErrorCode::kIo, "write " + path + ": " + std::strerror(errno));
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Ok();
}

// A ustar writer over a regular file: headers are written before the data with a placeholder
// size and patched afterwards, so a layer can be decompressed straight into the archive.
class TarWriter {
 public:
  TarWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  Status AddFile(const std::string& name, std::string_view data) {
    auto st = BeginFile(name);
    if (!st) return st;
    st = WriteAll(fd_, data.data(), data.size(), path_);
    if (!st) return st;
    return EndFile(data.size());
  }
  Status AddDir(const std::string& name) { return WriteHeader(name, 0, '5', Offset()); }

  // Starts a regular file whose bytes follow through fd(); EndFile(size) completes it.
  Status BeginFile(const std::string& name) {
    header_at_ = Offset();
    name_ = name;
    return WriteHeader(name, 0, '0', header_at_);
  }
  Status EndFile(uint64_t size) {
    auto st = WriteHeader(name_, size, '0', header_at_);  // patch the size in
    if (!st) return st;
    if (::lseek(fd_, 0, SEEK_END) < 0) return Errno("seek");
    static const char zeros[512] = {0};
    size_t pad = (512 - size % 512) % 512;
    return WriteAll(fd_, zeros, pad, path_);
  }
  // The two zero blocks that end a tar archive.
  Status Finish() {
    static const char zeros[1024] = {0};
    return WriteAll(fd_, zeros, sizeof(zeros), path_);
  }
  int fd() const { return fd_; }

 private:
  Error Errno(const char* what) {
    return MakeError(ErrorCode::kIo, std::string(what) + " " + path_ + ": " + std::strerror(errno));
  }
  off_t Offset() { return ::lseek(fd_, 0, SEEK_CUR); }

  Status WriteHeader(const std::string& name, uint64_t size, char type, off_t at) {
    if (name.size() > 100) return MakeError(ErrorCode::kInternal, "tar name too long: " + name);
    char h[512];
    std::memset(h, 0, sizeof(h));
    std::memcpy(h, name.data(), name.size());
    std::snprintf(h + 100, 8, "%07o", type == '5' ? 0755 : 0644);
    std::snprintf(h + 108, 8, "%07o", 0);
    std::snprintf(h + 116, 8, "%07o", 0);
    if (size < (1ull << 33)) {
      std::snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(size));
    } else {  // GNU base-256 for sizes of 8 GiB and more
      h[124] = static_cast<char>(0x80);
      for (int i = 0; i < 8; ++i) h[135 - i] = static_cast<char>((size >> (8 * i)) & 0xff);
    }
    std::snprintf(h + 136, 12, "%011llo", static_cast<unsigned long long>(0));
    h[156] = type;
    std::memcpy(h + 257, "ustar", 6);
    std::memcpy(h + 263, "00", 2);
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    std::snprintf(h + 148, 8, "%06o", sum);
    h[155] = ' ';
    if (::pwrite(fd_, h, sizeof(h), at) != static_cast<ssize_t>(sizeof(h))) return Errno("write");
    if (::lseek(fd_, at + 512, SEEK_SET) < 0) return Errno("seek");
    return Ok();
  }

  int fd_;
  std::string path_;
  off_t header_at_ = 0;
  std::string name_;
};

// Runs one coroutine to completion on ioc.
template <typename T>
T RunSync(asio::io_context& ioc, std::function<awaitable<T>()> fn, T init) {
  T out = std::move(init);
  asio::co_spawn(
      ioc, [&]() -> awaitable<void> { out = co_await fn(); }, asio::detached);
  ioc.restart();
  ioc.run();
  return out;
}

// A blob stream's outcome as a Status (the size is not needed).
Status ToStatus(const Result<uint64_t>& streamed) {
  if (!streamed) return streamed.error();
  return Ok();
}

// The name docker shows for a reference: Docker Hub's "docker.io/" and "library/" dropped.
std::string FamiliarName(const oci::ImageRef& ref) {
  std::string repo = ref.repository;
  if (ref.registry == "docker.io") {
    if (repo.rfind("library/", 0) == 0) repo = repo.substr(8);
    return repo;
  }
  return ref.registry + "/" + repo;
}

struct SaveState {
  asio::io_context ioc;
  std::unique_ptr<AgentClient> shim;
  TarWriter* tar = nullptr;
  std::string tmp_dir;
  bool tty = false;
  std::set<std::string> written;  // archive entries already present (shared layers)
  nlohmann::json manifest = nlohmann::json::array();
  uint64_t bytes_in = 0;   // blob bytes read from the agent
  uint64_t bytes_out = 0;  // archive bytes of layers and configs
};

// Downloads a layer into a temp file, then decompresses it into the archive as
// <diff id>/layer.tar and checks the decompressed digest against diff_id.
Result<std::string> SaveLayer(SaveState& s, const oci::ImageRef& image, const oci::Descriptor& d,
                              const Digest& diff_id, const std::string& label) {
  const std::string entry = diff_id.hex() + "/layer.tar";
  if (s.written.count(entry)) return entry;
  std::string tmp = s.tmp_dir + "/" + d.digest.hex() + ".blob";
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return MakeError(ErrorCode::kIo, "create " + tmp + ": " + std::strerror(errno));
  uint64_t got = 0;
  auto last = std::chrono::steady_clock::now();
  std::function<Status(std::string_view)> sink = [&](std::string_view piece) -> Status {
    auto st = WriteAll(fd, piece.data(), piece.size(), tmp);
    got += piece.size();
    auto now = std::chrono::steady_clock::now();
    if (s.tty && (now - last > std::chrono::milliseconds(200) ||
                  (d.size >= 0 && got == static_cast<uint64_t>(d.size)))) {
      last = now;
      std::fprintf(stderr, "\r\033[K%s  %s  %s / %s", label.c_str(),
                   d.digest.hex().substr(0, 12).c_str(), Human(static_cast<double>(got)).c_str(),
                   Human(static_cast<double>(d.size)).c_str());
    }
    return st;
  };
  Status st = RunSync<Status>(
      s.ioc,
      [&]() -> awaitable<Status> {
        auto streamed = co_await s.shim->StreamBlob(image, d, sink);
        co_return ToStatus(streamed);
      },
      Status(MakeError(ErrorCode::kInternal, "not run")));
  ::close(fd);
  if (!st) {
    ::unlink(tmp.c_str());
    return st.error();
  }
  s.bytes_in += got;
  auto finish = [&](Result<std::string> r) {
    ::unlink(tmp.c_str());
    return r;
  };
  auto raw = extract::OpenFileSource(tmp);
  if (!raw) return finish(raw.error());
  auto decoder = extract::OpenDecoder(*raw.value());
  if (!decoder) return finish(decoder.error());
  if (auto dst = s.tar->AddDir(diff_id.hex() + "/"); !dst) return finish(dst.error());
  if (auto bst = s.tar->BeginFile(entry); !bst) return finish(bst.error());
  Sha256 sha;
  uint64_t size = 0;
  std::vector<std::byte> buf(1 << 20);
  for (;;) {
    auto n = decoder.value()->Read(buf);
    if (!n) return finish(n.error());
    if (n.value() == 0) break;
    sha.Update(buf.data(), n.value());
    auto wst = WriteAll(s.tar->fd(), buf.data(), n.value(), "archive");
    if (!wst) return finish(wst.error());
    size += n.value();
  }
  if (Digest got_id = sha.Final(); got_id != diff_id) {
    return finish(MakeError(ErrorCode::kDigestMismatch,
                            "layer " + d.digest.str() + " decompresses to " + got_id.str() +
                                ", but the config's diff_id is " + diff_id.str()));
  }
  if (auto est = s.tar->EndFile(size); !est) return finish(est.error());
  s.bytes_out += size;
  s.written.insert(entry);
  return finish(entry);
}

// Adds one image (config + layers) to the archive and its entry to s.manifest.
Status SaveImage(SaveState& s, const std::string& text, const std::string& platform,
                 nlohmann::json& row) {
  auto image = oci::ParseImageRef(text);
  if (!image) return image.error();
  auto resolved = RunSync<Result<ResolvedImage>>(
      s.ioc,
      [&]() -> awaitable<Result<ResolvedImage>> {
        co_return co_await s.shim->Resolve(image.value(), platform);
      },
      Result<ResolvedImage>(MakeError(ErrorCode::kInternal, "not run")));
  if (!resolved) return resolved.error();
  row["digest"] = resolved.value().digest.str();
  const oci::Manifest& manifest = resolved.value().manifest;
  if (!manifest.config) return MakeError(ErrorCode::kInvalidArgument, text + " has no config");
  const oci::Descriptor config_desc = *manifest.config;
  std::string config;
  std::function<Status(std::string_view)> sink = [&](std::string_view piece) -> Status {
    if (config.size() + piece.size() > kMaxConfig)
      return MakeError(ErrorCode::kInvalidArgument, "config of " + text + " is too large");
    config.append(piece);
    return Ok();
  };
  Status st = RunSync<Status>(
      s.ioc,
      [&]() -> awaitable<Status> {
        auto streamed = co_await s.shim->StreamBlob(image.value(), config_desc, sink);
        co_return ToStatus(streamed);
      },
      Status(MakeError(ErrorCode::kInternal, "not run")));
  if (!st) return st;
  s.bytes_in += config.size();
  row["config"] = config_desc.digest.str();
  // docker load checks each layer's uncompressed digest against rootfs.diff_ids.
  auto cfg = nlohmann::json::parse(config, nullptr, false);
  std::vector<Digest> diff_ids;
  if (cfg.is_object() && cfg.contains("rootfs") && cfg["rootfs"].is_object() &&
      cfg["rootfs"].contains("diff_ids") && cfg["rootfs"]["diff_ids"].is_array()) {
    for (const auto& id : cfg["rootfs"]["diff_ids"]) {
      if (!id.is_string()) continue;
      auto d = Digest::Parse(id.get<std::string>());
      if (!d) return MakeError(ErrorCode::kInvalidArgument, "config of " + text + ": " + d.error().message);
      diff_ids.push_back(d.value());
    }
  }
  if (diff_ids.size() != manifest.layers.size()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "config of " + text + " lists " + std::to_string(diff_ids.size()) +
                         " diff_ids for " + std::to_string(manifest.layers.size()) + " layers");
  }
  const std::string config_entry = config_desc.digest.hex() + ".json";
  if (!s.written.count(config_entry)) {
    if (auto ast = s.tar->AddFile(config_entry, config); !ast) return ast;
    s.written.insert(config_entry);
    s.bytes_out += config.size();
  }
  nlohmann::json layers = nlohmann::json::array();
  for (size_t i = 0; i < manifest.layers.size(); ++i) {
    auto entry = SaveLayer(s, image.value(), manifest.layers[i], diff_ids[i], text);
    if (!entry) return entry.error();
    layers.push_back(entry.value());
  }
  nlohmann::json tags = nlohmann::json::array();
  if (!image.value().digest && !image.value().tag.empty())
    tags.push_back(FamiliarName(image.value()) + ":" + image.value().tag);
  s.manifest.push_back({{"Config", config_entry},
                        {"RepoTags", tags.empty() ? nlohmann::json(nullptr) : tags},
                        {"Layers", layers}});
  row["layers"] = manifest.layers.size();
  return Ok();
}

int RunSave(const SaveFlags& flags) {
  auto agent = http::Url::Parse(flags.agent);
  if (!agent) {
    std::cerr << "shoalctl: --agent: " << agent.error().message << "\n";
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  fs::path out(flags.output);
  fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
  std::string tmp_path = (dir / ("." + out.filename().string() + ".shoal-XXXXXX")).string();
  int fd = ::mkstemp(tmp_path.data());
  if (fd < 0) {
    std::cerr << "shoalctl: cannot create a temp file beside " << flags.output << ": "
              << std::strerror(errno) << "\n";
    return 1;
  }
  char work_tmpl[] = "/tmp/shoalctl-save-XXXXXX";
  const char* work = ::mkdtemp(work_tmpl);
  SaveState s;
  s.shim = std::make_unique<AgentClient>(s.ioc, agent.value());
  TarWriter tar(fd, tmp_path);
  s.tar = &tar;
  s.tmp_dir = work ? work : "/tmp";
  s.tty = ::isatty(STDERR_FILENO) && !flags.json;

  nlohmann::json rows = nlohmann::json::array();
  std::optional<Error> failure;
  for (const auto& text : flags.images) {
    nlohmann::json row = {{"image", text}};
    Status st = SaveImage(s, text, flags.platform, row);
    if (s.tty) std::fprintf(stderr, "\r\033[K");
    row["ok"] = st.has_value();
    if (!st) {
      row["error"] = st.error().ToString();
      failure = st.error();
      rows.push_back(row);
      break;  // one failed image fails the archive
    }
    rows.push_back(row);
    if (!flags.json) {
      std::printf("%-50s ok    %s layers  %s\n", text.c_str(), row["layers"].dump().c_str(),
                  row["digest"].get<std::string>().c_str());
    }
  }
  if (!failure) {
    Status st = tar.AddFile("manifest.json", s.manifest.dump());
    if (st) st = tar.Finish();
    if (st && ::fsync(fd) != 0)
      st = MakeError(ErrorCode::kIo, "fsync " + tmp_path + ": " + std::strerror(errno));
    if (st && ::rename(tmp_path.c_str(), flags.output.c_str()) != 0) {
      st = MakeError(ErrorCode::kIo, "rename to " + flags.output + ": " + std::strerror(errno));
    }
    if (!st) failure = st.error();
  }
  ::close(fd);
  if (failure) ::unlink(tmp_path.c_str());
  if (work) fs::remove_all(work);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (flags.json) {
    nlohmann::json result = {{"ok", !failure},         {"output", flags.output},
                             {"images", rows},         {"seconds", secs},
                             {"blob_bytes", s.bytes_in}, {"archive_bytes", s.bytes_out}};
    if (failure) result["error"] = failure->ToString();
    std::cout << result.dump(2) << "\n";
  } else if (failure) {
    std::cerr << "shoalctl save: " << failure->ToString() << " (no archive written)\n";
  } else {
    std::printf("wrote %s: %zu images, %s of layers and configs in %.2fs\n", flags.output.c_str(),
                flags.images.size(), Human(static_cast<double>(s.bytes_out)).c_str(), secs);
  }
  return failure ? 1 : 0;
}

}  // namespace

void AddSaveCommand(CLI::App& app) {
  auto flags = std::make_shared<SaveFlags>();
  CLI::App* cmd = app.add_subcommand(
      "save",
      "Write images from this node's agent into a docker-archive (docker save format) for "
      "`docker load`");
  cmd->add_option("images", flags->images, "Image references, e.g. registry.k8s.io/pause:3.9")
      ->required();
  cmd->add_option("-o,--output", flags->output, "The archive to write (replaced atomically)")
      ->required();
  cmd->add_option("--agent", flags->agent, "The node agent's registry shim URL")
      ->envname("SHOAL_AGENT_URL")
      ->capture_default_str();
  cmd->add_option("--platform", flags->platform, "os/arch to choose from multi-arch images")
      ->envname("SHOAL_PLATFORM")
      ->capture_default_str();
  cmd->add_flag("--json", flags->json, "Print the result as JSON");
  cmd->callback([flags] { throw CLI::RuntimeError(RunSave(*flags)); });
}

}  // namespace shoal::ctl
