#include "tests/support/layer_tar.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <archive.h>
#include <archive_entry.h>
#include <isa-l/igzip_lib.h>
#include <zstd.h>

#include <nlohmann/json.hpp>

#include "lib/core/sha256.h"
#include "tests/support/process.h"

namespace shoal::testkit {
namespace {

using json = nlohmann::json;

la_ssize_t AppendToString(struct archive*, void* client, const void* buf, size_t n) {
  static_cast<std::string*>(client)->append(static_cast<const char*>(buf), n);
  return static_cast<la_ssize_t>(n);
}

std::string GzipMember(const char* data, size_t n) {
  isal_zstream z;
  isal_deflate_init(&z);
  std::vector<uint8_t> level_buf(ISAL_DEF_LVL1_DEFAULT);
  z.level = 1;
  z.level_buf = level_buf.data();
  z.level_buf_size = static_cast<uint32_t>(level_buf.size());
  z.gzip_flag = IGZIP_GZIP;
  z.end_of_stream = 1;
  z.flush = NO_FLUSH;
  z.next_in = reinterpret_cast<uint8_t*>(const_cast<char*>(data));
  z.avail_in = static_cast<uint32_t>(n);
  std::string out;
  std::vector<uint8_t> buf(1 << 20);
  do {
    z.next_out = buf.data();
    z.avail_out = static_cast<uint32_t>(buf.size());
    if (isal_deflate(&z) != COMP_OK) throw std::runtime_error("isal_deflate failed");
    out.append(reinterpret_cast<char*>(buf.data()), buf.size() - z.avail_out);
  } while (z.internal_state.state != ZSTATE_END);
  return out;
}

const char* MediaType(Compression c) {
  switch (c) {
    case Compression::kNone: return "application/vnd.oci.image.layer.v1.tar";
    case Compression::kGzip: return "application/vnd.oci.image.layer.v1.tar+gzip";
    case Compression::kZstd: return "application/vnd.oci.image.layer.v1.tar+zstd";
  }
  return "";
}

Digest WriteBlob(const std::string& layout, const std::string& bytes) {
  Digest d = Sha256::Of(bytes);
  WriteFile(layout + "/blobs/sha256/" + d.hex(), bytes);
  return d;
}

char TypeChar(mode_t m) {
  if (S_ISREG(m)) return 'f';
  if (S_ISDIR(m)) return 'd';
  if (S_ISLNK(m)) return 'l';
  if (S_ISCHR(m)) return 'c';
  if (S_ISBLK(m)) return 'b';
  if (S_ISFIFO(m)) return 'p';
  return '?';
}

std::map<std::string, std::string> ReadXattrs(const std::string& path) {
  std::map<std::string, std::string> out;
  ssize_t n = ::llistxattr(path.c_str(), nullptr, 0);
  if (n <= 0) return out;
  std::string names(static_cast<size_t>(n), '\0');
  n = ::llistxattr(path.c_str(), names.data(), names.size());
  for (size_t i = 0; n > 0 && i < static_cast<size_t>(n);) {
    std::string key = names.c_str() + i;
    i += key.size() + 1;
    ssize_t vn = ::lgetxattr(path.c_str(), key.c_str(), nullptr, 0);
    std::string value(vn > 0 ? static_cast<size_t>(vn) : 0, '\0');
    if (vn > 0) ::lgetxattr(path.c_str(), key.c_str(), value.data(), value.size());
    out[key] = value;
  }
  return out;
}

void Walk(const std::string& root, const std::string& rel, Tree& tree,
          std::map<std::pair<dev_t, ino_t>, std::string>& inodes) {
  std::string dir = rel.empty() ? root : root + "/" + rel;
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    std::string r = rel.empty() ? name : rel + "/" + name;
    std::string full = root + "/" + r;
    struct stat st {};
    if (::lstat(full.c_str(), &st) != 0) throw std::runtime_error("lstat " + full);
    NodeInfo n;
    n.type = TypeChar(st.st_mode);
    n.mode = st.st_mode & 07777;
    n.uid = st.st_uid;
    n.gid = st.st_gid;
    n.mtime = st.st_mtim.tv_sec;
    n.xattrs = ReadXattrs(full);
    if (n.type == 'f') {
      n.size = static_cast<uint64_t>(st.st_size);
      auto sha = Sha256File(full);
      if (!sha) throw std::runtime_error(sha.error().ToString());
      n.content_sha = sha.value().hex();
      if (st.st_nlink > 1) {
        auto [it, fresh] = inodes.try_emplace({st.st_dev, st.st_ino}, r);
        n.hardlink_group = it->second;
      }
    } else if (n.type == 'l') {
      std::string target(4096, '\0');
      ssize_t len = ::readlink(full.c_str(), target.data(), target.size());
      target.resize(len > 0 ? static_cast<size_t>(len) : 0);
      n.link = target;
    } else if (n.type == 'c' || n.type == 'b') {
      n.rdev_major = major(st.st_rdev);
      n.rdev_minor = minor(st.st_rdev);
    }
    tree[r] = n;
    if (n.type == 'd') Walk(root, r, tree, inodes);
  }
}

bool Under(const std::string& path, const std::string& dir) {
  return dir.empty() || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         path[dir.size()] == '/');
}

