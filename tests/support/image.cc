#include "tests/support/image.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>

#include <archive.h>
#include <archive_entry.h>
#include <isa-l/igzip_lib.h>
#include <zstd.h>

#include <nlohmann/json.hpp>

#include "lib/core/sha256.h"
#include "tests/support/process.h"

namespace shoal::testkit {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kOciManifest[] = "application/vnd.oci.image.manifest.v1+json";
constexpr char kOciIndex[] = "application/vnd.oci.image.index.v1+json";
constexpr char kOciConfig[] = "application/vnd.oci.image.config.v1+json";
constexpr char kRefName[] = "org.opencontainers.image.ref.name";
constexpr time_t kMtime = 1704067200;  // 2024-01-01T00:00:00Z, fixed for reproducibility
constexpr char kCreated[] = "2024-01-01T00:00:00Z";

std::string ErrnoText() { return std::strerror(errno); }

std::string BlobDir(const std::string& layout) { return layout + "/blobs/sha256"; }
std::string BlobPath(const std::string& layout, const Digest& d) {
  return BlobDir(layout) + "/" + d.hex();
}

const char* LayerMediaType(Compression c) {
  switch (c) {
    case Compression::kNone:
      return "application/vnd.oci.image.layer.v1.tar";
    case Compression::kGzip:
      return "application/vnd.oci.image.layer.v1.tar+gzip";
    case Compression::kZstd:
      return "application/vnd.oci.image.layer.v1.tar+zstd";
  }
  return "";
}

// xorshift64*: cheap pseudo-random bytes (GB/s), deterministic per seed.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull) {
    if (s_ == 0) s_ = 1;
  }
  uint64_t Next() {
    s_ ^= s_ >> 12;
    s_ ^= s_ << 25;
    s_ ^= s_ >> 27;
    return s_ * 0x2545F4914F6CDD1Dull;
  }

 private:
  uint64_t s_;
};

// File content: 32 KiB random, 32 KiB zeros, repeating, so gzip halves it quickly.
constexpr uint64_t kHalfBlock = 32 * 1024;
void FillContent(Rng& rng, uint64_t offset, char* out, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint64_t pos = offset + i;
    size_t run = std::min<uint64_t>(n - i, kHalfBlock - pos % kHalfBlock);
    if ((pos / kHalfBlock) % 2 == 1) {
      std::memset(out + i, 0, run);
    } else {
      size_t j = 0;
      for (; j + 8 <= run; j += 8) {
        uint64_t v = rng.Next();
        std::memcpy(out + i + j, &v, 8);
      }
      for (; j < run; ++j) out[i + j] = static_cast<char>(rng.Next());
    }
    i += run;
  }
}

// Writes a blob into <layout>/blobs/sha256 as it streams: hashes the stored (compressed) bytes,
// then renames the temp file to its digest.
class BlobSink {
 public:
  explicit BlobSink(const std::string& layout) : layout_(layout) {
    tmp_path_ = BlobDir(layout) + "/.tmp-XXXXXX";
    fd_ = mkstemp(tmp_path_.data());
  }
  ~BlobSink() {
    if (fd_ >= 0) {
      close(fd_);
      unlink(tmp_path_.c_str());
    }
  }
  bool ok() const { return fd_ >= 0 && error_.empty(); }
  const std::string& error() const { return error_; }

  void Write(const void* data, size_t n) {
    if (!ok()) return;
    hash_.Update(data, n);
    size_ += n;
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        error_ = "write " + tmp_path_ + ": " + ErrnoText();
        return;
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  }

  // Closes, names the file by its digest. Returns the digest and size.
  Result<std::pair<Digest, uint64_t>> Finish() {
    if (fd_ < 0) return MakeError(ErrorCode::kIo, "mkstemp " + tmp_path_ + ": " + ErrnoText());
    if (!error_.empty()) return MakeError(ErrorCode::kIo, error_);
    close(fd_);
    fd_ = -1;
    Digest d = hash_.Final();
    std::string final_path = BlobPath(layout_, d);
    if (::rename(tmp_path_.c_str(), final_path.c_str()) != 0) {
      return MakeError(ErrorCode::kIo,
                       "rename " + tmp_path_ + " to " + final_path + ": " + ErrnoText());
    }
    return std::make_pair(d, size_);
  }

 private:
  std::string layout_;
  std::string tmp_path_;
  int fd_ = -1;
  Sha256 hash_;
  uint64_t size_ = 0;
  std::string error_;
};

