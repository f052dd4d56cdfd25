#include "lib/extract/layer.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

#include "lib/core/sha256.h"

namespace shoal::extract {
namespace {

constexpr size_t kReadBuffer = 1 << 20;

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

int Openat2(int dirfd, const char* path, uint64_t flags) {
  struct open_how how {};
  how.flags = flags;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(::syscall(SYS_openat2, dirfd, path, &how, sizeof(how)));
}

// Whether openat2 works here (Linux >= 5.6 and not blocked by a seccomp filter).
bool Openat2Available() {
  static const bool available = [] {
    int fd = Openat2(AT_FDCWD, ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return false;
    ::close(fd);
    return true;
  }();
  return available;
}

// Hashes the raw bytes as the decoder pulls them, and counts them.
class HashingSource : public ByteSource {
 public:
  HashingSource(ByteSource& inner, bool hash) : inner_(inner), hash_(hash) {}
  Result<size_t> Read(std::span<std::byte> out) override {
    auto n = inner_.Read(out);
    if (n && n.value() > 0) {
      if (hash_) sha_.Update(out.data(), n.value());
      bytes_ += n.value();
    }
    return n;
  }
  std::string Describe() const override { return inner_.Describe(); }
  // Reads what the decoder left (tar padding, trailing blocks) so that the digest covers it all.
  Status Drain() {
    std::vector<std::byte> buf(256 * 1024);
    for (;;) {
      auto n = Read(buf);
      if (!n) return n.error();
      if (n.value() == 0) return Ok();
    }
  }
  Digest Final() { return sha_.Final(); }
  uint64_t bytes() const { return bytes_; }

 private:
  ByteSource& inner_;
  bool hash_;
  Sha256 sha_;
  uint64_t bytes_ = 0;
};

// libarchive's read callback state: decoded tar bytes come from the decoder.
struct ReadContext {
  Decoder* decoder = nullptr;
  std::vector<std::byte> buf = std::vector<std::byte>(kReadBuffer);
  std::optional<Error> error;  // the decoder's or source's failure, reported instead of libarchive's
  Sha256* tar_sha = nullptr;   // hashes the decoded bytes (the diff ID) when set
};

la_ssize_t ReadCallback(struct archive* a, void* client, const void** out) {
  auto* ctx = static_cast<ReadContext*>(client);
  auto n = ctx->decoder->Read(ctx->buf);
  if (!n) {
    ctx->error = n.error();
    archive_set_error(a, EIO, "%s", n.error().message.c_str());
    return -1;
  }
  if (ctx->tar_sha && n.value() > 0) ctx->tar_sha->Update(ctx->buf.data(), n.value());
  *out = ctx->buf.data();
  return static_cast<la_ssize_t>(n.value());
}

struct timespec Time(bool set, time_t sec, long nsec) {
  struct timespec ts {};
  if (set) {
    ts.tv_sec = sec;
    ts.tv_nsec = nsec;
  } else {
    ts.tv_nsec = UTIME_OMIT;
  }
  return ts;
}

// A directory's metadata, applied after all entries (writing children changes its mtime, and a
// read-only mode would block them).
struct DeferredDir {
  std::string rel;
  mode_t perm;
  struct timespec times[2];
};

// Writes entries beneath one root directory. Not thread-safe; one per layer.
class Writer {
 public:
  Writer(int root_fd, std::string root_path, std::string source, const ExtractOptions& options,
         bool privileged, WhiteoutMode whiteouts, bool openat2, LayerStats& stats)
      : root_fd_(root_fd),
        root_path_(std::move(root_path)),
        source_(std::move(source)),
        opt_(options),
        privileged_(privileged),
        whiteouts_(whiteouts),
        openat2_(openat2),
        stats_(stats) {}

  // Writes one entry (and its data, read from `a`).
  Status Entry(struct archive* a, struct archive_entry* e) {
    const char* raw = archive_entry_pathname(e);
    entry_ = raw ? raw : "";
    if (++stats_.entries > opt_.max_entries) {
      return Bad("more than " + std::to_string(opt_.max_entries) + " entries in the layer");
    }
    if (!raw) return Bad("entry without a path name (unconvertible characters?)");
    auto norm = NormalizeEntryPath(entry_, opt_.path_limits);
    if (!norm) return Bad(norm.error().message);
    const std::string& rel = norm.value();
    const mode_t type = archive_entry_filetype(e);
    const char* hardlink = archive_entry_hardlink(e);
    if (rel.empty()) {
      if (type != AE_IFDIR || hardlink) return Bad("entry replaces the layer root");
      DeferDir(rel, e);
      ++stats_.dirs;
      stats_.root_entry = true;
      return Ok();
    }
    auto [parent, name] = SplitParent(rel);
    if (StartsWith(name, ".wh.")) return Whiteout(e, parent, name);
    auto dir = ParentDir(parent);
    if (!dir) return dir.error();
    const int dirfd = dir.value();
    const std::string name_s(name);
    if (hardlink) return HardLink(dirfd, name_s, rel, hardlink);
    switch (type) {
      case AE_IFREG:
        return File(a, e, dirfd, name_s, rel);
      case AE_IFDIR:
        return Dir(e, dirfd, name_s, rel);
      case AE_IFLNK:
        return Symlink(e, dirfd, name_s, rel);
      case AE_IFCHR:
      case AE_IFBLK:
      case AE_IFIFO:
        return Special(e, dirfd, name_s, rel, type);
      default: {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "0%o", static_cast<unsigned>(type));
        return Bad(std::string("unsupported entry type ") + buf);
      }
    }
  }

  // Applies the deferred directory metadata, deepest first.
  Status Finish() {
    entry_.clear();
    std::stable_sort(deferred_.begin(), deferred_.end(), [](const auto& x, const auto& y) {
      return std::count(x.rel.begin(), x.rel.end(), '/') > std::count(y.rel.begin(), y.rel.end(), '/');
    });
    for (const DeferredDir& d : deferred_) {
      // A later entry may have replaced the directory; then its metadata no longer applies.
      auto fd = OpenDir(d.rel, /*create=*/false);
      if (!fd) continue;
      if (::fchmod(fd.value().get(), d.perm) != 0) return Io("chmod", d.rel);
      if (::futimens(fd.value().get(), d.times) != 0) return Io("set times of", d.rel);
    }
    return Ok();
  }

 private:
  Error Bad(const std::string& reason) const {
    return MakeError(ErrorCode::kInvalidArgument,
                     source_ + ": entry \"" + entry_ + "\": " + reason);
  }
  Error Io(const std::string& what, std::string_view rel, int err = errno) const {
    return MakeError(ErrorCode::kIo, source_ + ": entry \"" + entry_ + "\": " + what + " " +
                                         root_path_ + "/" + std::string(rel) + ": " +
                                         std::strerror(err));
  }

  // The parent directory of the current entry, created (0755) if missing; the descriptor is
  // cached and owned by the writer, valid until the next call.
  Result<int> ParentDir(std::string_view rel) {
    if (cache_valid_ && cache_rel_ == rel) return cache_fd_.get();
    auto fd = OpenDir(rel, /*create=*/true);
    if (!fd) return fd.error();
    cache_fd_ = std::move(fd.value());
    cache_rel_ = rel;
    cache_valid_ = true;
    return cache_fd_.get();
  }
  // Called whenever something is removed: a cached directory may no longer be what its path
  // names. The descriptor stays open until replaced (a caller may still hold it).
  void Invalidate() { cache_valid_ = false; }

  // Opens the directory at `rel` (normalized, "" for the root) beneath the root, never leaving
  // the root; creates missing components (0755) when `create`.
  Result<Fd> OpenDir(std::string_view rel, bool create) {
    if (rel.empty()) {
      int fd = ::fcntl(root_fd_, F_DUPFD_CLOEXEC, 0);
      if (fd < 0) return Io("dup", "");
      return Fd(fd);
    }
    return openat2_ ? OpenDirBeneath(rel, create) : OpenDirWalk(rel, create);
  }

  Error ResolveError(std::string_view rel, int err) const {
    const std::string p(rel);
    switch (err) {
      case EXDEV:
      case ELOOP:
        return Bad(context_ + "parent \"" + p + "\" leads outside the layer through a symlink");
      case ENOTDIR:
        return Bad(context_ + "parent \"" + p + "\" is not a directory");
      case ENOENT:
        return Bad(context_ + "parent \"" + p + "\" does not exist (a dangling symlink?)");
      default:
        return Io("open directory", rel, err);
    }
  }

  Result<Fd> OpenDirBeneath(std::string_view rel, bool create) {
    const std::string path(rel);
    const uint64_t flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
    int fd = Openat2(root_fd_, path.c_str(), flags);
    if (fd >= 0) return Fd(fd);
    if (errno != ENOENT || !create) return ResolveError(rel, errno);
    // Create the missing components one by one; each prefix is resolved beneath the root again,
    // so a symlink met on the way is followed only if it stays inside.
    Fd prev(::fcntl(root_fd_, F_DUPFD_CLOEXEC, 0));
    size_t start = 0;
    for (;;) {
      size_t slash = path.find('/', start);
      size_t end = slash == std::string::npos ? path.size() : slash;
      std::string prefix = path.substr(0, end);
      std::string comp = path.substr(start, end - start);
      int cur = Openat2(root_fd_, prefix.c_str(), flags);
      if (cur < 0 && errno == ENOENT) {
        if (::mkdirat(prev.get(), comp.c_str(), 0755) != 0 && errno != EEXIST) {
          return Io("mkdir", prefix);
        }
        cur = Openat2(root_fd_, prefix.c_str(), flags);
      }
      if (cur < 0) return ResolveError(prefix, errno);
      prev = Fd(cur);
      if (end == path.size()) return prev;
      start = end + 1;
    }
  }

  Result<Fd> OpenDirWalk(std::string_view rel, bool create) {
    const std::string path(rel);
    Fd cur(::fcntl(root_fd_, F_DUPFD_CLOEXEC, 0));
    size_t start = 0;
    for (;;) {
      size_t slash = path.find('/', start);
      size_t end = slash == std::string::npos ? path.size() : slash;
      std::string comp = path.substr(start, end - start);
      std::string prefix = path.substr(0, end);
      int fd = ::openat(cur.get(), comp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0 && errno == ENOENT && create) {
        if (::mkdirat(cur.get(), comp.c_str(), 0755) != 0 && errno != EEXIST) {
          return Io("mkdir", prefix);
        }
        fd = ::openat(cur.get(), comp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      }
      if (fd < 0) {
        int err = errno;
        struct stat st {};
        if ((err == ELOOP || err == ENOTDIR) &&
            ::fstatat(cur.get(), comp.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISLNK(st.st_mode)) {
          return Bad(context_ + "parent \"" + prefix +
                     "\" is a symlink (refused: openat2 is unavailable to check where it leads)");
        }
        return ResolveError(prefix, err);
      }
      cur = Fd(fd);
      if (end == path.size()) return cur;
      start = end + 1;
    }
  }

  // Makes room for a new entry named `name`: removes a non-directory there, or an empty
  // directory unless `keep_dir`. Returns true if a directory was kept.
  Result<bool> ClearSlot(int dirfd, const std::string& name, const std::string& rel,
                         bool keep_dir) {
    struct stat st {};
    if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return false;
      return Io("stat", rel);
    }
    if (S_ISDIR(st.st_mode)) {
      if (keep_dir) return true;
      Invalidate();
      if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0) {
        if (errno == ENOTEMPTY || errno == EEXIST) {
          return Bad("replaces a non-empty directory of the same layer");
        }
        return Io("rmdir", rel);
      }
      return false;
    }
    Invalidate();
    if (::unlinkat(dirfd, name.c_str(), 0) != 0) return Io("unlink", rel);
    return false;
  }

  bool KeepOwners() const { return privileged_ && opt_.keep_owners; }

  void EntryTimes(struct archive_entry* e, struct timespec times[2]) const {
    bool has_mtime = archive_entry_mtime_is_set(e);
    times[1] = Time(has_mtime, archive_entry_mtime(e), archive_entry_mtime_nsec(e));
    if (archive_entry_atime_is_set(e)) {
      times[0] = Time(true, archive_entry_atime(e), archive_entry_atime_nsec(e));
    } else {
      times[0] = times[1];
    }
  }

  // Sets the entry's xattrs on `fd`, or (fd < 0) on the symlink `name` in `dirfd`.
  Status Xattrs(struct archive_entry* e, int fd, int dirfd, const std::string& name,
                const std::string& rel) {
    if (archive_entry_xattr_reset(e) == 0) return Ok();
    const char* key = nullptr;
    const void* value = nullptr;
    size_t size = 0;
    while (archive_entry_xattr_next(e, &key, &value, &size) == ARCHIVE_OK) {
      std::string_view k(key ? key : "");
      if (k.empty()) return Bad("xattr without a name");
      if (size > opt_.max_xattr_bytes) {
        return Bad("xattr " + std::string(k) + " of " + std::to_string(size) +
                   " bytes exceeds the limit of " + std::to_string(opt_.max_xattr_bytes));
      }
      // Overlay's own names would let a layer forge whiteouts or opaque directories.
      if (StartsWith(k, "trusted.overlay.") || StartsWith(k, "user.overlay.") ||
          (!privileged_ && (StartsWith(k, "trusted.") || StartsWith(k, "security.")))) {
        ++stats_.xattrs_dropped;
        continue;
      }
      int rc;
      if (fd >= 0) {
        rc = ::fsetxattr(fd, key, value, size, 0);
      } else {
        // Symlinks cannot be opened; name them through the parent's descriptor (lsetxattr does
        // not follow the last component).
        std::string via = "/proc/self/fd/" + std::to_string(dirfd) + "/" + name;
        rc = ::lsetxattr(via.c_str(), key, value, size, 0);
        if (rc != 0 && (errno == EPERM || errno == ENOTSUP) && StartsWith(k, "user.")) {
          ++stats_.xattrs_dropped;  // Linux refuses user.* xattrs on symlinks.
          continue;
        }
      }
      if (rc != 0) return Io("set xattr " + std::string(k) + " on", rel);
    }
    return Ok();
  }

  // Owner, xattrs, mode, times on an open file.
  Status Metadata(struct archive_entry* e, int fd, const std::string& rel) {
    if (KeepOwners() && ::fchown(fd, static_cast<uid_t>(archive_entry_uid(e)),
                                 static_cast<gid_t>(archive_entry_gid(e))) != 0) {
      return Io("chown", rel);
    }
    if (auto st = Xattrs(e, fd, -1, "", rel); !st) return st;
    // After chown, which clears set-user-ID bits.
    if (::fchmod(fd, archive_entry_perm(e) & 07777) != 0) return Io("chmod", rel);
    struct timespec times[2];
    EntryTimes(e, times);
    if (::futimens(fd, times) != 0) return Io("set times of", rel);
    return Ok();
  }

  void DeferDir(const std::string& rel, struct archive_entry* e) {
    DeferredDir d{rel, static_cast<mode_t>(archive_entry_perm(e) & 07777), {}};
    EntryTimes(e, d.times);
    deferred_.push_back(d);
  }

  Status File(struct archive* a, struct archive_entry* e, int dirfd, const std::string& name,
              const std::string& rel) {
    const int64_t size = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
    if (size < 0 || static_cast<uint64_t>(size) > opt_.max_file_bytes) {
      return Bad("file of " + std::to_string(size) + " bytes exceeds the limit of " +
                 std::to_string(opt_.max_file_bytes));
    }
    stats_.data_bytes += static_cast<uint64_t>(size);
    if (stats_.data_bytes > opt_.max_total_bytes) {
      return Bad("layer data exceeds the limit of " + std::to_string(opt_.max_total_bytes) +
                 " bytes");
    }
    if (auto c = ClearSlot(dirfd, name, rel, false); !c) return c.error();
    Fd fd(::openat(dirfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                   0600));
    if (fd.get() < 0) return Io("create", rel);
    const void* buf = nullptr;
    size_t n = 0;
    la_int64_t offset = 0;
    int64_t end = 0;
    for (;;) {
      int r = archive_read_data_block(a, &buf, &n, &offset);
      if (r == ARCHIVE_EOF) break;
      if (r < ARCHIVE_WARN) return Bad(std::string("reading data: ") + archive_error_string(a));
      const char* p = static_cast<const char*>(buf);
      size_t left = n;
      off_t at = static_cast<off_t>(offset);
      while (left > 0) {
        ssize_t w = ::pwrite(fd.get(), p, left, at);
        if (w < 0) {
          if (errno == EINTR) continue;
          return Io("write", rel);
        }
        p += w;
        at += w;
        left -= static_cast<size_t>(w);
      }
      end = std::max<int64_t>(end, offset + static_cast<int64_t>(n));
    }
    // Sparse files end in a hole.
    if (end < size && ::ftruncate(fd.get(), size) != 0) return Io("truncate", rel);
    ++stats_.files;
    return Metadata(e, fd.get(), rel);
  }

  Status Dir(struct archive_entry* e, int dirfd, const std::string& name, const std::string& rel) {
    auto kept = ClearSlot(dirfd, name, rel, /*keep_dir=*/true);
    if (!kept) return kept.error();
    if (!kept.value() && ::mkdirat(dirfd, name.c_str(), 0700) != 0) return Io("mkdir", rel);
    Fd fd(::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) return Io("open directory", rel);
    if (KeepOwners() && ::fchown(fd.get(), static_cast<uid_t>(archive_entry_uid(e)),
                                 static_cast<gid_t>(archive_entry_gid(e))) != 0) {
      return Io("chown", rel);
    }
    if (auto st = Xattrs(e, fd.get(), -1, "", rel); !st) return st;
    DeferDir(rel, e);
    ++stats_.dirs;
    return Ok();
  }

  Status Symlink(struct archive_entry* e, int dirfd, const std::string& name,
                 const std::string& rel) {
    const char* target = archive_entry_symlink(e);
    if (!target || !*target) return Bad("symlink without a target");
    if (std::strlen(target) > opt_.max_symlink_bytes) {
      return Bad("symlink target longer than " + std::to_string(opt_.max_symlink_bytes) +
                 " bytes");
    }
    if (auto c = ClearSlot(dirfd, name, rel, false); !c) return c.error();
    // The target is stored as is: symlinks are never followed while extracting.
    if (::symlinkat(target, dirfd, name.c_str()) != 0) return Io("symlink", rel);
    return LinkMetadata(e, dirfd, name, rel, /*is_symlink=*/true);
  }

  // Metadata of an entry that cannot be opened (symlink, device, fifo).
  Status LinkMetadata(struct archive_entry* e, int dirfd, const std::string& name,
                      const std::string& rel, bool is_symlink) {
    if (KeepOwners() &&
        ::fchownat(dirfd, name.c_str(), static_cast<uid_t>(archive_entry_uid(e)),
                   static_cast<gid_t>(archive_entry_gid(e)), AT_SYMLINK_NOFOLLOW) != 0) {
      return Io("chown", rel);
    }
    if (auto st = Xattrs(e, -1, dirfd, name, rel); !st) return st;
    if (!is_symlink && ::fchmodat(dirfd, name.c_str(), archive_entry_perm(e) & 07777, 0) != 0) {
      return Io("chmod", rel);
    }
    struct timespec times[2];
    EntryTimes(e, times);
    if (::utimensat(dirfd, name.c_str(), times, AT_SYMLINK_NOFOLLOW) != 0) {
      return Io("set times of", rel);
    }
    if (is_symlink) {
      ++stats_.symlinks;
    } else {
      ++stats_.others;
    }
    return Ok();
  }

  Status Special(struct archive_entry* e, int dirfd, const std::string& name,
                 const std::string& rel, mode_t type) {
    dev_t dev = 0;
    if (type != AE_IFIFO) {
      if (!privileged_ || !opt_.allow_devices) {
        return Bad(std::string(type == AE_IFCHR ? "character" : "block") + " device " +
                   std::to_string(archive_entry_rdevmajor(e)) + ":" +
                   std::to_string(archive_entry_rdevminor(e)) + " refused: " +
                   (privileged_ ? "device nodes are disabled" : "extraction is unprivileged"));
      }
      dev = makedev(archive_entry_rdevmajor(e), archive_entry_rdevminor(e));
    }
    if (auto c = ClearSlot(dirfd, name, rel, false); !c) return c.error();
    mode_t kind = type == AE_IFCHR ? S_IFCHR : type == AE_IFBLK ? S_IFBLK : S_IFIFO;
    if (::mknodat(dirfd, name.c_str(), kind | 0600, dev) != 0) return Io("mknod", rel);
    return LinkMetadata(e, dirfd, name, rel, /*is_symlink=*/false);
  }

  Status HardLink(int dirfd, const std::string& name, const std::string& rel,
                  const char* target_raw) {
    auto target = NormalizeEntryPath(target_raw, opt_.path_limits);
    if (!target) {
      return Bad("hard link target \"" + std::string(target_raw) + "\": " +
                 target.error().message);
    }
    if (target.value().empty()) return Bad("hard link to the layer root");
    if (target.value() == rel) return Bad("hard link to itself");
    auto [tparent, tname] = SplitParent(target.value());
    context_ = "hard link target \"" + target.value() + "\": ";
    auto tdir = OpenDir(tparent, /*create=*/false);
    context_.clear();
    if (!tdir) return tdir.error();
    const std::string tname_s(tname);
    struct stat st {};
    if (::fstatat(tdir.value().get(), tname_s.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) {
        return Bad("hard link target \"" + target.value() + "\" is not in this layer");
      }
      return Io("stat", target.value());
    }
    if (S_ISDIR(st.st_mode)) return Bad("hard link to a directory");
    // ClearSlot may invalidate the cached parent; dirfd stays open until the next ParentDir.
    if (auto c = ClearSlot(dirfd, name, rel, false); !c) return c.error();
    if (::linkat(tdir.value().get(), tname_s.c_str(), dirfd, name.c_str(), 0) != 0) {
      return Io("link " + target.value() + " as", rel);
    }
    ++stats_.hardlinks;
    return Ok();
  }

  Status Whiteout(struct archive_entry* e, std::string_view parent, std::string_view name) {
    if (name == ".wh..wh..opq") {
      auto dir = ParentDir(parent);
      if (!dir) return dir.error();
      const char* key =
          whiteouts_ == WhiteoutMode::kOverlay ? "trusted.overlay.opaque" : "user.overlay.opaque";
      if (::fsetxattr(dir.value(), key, "y", 1, 0) != 0) {
        return Io(std::string("set xattr ") + key + " on", parent);
      }
      ++stats_.opaque_dirs;
      return Ok();
    }
    if (StartsWith(name, ".wh..wh.")) {
      // aufs bookkeeping (".wh..wh.plnk", ".wh..wh.aufs"); docker skips these too.
      ++stats_.others;
      return Ok();
    }
    std::string hidden(name.substr(4));
    if (hidden.empty() || hidden == "." || hidden == "..") {
      return Bad("whiteout of an invalid name");
    }
    auto dir = ParentDir(parent);
    if (!dir) return dir.error();
    const int dirfd = dir.value();
    const std::string rel = parent.empty() ? hidden : std::string(parent) + "/" + hidden;
    // The marker's mtime, so that the same layer always gives the same tree.
    struct timespec times[2];
    EntryTimes(e, times);
    if (whiteouts_ == WhiteoutMode::kOverlay) {
      if (auto c = ClearSlot(dirfd, hidden, rel, false); !c) return c.error();
      if (::mknodat(dirfd, hidden.c_str(), S_IFCHR | 0, makedev(0, 0)) != 0) {
        return Io("mknod whiteout", rel);
      }
      if (::utimensat(dirfd, hidden.c_str(), times, AT_SYMLINK_NOFOLLOW) != 0) {
        return Io("set times of", rel);
      }
    } else {
      const std::string marker(name);
      const std::string marker_rel =
          parent.empty() ? marker : std::string(parent) + "/" + marker;
      if (auto c = ClearSlot(dirfd, marker, marker_rel, false); !c) return c.error();
      Fd fd(::openat(dirfd, marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                     0));
      if (fd.get() < 0) return Io("create whiteout", marker_rel);
      if (::futimens(fd.get(), times) != 0) return Io("set times of", marker_rel);
    }
    ++stats_.whiteouts;
    return Ok();
  }

  int root_fd_;
  std::string root_path_;
  std::string source_;
  const ExtractOptions& opt_;
  bool privileged_;
  WhiteoutMode whiteouts_;
  bool openat2_;
  LayerStats& stats_;
  std::string entry_;  // the current entry's path as in the tar, for messages
  std::string context_;  // what is being resolved, when not the entry's parent, for messages
  std::vector<DeferredDir> deferred_;
  std::string cache_rel_;
  Fd cache_fd_;
  bool cache_valid_ = false;
};

// After a tar or entry failure in a compressed layer: decodes the rest of the stream, so that a
// corrupt gzip or zstd stream (whose checksum fails only at its end) is reported as the cause
// rather than the garbage entries it produced. Returns the decoder's error, if any. (It waits
// for the rest of a growing source: a failing layer is reported when its download ends.)
std::optional<Error> DecoderFailure(Decoder& decoder) {
  std::vector<std::byte> buf(kReadBuffer);
  for (;;) {
    auto n = decoder.Read(buf);
    if (!n) return n.error();
    if (n.value() == 0) return std::nullopt;
  }
}

// Removes a partial tree; never follows symlinks.
void RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

}  // namespace

bool RunningPrivileged() { return ::geteuid() == 0; }

Result<LayerStats> ExtractLayer(ByteSource& source, const std::string& dir,
                                const ExtractOptions& options) {
  const bool privileged = RunningPrivileged() && !options.unprivileged;
  WhiteoutMode whiteouts = options.whiteouts;
  if (whiteouts == WhiteoutMode::kAuto) {
    whiteouts = privileged ? WhiteoutMode::kOverlay : WhiteoutMode::kUser;
  }
  bool openat2 = false;
  switch (options.resolver) {
    case Resolver::kAuto:
      openat2 = Openat2Available();
      break;
    case Resolver::kOpenat2:
      if (!Openat2Available()) {
        return MakeError(ErrorCode::kUnsupported, "openat2 is not available on this kernel");
      }
      openat2 = true;
      break;
    case Resolver::kWalk:
      break;
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) == 0) {
    return MakeError(ErrorCode::kInvalidArgument, "extract into " + dir + ": already exists");
  }
  std::string tmp = dir + ".partial-XXXXXX";
  if (::mkdtemp(tmp.data()) == nullptr) {
    return MakeError(ErrorCode::kIo, "mkdtemp " + tmp + ": " + std::strerror(errno));
  }
  struct Cleanup {
    std::string path;
    bool armed = true;
    ~Cleanup() {
      if (armed) RemoveTree(path);
    }
  } cleanup{tmp};