std::string Parent(const std::string& p) {
  size_t s = p.rfind('/');
  return s == std::string::npos ? "" : p.substr(0, s);
}
std::string Base(const std::string& p) {
  size_t s = p.rfind('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

void EraseBelow(Tree& t, const std::string& dir) {
  for (auto it = t.begin(); it != t.end();) {
    if (Under(it->first, dir)) {
      it = t.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace

TarEntry FileEntry(std::string path, std::string data, int mode) {
  TarEntry e;
  e.path = std::move(path);
  e.data = std::move(data);
  e.mode = mode;
  return e;
}
TarEntry DirEntry(std::string path, int mode) {
  TarEntry e;
  e.path = std::move(path);
  e.type = TarEntry::Type::kDir;
  e.mode = mode;
  return e;
}
TarEntry SymlinkEntry(std::string path, std::string target) {
  TarEntry e;
  e.path = std::move(path);
  e.type = TarEntry::Type::kSymlink;
  e.link = std::move(target);
  e.mode = 0777;
  return e;
}
TarEntry HardlinkEntry(std::string path, std::string target) {
  TarEntry e;
  e.path = std::move(path);
  e.type = TarEntry::Type::kHardlink;
  e.link = std::move(target);
  return e;
}

std::string BuildTar(const std::vector<TarEntry>& entries) {
  std::string out;
  struct archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  archive_write_set_bytes_in_last_block(a, 1);
  if (archive_write_open2(a, &out, nullptr, AppendToString, nullptr, nullptr) != ARCHIVE_OK) {
    archive_write_free(a);
    throw std::runtime_error("archive_write_open2 failed");
  }
  for (const auto& t : entries) {
    struct archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, t.path.c_str());
    unsigned type = AE_IFREG;
    switch (t.type) {
      case TarEntry::Type::kFile: type = AE_IFREG; break;
      case TarEntry::Type::kDir: type = AE_IFDIR; break;
      case TarEntry::Type::kSymlink: type = AE_IFLNK; break;
      case TarEntry::Type::kHardlink: type = AE_IFREG; break;
      case TarEntry::Type::kChar: type = AE_IFCHR; break;
      case TarEntry::Type::kBlock: type = AE_IFBLK; break;
      case TarEntry::Type::kFifo: type = AE_IFIFO; break;
    }
    archive_entry_set_filetype(e, type);
    archive_entry_set_perm(e, static_cast<mode_t>(t.mode));
    archive_entry_set_uid(e, t.uid);
    archive_entry_set_gid(e, t.gid);
    archive_entry_set_mtime(e, t.mtime, 0);
    if (t.type == TarEntry::Type::kSymlink) archive_entry_set_symlink(e, t.link.c_str());
    if (t.type == TarEntry::Type::kHardlink) archive_entry_set_hardlink(e, t.link.c_str());
    if (t.type == TarEntry::Type::kChar || t.type == TarEntry::Type::kBlock) {
      archive_entry_set_rdevmajor(e, t.dev_major);
      archive_entry_set_rdevminor(e, t.dev_minor);
    }
    for (const auto& [k, v] : t.xattrs) {
      archive_entry_xattr_add_entry(e, k.c_str(), v.data(), v.size());
    }
    archive_entry_set_size(e, t.type == TarEntry::Type::kFile
                                  ? static_cast<la_int64_t>(t.data.size())
                                  : 0);
    if (archive_write_header(a, e) != ARCHIVE_OK) {
      std::string err = archive_error_string(a);
      archive_entry_free(e);
      archive_write_free(a);
      throw std::runtime_error("archive_write_header " + t.path + ": " + err);
    }
    archive_entry_free(e);
    if (t.type == TarEntry::Type::kFile && !t.data.empty()) {
      archive_write_data(a, t.data.data(), t.data.size());
    }
  }
  archive_write_close(a);
  archive_write_free(a);
  return out;
}

std::string Compress(const std::string& data, Compression c, int members) {
  switch (c) {
    case Compression::kNone:
      return data;
    case Compression::kGzip: {
      std::string out;
      size_t part = data.size() / static_cast<size_t>(std::max(members, 1)) + 1;
      size_t off = 0;
      for (int m = 0; m < members; ++m) {
        size_t n = std::min(part, data.size() - off);
        out += GzipMember(data.data() + off, n);
        off += n;
      }
      return out;
    }
    case Compression::kZstd: {
      std::string out(ZSTD_compressBound(data.size()), '\0');
      // With the content checksum (as `zstd` writes by default), so corruption is always detected.
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, 3);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  size_t n = ZSTD_compress2(cctx, out.data(), out.size(), data.data(), data.size());
  ZSTD_freeCCtx(cctx);
      if (ZSTD_isError(n)) throw std::runtime_error(ZSTD_getErrorName(n));
      out.resize(n);
      return out;
    }
  }
  return data;
}

Result<BuiltImage> WriteOciImage(const std::string& layout_dir, const std::string& tag,
                                 const std::vector<RawLayer>& layers) {
  try {
    std::filesystem::create_directories(layout_dir + "/blobs/sha256");
    WriteFile(layout_dir + "/oci-layout", R"({"imageLayoutVersion":"1.0.0"})");
    BuiltImage img;
    img.layout_dir = layout_dir;
    img.tag = tag;
    json jl = json::array();
    json diff_ids = json::array();
    for (const auto& l : layers) {
      std::string blob = Compress(l.tar, l.compression, l.gzip_members);
      Digest d = WriteBlob(layout_dir, blob);
      Digest diff = Sha256::Of(l.tar);
      img.layer_digests.push_back(d);
      img.layer_sizes.push_back(blob.size());
      img.diff_ids.push_back(diff);
      img.total_blob_bytes += blob.size();
      jl.push_back({{"mediaType", MediaType(l.compression)}, {"digest", d.str()},
                    {"size", blob.size()}});
      diff_ids.push_back(diff.str());
    }
    json config = {{"architecture", "amd64"},
                   {"os", "linux"},
                   {"config", json::object()},
                   {"rootfs", {{"type", "layers"}, {"diff_ids", diff_ids}}}};
    std::string cfg = config.dump();
    img.config_digest = WriteBlob(layout_dir, cfg);
    img.total_blob_bytes += cfg.size();
    json manifest = {{"schemaVersion", 2},
                     {"mediaType", "application/vnd.oci.image.manifest.v1+json"},
                     {"config",
                      {{"mediaType", "application/vnd.oci.image.config.v1+json"},
                       {"digest", img.config_digest.str()},
                       {"size", cfg.size()}}},
                     {"layers", jl}};
    img.manifest_json = manifest.dump();
    img.media_type = "application/vnd.oci.image.manifest.v1+json";
    img.manifest_digest = WriteBlob(layout_dir, img.manifest_json);
    json index = {{"schemaVersion", 2},
                  {"manifests",
                   {{{"mediaType", img.media_type},
                     {"digest", img.manifest_digest.str()},
                     {"size", img.manifest_json.size()},
                     {"annotations", {{"org.opencontainers.image.ref.name", tag}}}}}}};
    WriteFile(layout_dir + "/index.json", index.dump());
    return img;
  } catch (const std::exception& e) {
    return MakeError(ErrorCode::kIo, e.what());
  }
}

Tree SnapshotTree(const std::string& dir) {
  Tree t;
  std::map<std::pair<dev_t, ino_t>, std::string> inodes;
  Walk(dir, "", t, inodes);
  return t;
}

std::vector<std::string> DiffTrees(const Tree& a, const Tree& b, bool compare_dir_mtimes,
                                   bool compare_hardlinks) {
  std::vector<std::string> out;
  for (const auto& entry : a) {
    // Named references, not a structured binding: clang 14 cannot capture those in a lambda.
    const std::string& p = entry.first;
    const NodeInfo& n = entry.second;
    auto it = b.find(p);
    if (it == b.end()) {
      out.push_back("only in first: " + p);
      continue;
    }
    const NodeInfo& m = it->second;
    auto diff = [&](const std::string& what, const std::string& x, const std::string& y) {
      if (x != y) out.push_back(p + ": " + what + " " + x + " vs " + y);
    };
    diff("type", std::string(1, n.type), std::string(1, m.type));
    char ma[16], mb[16];
    std::snprintf(ma, sizeof ma, "0%o", n.mode);
    std::snprintf(mb, sizeof mb, "0%o", m.mode);
    if (n.type != 'l') diff("mode", ma, mb);
    diff("owner", std::to_string(n.uid) + ":" + std::to_string(n.gid),
         std::to_string(m.uid) + ":" + std::to_string(m.gid));
    diff("size", std::to_string(n.size), std::to_string(m.size));
    diff("content", n.content_sha, m.content_sha);
    diff("link", n.link, m.link);
    diff("rdev", std::to_string(n.rdev_major) + ":" + std::to_string(n.rdev_minor),
         std::to_string(m.rdev_major) + ":" + std::to_string(m.rdev_minor));
    if (n.type != 'd' || compare_dir_mtimes) {
      diff("mtime", std::to_string(n.mtime), std::to_string(m.mtime));
    }
    if (compare_hardlinks) diff("hardlink group", n.hardlink_group, m.hardlink_group);
    if (n.xattrs != m.xattrs) {
      std::string xa, xb;
      for (const auto& [k, v] : n.xattrs) xa += k + "=" + v + " ";
      for (const auto& [k, v] : m.xattrs) xb += k + "=" + v + " ";
      out.push_back(p + ": xattrs {" + xa + "} vs {" + xb + "}");
    }
  }
  for (const auto& [p, n] : b) {
    if (!a.count(p)) out.push_back("only in second: " + p);
  }
  return out;
}

Tree MergeLayers(const std::vector<Tree>& layers) {
  Tree merged;
  for (const Tree& layer : layers) {
    // Opaque directories first: they hide everything below them in lower layers.
    for (const auto& entry : layer) {
      const std::string& p = entry.first;
      const NodeInfo& n = entry.second;
      if (n.type != 'd') continue;
      auto opaque = [&](const char* key) {
        auto it = n.xattrs.find(key);
        return it != n.xattrs.end() && it->second == "y";
      };
      if (opaque("trusted.overlay.opaque") || opaque("user.overlay.opaque")) EraseBelow(merged, p);
    }
    for (const auto& [p, n] : layer) {
      std::string base = Base(p);
      bool dev_whiteout = n.type == 'c' && n.rdev_major == 0 && n.rdev_minor == 0;
      bool file_whiteout = n.type == 'f' && base.rfind(".wh.", 0) == 0;
      if (dev_whiteout || file_whiteout) {
        std::string hidden = dev_whiteout ? p : (Parent(p).empty() ? "" : Parent(p) + "/") +
                                                    base.substr(4);
        merged.erase(hidden);
        EraseBelow(merged, hidden);
        continue;
      }
      auto it = merged.find(p);
      if (it != merged.end() && (it->second.type != 'd' || n.type != 'd')) {
        EraseBelow(merged, p);
      }
      NodeInfo copy = n;
      std::erase_if(copy.xattrs, [](const auto& kv) {
        return kv.first.rfind("trusted.overlay.", 0) == 0 || kv.first.rfind("user.overlay.", 0) == 0;
      });
      copy.hardlink_group.clear();
      merged[p] = copy;
    }
  }
  return merged;
}

}  // namespace shoal::testkit