Result<std::pair<Digest, uint64_t>> WriteBlob(const std::string& layout, const std::string& data) {
  BlobSink sink(layout);
  sink.Write(data.data(), data.size());
  return sink.Finish();
}

// Receives the uncompressed tar from libarchive: hashes it (the diff_id) and compresses it into
// the blob sink. gzip uses ISA-L (level 1, several times faster than zlib), zstd uses libzstd
// level 1; both are deterministic.
class LayerStream {
 public:
  LayerStream(Compression c, BlobSink& sink) : compression_(c), sink_(sink), out_(1 << 20) {
    if (c == Compression::kGzip) {
      isal_deflate_init(&gz_);
      level_buf_.resize(ISAL_DEF_LVL1_DEFAULT);
      gz_.level = 1;
      gz_.level_buf = level_buf_.data();
      gz_.level_buf_size = static_cast<uint32_t>(level_buf_.size());
      gz_.gzip_flag = IGZIP_GZIP;
      gz_.end_of_stream = 0;
      gz_.flush = NO_FLUSH;
    } else if (c == Compression::kZstd) {
      zs_ = ZSTD_createCCtx();
      ZSTD_CCtx_setParameter(zs_, ZSTD_c_compressionLevel, 1);
      ZSTD_CCtx_setParameter(zs_, ZSTD_c_checksumFlag, 1);
    }
  }
  ~LayerStream() {
    if (zs_) ZSTD_freeCCtx(zs_);
  }
  const std::string& error() const { return error_; }

  void Write(const void* data, size_t n) {
    diff_hash_.Update(data, n);
    Compress(data, n, false);
  }
  void End() { Compress(nullptr, 0, true); }
  Digest DiffId() { return diff_hash_.Final(); }

 private:
  void Compress(const void* data, size_t n, bool end) {
    if (!error_.empty()) return;
    switch (compression_) {
      case Compression::kNone:
        if (n) sink_.Write(data, n);
        return;
      case Compression::kGzip: {
        gz_.next_in = static_cast<uint8_t*>(const_cast<void*>(data));
        gz_.avail_in = static_cast<uint32_t>(n);
        gz_.end_of_stream = end ? 1 : 0;
        for (;;) {
          gz_.next_out = out_.data();
          gz_.avail_out = static_cast<uint32_t>(out_.size());
          if (isal_deflate(&gz_) != COMP_OK) {
            error_ = "isal_deflate failed";
            return;
          }
          sink_.Write(out_.data(), out_.size() - gz_.avail_out);
          if (end) {
            if (gz_.internal_state.state == ZSTATE_END) return;
          } else if (gz_.avail_in == 0 && gz_.avail_out != 0) {
            return;
          }
        }
      }
      case Compression::kZstd: {
        ZSTD_inBuffer in{data, n, 0};
        for (;;) {
          ZSTD_outBuffer out{out_.data(), out_.size(), 0};
          size_t rc = ZSTD_compressStream2(zs_, &out, &in, end ? ZSTD_e_end : ZSTD_e_continue);
          if (ZSTD_isError(rc)) {
            error_ = std::string("zstd: ") + ZSTD_getErrorName(rc);
            return;
          }
          sink_.Write(out_.data(), out.pos);
          if (end ? rc == 0 : (in.pos == in.size && out.pos < out.size)) return;
        }
      }
    }
  }

  Compression compression_;
  BlobSink& sink_;
  std::vector<uint8_t> out_;
  Sha256 diff_hash_;
  isal_zstream gz_{};
  std::vector<uint8_t> level_buf_;
  ZSTD_CCtx* zs_ = nullptr;
  std::string error_;
};

la_ssize_t ArchiveWrite(struct archive*, void* client, const void* buf, size_t n) {
  static_cast<LayerStream*>(client)->Write(buf, n);
  return static_cast<la_ssize_t>(n);
}

struct LayerResult {
  Digest digest = NullDigest();
  uint64_t size = 0;
  Digest diff_id = NullDigest();
};

// Writes one entry (and its data, generated from `content_seed`) to the archive.
class TarBuilder {
 public:
  explicit TarBuilder(struct archive* a) : a_(a), buf_(1 << 20) {}
  const std::string& error() const { return error_; }