  Fd root(::open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (root.get() < 0) {
    return MakeError(ErrorCode::kIo, "open " + tmp + ": " + std::strerror(errno));
  }
  HashingSource raw(source, options.expected_digest.has_value());
  auto decoder = OpenDecoder(raw);
  if (!decoder) return decoder.error();
  LayerStats stats;
  stats.compression = decoder.value()->compression();

  ReadContext ctx;
  ctx.decoder = decoder.value().get();
  Sha256 tar_sha;
  if (options.expected_diff_id) ctx.tar_sha = &tar_sha;
  std::unique_ptr<struct archive, int (*)(struct archive*)> a(archive_read_new(),
                                                              archive_read_free);
  archive_read_support_format_tar(a.get());
  if (archive_read_open(a.get(), &ctx, nullptr, ReadCallback, nullptr) != ARCHIVE_OK) {
    if (ctx.error) return *ctx.error;
    return MakeError(ErrorCode::kInvalidArgument,
                     source.Describe() + ": not a tar stream: " + archive_error_string(a.get()));
  }
  Writer writer(root.get(), tmp, source.Describe(), options, privileged, whiteouts, openat2, stats);
  for (;;) {
    struct archive_entry* e = nullptr;
    int r = archive_read_next_header(a.get(), &e);
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN) {
      if (ctx.error) return *ctx.error;
      if (auto cause = DecoderFailure(*decoder.value())) return *cause;
      return MakeError(ErrorCode::kInvalidArgument,
                       source.Describe() + ": malformed tar after " +
                           std::to_string(stats.entries) + " entries: " +
                           archive_error_string(a.get()));
    }
    auto st = writer.Entry(a.get(), e);
    if (ctx.error) return *ctx.error;  // a decoder failure surfaces as a data read error
    if (!st) {
      if (st.error().code == ErrorCode::kInvalidArgument &&
          stats.compression != Compression::kNone) {
        if (auto cause = DecoderFailure(*decoder.value())) return *cause;
      }
      return st.error();
    }
  }
  if (options.expected_diff_id) {
    // The diff ID covers the whole uncompressed stream, the blocks after the tar's end included.
    for (;;) {
      auto n = decoder.value()->Read(ctx.buf);
      if (!n) return n.error();
      if (n.value() == 0) break;
      tar_sha.Update(ctx.buf.data(), n.value());
    }
  }
  stats.tar_bytes = decoder.value()->decoded_bytes();
  if (auto st = raw.Drain(); !st) return st.error();
  stats.raw_bytes = raw.bytes();
  if (options.expected_digest) {
    Digest got = raw.Final();
    if (got != *options.expected_digest) {
      return MakeError(ErrorCode::kDigestMismatch,
                       source.Describe() + ": layer bytes hash to " + got.str() + ", expected " +
                           options.expected_digest->str());
    }
  }
  if (options.expected_diff_id) {
    Digest got = tar_sha.Final();
    if (got != *options.expected_diff_id) {
      return MakeError(ErrorCode::kDigestMismatch,
                       source.Describe() + ": uncompressed layer hashes to " + got.str() +
                           ", expected diff ID " + options.expected_diff_id->str());
    }
  }
  if (options.before_commit) {
    if (auto st = options.before_commit(); !st) return st.error();
  }
  if (auto st = writer.Finish(); !st) return st.error();
  root.Reset();
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_NOREPLACE) != 0) {
    return MakeError(ErrorCode::kIo,
                     "rename " + tmp + " to " + dir + ": " + std::strerror(errno));
  }
  cleanup.armed = false;
  return stats;
}

}  // namespace shoal::extract