  void Dir(const std::string& path) { Entry(path, AE_IFDIR, 0755, 0, "", ""); }
  void File(const std::string& path, uint64_t size, uint64_t content_seed) {
    if (!Entry(path, AE_IFREG, 0644, size, "", "")) return;
    Rng rng(content_seed);
    uint64_t off = 0;
    while (off < size) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(buf_.size(), size - off));
      FillContent(rng, off, buf_.data(), n);
      if (archive_write_data(a_, buf_.data(), n) != static_cast<la_ssize_t>(n)) {
        error_ = std::string("archive_write_data ") + path + ": " + archive_error_string(a_);
        return;
      }
      off += n;
    }
  }
  void Text(const std::string& path, const std::string& text) {
    if (!Entry(path, AE_IFREG, 0644, text.size(), "", "")) return;
    archive_write_data(a_, text.data(), text.size());
  }
  void Symlink(const std::string& path, const std::string& target) {
    Entry(path, AE_IFLNK, 0777, 0, target, "");
  }
  void Hardlink(const std::string& path, const std::string& target) {
    Entry(path, AE_IFREG, 0644, 0, "", target);
  }

 private:
  bool Entry(const std::string& path, unsigned type, int mode, uint64_t size,
             const std::string& symlink, const std::string& hardlink) {
    if (!error_.empty()) return false;
    struct archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, path.c_str());
    archive_entry_set_filetype(e, type);
    archive_entry_set_perm(e, mode);
    archive_entry_set_uid(e, 0);
    archive_entry_set_gid(e, 0);
    archive_entry_set_uname(e, "root");
    archive_entry_set_gname(e, "root");
    archive_entry_set_mtime(e, kMtime, 0);
    archive_entry_set_size(e, static_cast<la_int64_t>(size));
    if (!symlink.empty()) archive_entry_set_symlink(e, symlink.c_str());
    if (!hardlink.empty()) archive_entry_set_hardlink(e, hardlink.c_str());
    int rc = archive_write_header(a_, e);
    archive_entry_free(e);
    if (rc != ARCHIVE_OK) {
      error_ = "archive_write_header " + path + ": " + archive_error_string(a_);
      return false;
    }
    return true;
  }

  struct archive* a_;
  std::vector<char> buf_;
  std::string error_;
};

// Parent directories of `path` ("a/b/c" -> "a/", "a/b/"), in order.
void AddParents(const std::string& path, std::set<std::string>& dirs) {
  for (size_t i = path.find('/'); i != std::string::npos; i = path.find('/', i + 1)) {
    dirs.insert(path.substr(0, i));
  }
}

Result<LayerResult> BuildLayer(const LayerSpec& spec, const std::string& layout) {
  Rng names(spec.seed);
  struct FileItem {
    std::string path;
    uint64_t size;
    uint64_t seed;
  };
  std::vector<FileItem> files;
  std::string tag = std::to_string(spec.seed);
  for (int i = 0; i < spec.small_files; ++i) {
    uint64_t r = names.Next();
    std::string path = "data/d" + std::to_string(i % 4) + "/sub" + std::to_string(i % 3) +
                       "/file-" + tag + "-" + std::to_string(i) + ".bin";
    uint64_t size = 256 + r % (64 * 1024 - 256);
    files.push_back({path, size, spec.seed * 1000003 + static_cast<uint64_t>(i)});
  }
  for (size_t i = 0; i < spec.big_files.size(); ++i) {
    files.push_back({"big/blob-" + tag + "-" + std::to_string(i) + ".bin", spec.big_files[i],
                     spec.seed * 7919 + 1000000 + i});
  }
  std::set<std::string> dirs = {"etc"};
  for (const auto& f : files) AddParents(f.path, dirs);
  if (spec.with_symlink_and_hardlink) dirs.insert("links");
  if (spec.with_whiteout) dirs.insert("opaque");

  BlobSink sink(layout);
  LayerStream stream(spec.compression, sink);
  struct archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  archive_write_set_bytes_in_last_block(a, 1);
  if (archive_write_open2(a, &stream, nullptr, ArchiveWrite, nullptr, nullptr) != ARCHIVE_OK) {
    std::string err = archive_error_string(a);
    archive_write_free(a);
    return MakeError(ErrorCode::kInternal, "archive_write_open: " + err);
  }
  TarBuilder tar(a);
  for (const auto& d : dirs) tar.Dir(d);
  tar.Text("etc/shoal-layer-" + tag, "shoal testkit layer, seed " + tag + "\n");
  for (const auto& f : files) tar.File(f.path, f.size, f.seed);
  if (spec.with_symlink_and_hardlink) {
    std::string target = files.empty() ? "etc/shoal-layer-" + tag : files.front().path;
    tar.Symlink("links/symlink-" + tag, "../" + target);
    tar.Hardlink("links/hardlink-" + tag, target);
  }
  if (spec.with_whiteout) {
    tar.Text(".wh.removed-" + tag, "");
    tar.Text("opaque/.wh..wh..opq", "");
    tar.Text("opaque/kept-" + tag, "kept\n");
  }
  int rc = archive_write_close(a);
  std::string archive_err = rc == ARCHIVE_OK ? "" : archive_error_string(a);
  archive_write_free(a);
  if (!tar.error().empty()) return MakeError(ErrorCode::kInternal, tar.error());
  if (!archive_err.empty()) return MakeError(ErrorCode::kInternal, "archive close: " + archive_err);
  stream.End();
  if (!stream.error().empty()) return MakeError(ErrorCode::kInternal, stream.error());
  auto blob = sink.Finish();
  if (!blob) return blob.error();
  LayerResult out;
  out.digest = blob.value().first;
  out.size = blob.value().second;
  out.diff_id = stream.DiffId();
  return out;
}

Status EnsureLayout(const std::string& layout) {
  std::error_code ec;
  fs::create_directories(BlobDir(layout), ec);
  if (ec) return MakeError(ErrorCode::kIo, "mkdir " + BlobDir(layout) + ": " + ec.message());
  try {
    WriteFile(layout + "/oci-layout", R"({"imageLayoutVersion":"1.0.0"})");
  } catch (const std::exception& e) {
    return MakeError(ErrorCode::kIo, e.what());
  }
  return Ok();
}

// Points `tag` in index.json at the descriptor, keeping other tags.
Status TagInIndex(const std::string& layout, const std::string& tag, json descriptor) {
  std::string path = layout + "/index.json";
  json index = {{"schemaVersion", 2}, {"mediaType", kOciIndex}, {"manifests", json::array()}};
  std::string existing = ReadFile(path);
  if (!existing.empty()) {
    auto parsed = json::parse(existing, nullptr, false);
    if (!parsed.is_discarded() && parsed.contains("manifests")) index = parsed;
  }
  json kept = json::array();
  for (const auto& m : index["manifests"]) {
    bool same = m.contains("annotations") && m["annotations"].value(kRefName, "") == tag;
    if (!same) kept.push_back(m);
  }
  descriptor["annotations"] = {{kRefName, tag}};
  kept.push_back(descriptor);
  index["manifests"] = kept;
  try {
    WriteFile(path, index.dump());
  } catch (const std::exception& e) {
    return MakeError(ErrorCode::kIo, e.what());
  }
  return Ok();
}

// Builds the image's blobs and manifest (untagged).
Result<BuiltImage> BuildUntagged(const ImageSpec& spec, const std::string& layout) {
  BuiltImage img;
  img.layout_dir = layout;
  json layers = json::array();
  json history = json::array();
  json diff_ids = json::array();
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    auto layer = BuildLayer(spec.layers[i], layout);
    if (!layer) return layer.error();
    const LayerResult& l = layer.value();
    img.layer_digests.push_back(l.digest);
    img.layer_sizes.push_back(l.size);
    img.diff_ids.push_back(l.diff_id);
    img.total_blob_bytes += l.size;
    layers.push_back({{"mediaType", LayerMediaType(spec.layers[i].compression)},
                      {"digest", l.digest.str()},
                      {"size", l.size}});
    diff_ids.push_back(l.diff_id.str());
    history.push_back(
        {{"created", kCreated},
         {"created_by", "shoal testkit layer seed " + std::to_string(spec.layers[i].seed)}});
  }
  json config = {
      {"architecture", spec.architecture},
      {"os", spec.os},
      {"created", kCreated},
      {"config",
       {{"Env", {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}},
        {"Cmd", {"/bin/sh"}}}},
      {"rootfs", {{"type", "layers"}, {"diff_ids", diff_ids}}},
      {"history", history},
  };
  auto cfg = WriteBlob(layout, config.dump());
  if (!cfg) return cfg.error();
  img.config_digest = cfg.value().first;
  img.total_blob_bytes += cfg.value().second;
  json manifest = {
      {"schemaVersion", 2},
      {"mediaType", kOciManifest},
      {"config",
       {{"mediaType", kOciConfig},
        {"digest", img.config_digest.str()},
        {"size", cfg.value().second}}},
      {"layers", layers},
  };
  img.manifest_json = manifest.dump();
  img.media_type = kOciManifest;
  auto m = WriteBlob(layout, img.manifest_json);
  if (!m) return m.error();
  img.manifest_digest = m.value().first;
  return img;
}

json Descriptor(const BuiltImage& img) {
  return {{"mediaType", img.media_type},
          {"digest", img.manifest_digest.str()},
          {"size", img.manifest_json.size()}};
}

// Isolated skopeo configuration: no registries.conf mirrors, no credentials from the host.
const TempDir& SkopeoConfigDir() {
  static TempDir dir("shoal-skopeo");
  static bool written = [] {
    WriteFile(dir.Sub("registries.conf"), "");
    WriteFile(dir.Sub("auth.json"), "{}");
    return true;
  }();
  (void)written;
  return dir;
}

}  // namespace

Result<BuiltImage> BuildImage(const ImageSpec& spec, const std::string& layout_dir,
                              const std::string& tag) {
  if (auto st = EnsureLayout(layout_dir); !st) return st.error();
  auto img = BuildUntagged(spec, layout_dir);
  if (!img) return img.error();
  img.value().tag = tag;
  if (auto st = TagInIndex(layout_dir, tag, Descriptor(img.value())); !st) return st.error();
  return img;
}

Result<BuiltImage> BuildIndex(const std::vector<ImageSpec>& platforms,
                              const std::string& layout_dir, const std::string& tag) {
  if (platforms.empty()) return MakeError(ErrorCode::kInvalidArgument, "BuildIndex: no platforms");
  if (auto st = EnsureLayout(layout_dir); !st) return st.error();
  BuiltImage out;
  out.layout_dir = layout_dir;
  out.tag = tag;
  json manifests = json::array();
  for (const auto& spec : platforms) {
    auto img = BuildUntagged(spec, layout_dir);
    if (!img) return img.error();
    BuiltImage& p = img.value();
    json d = Descriptor(p);
    d["platform"] = {{"architecture", spec.architecture}, {"os", spec.os}};
    manifests.push_back(d);
    out.layer_digests.insert(out.layer_digests.end(), p.layer_digests.begin(),
                             p.layer_digests.end());
    out.layer_sizes.insert(out.layer_sizes.end(), p.layer_sizes.begin(), p.layer_sizes.end());
    out.diff_ids.insert(out.diff_ids.end(), p.diff_ids.begin(), p.diff_ids.end());
    out.total_blob_bytes += p.total_blob_bytes;
    out.platforms.push_back(std::move(p));
  }
  out.config_digest = out.platforms.front().config_digest;
  json index = {{"schemaVersion", 2}, {"mediaType", kOciIndex}, {"manifests", manifests}};
  out.manifest_json = index.dump();
  out.media_type = kOciIndex;
  auto blob = WriteBlob(layout_dir, out.manifest_json);
  if (!blob) return blob.error();
  out.manifest_digest = blob.value().first;
  if (auto st = TagInIndex(layout_dir, tag, Descriptor(out)); !st) return st.error();
  return out;
}

std::vector<ImageSpec> DefaultMultiArchSpecs() {
  ImageSpec amd64;
  amd64.architecture = "amd64";
  amd64.layers = {LayerSpec{.compression = Compression::kGzip, .small_files = 8, .seed = 101},
                  LayerSpec{.compression = Compression::kGzip, .small_files = 4, .seed = 102}};
  ImageSpec arm64;
  arm64.architecture = "arm64";
  arm64.layers = {LayerSpec{.compression = Compression::kGzip, .small_files = 8, .seed = 201},
                  LayerSpec{.compression = Compression::kZstd, .small_files = 4, .seed = 202}};
  return {amd64, arm64};
}

Result<LayoutImage> ReadLayout(const std::string& layout_dir, const std::string& tag) {
  std::string index_path = layout_dir + "/index.json";
  std::string text = ReadFile(index_path);
  if (text.empty()) return MakeError(ErrorCode::kIo, "cannot read " + index_path);
  json index = json::parse(text, nullptr, false);
  if (index.is_discarded() || !index.contains("manifests") || !index["manifests"].is_array()) {
    return MakeError(ErrorCode::kProtocol, "malformed " + index_path);
  }
  const json* entry = nullptr;
  for (const auto& m : index["manifests"]) {
    if (m.contains("annotations") && m["annotations"].value(kRefName, "") == tag) entry = &m;
  }
  if (!entry) return MakeError(ErrorCode::kNotFound, "tag " + tag + " not in " + index_path);
  auto digest = Digest::Parse(entry->value("digest", ""));
  if (!digest) return digest.error();
  LayoutImage out;
  out.manifest_digest = digest.value();
  out.manifest_json = ReadFile(BlobPath(layout_dir, out.manifest_digest));
  if (out.manifest_json.empty()) {
    return MakeError(ErrorCode::kIo, "cannot read " + BlobPath(layout_dir, out.manifest_digest));
  }
  json m = json::parse(out.manifest_json, nullptr, false);
  if (m.is_discarded() || !m.is_object()) {
    return MakeError(ErrorCode::kProtocol, "malformed manifest " + out.manifest_digest.str());
  }
  out.media_type = m.value("mediaType", entry->value("mediaType", ""));
  try {
    if (m.contains("manifests")) {
      for (const auto& c : m["manifests"]) {
        auto d = Digest::Parse(c.at("digest").get<std::string>());
        if (!d) return d.error();
        out.child_manifests.push_back(d.value());
      }
    } else {
      auto c = Digest::Parse(m.at("config").at("digest").get<std::string>());
      if (!c) return c.error();
      out.config_digest = c.value();
      for (const auto& l : m.at("layers")) {
        auto d = Digest::Parse(l.at("digest").get<std::string>());
        if (!d) return d.error();
        out.layer_digests.push_back(d.value());
      }
    }
  } catch (const json::exception& e) {
    return MakeError(ErrorCode::kProtocol,
                     "manifest " + out.manifest_digest.str() + ": " + e.what());
  }
  return out;
}

Result<std::vector<Digest>> LayoutBlobDigests(const std::string& layout_dir) {
  std::vector<Digest> out;
  std::error_code ec;
  fs::directory_iterator it(BlobDir(layout_dir), ec);
  if (ec) return MakeError(ErrorCode::kIo, "list " + BlobDir(layout_dir) + ": " + ec.message());
  for (const auto& entry : it) {
    if (!entry.is_regular_file()) continue;
    std::string name = entry.path().filename().string();
    auto want = Digest::Parse("sha256:" + name);
    if (!want) {
      return MakeError(ErrorCode::kDigestMismatch,
                       "blob file name is not a digest: " + entry.path().string());
    }
    auto got = Sha256File(entry.path().string());
    if (!got) return got.error();
    if (got.value() != want.value()) {
      return MakeError(ErrorCode::kDigestMismatch,
                       "blob " + entry.path().string() + " hashes to " + got.value().str());
    }
    out.push_back(want.value());
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<std::string> Skopeo(std::vector<std::string> args, std::chrono::seconds timeout,
                           std::vector<std::string> extra_env) {
  const TempDir& cfg = SkopeoConfigDir();
  std::vector<std::string> argv = {"skopeo", "--insecure-policy"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<std::string> env = {"CONTAINERS_REGISTRIES_CONF=" + cfg.Sub("registries.conf"),
                                  "REGISTRY_AUTH_FILE=" + cfg.Sub("auth.json")};
  for (auto& e : extra_env) {
    std::string key = e.substr(0, e.find('=') + 1);
    std::erase_if(env, [&](const std::string& x) { return x.rfind(key, 0) == 0; });
    env.push_back(std::move(e));
  }
  return RunCommand(std::move(argv), timeout, std::move(env));
}

Result<LayoutImage> SkopeoCopyToLayout(const std::string& src_docker_ref,
                                       const std::string& out_dir,
                                       std::vector<std::string> extra_args,
                                       const std::string& tag) {
  std::vector<std::string> args = {"copy",
                                   "--all",
                                   "--quiet",
                                   "--src-tls-verify=false",
                                   "--preserve-digests",
                                   "--dest-oci-accept-uncompressed-layers"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  args.push_back("docker://" + src_docker_ref);
  args.push_back("oci:" + out_dir + ":" + tag);
  auto out = Skopeo(std::move(args));
  if (!out) return out.error();
  auto blobs = LayoutBlobDigests(out_dir);
  if (!blobs) return blobs.error();
  return ReadLayout(out_dir, tag);
}

}  // namespace shoal::testkit
