#pragma once
// Hand-made layers for extraction tests: tar archives with any entry (hostile ones included)
// built with libarchive's writer, compressed with ISA-L / libzstd, written into OCI layouts; and
// snapshots of extracted trees to compare them file for file.

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lib/core/digest.h"
#include "lib/core/error.h"
#include "tests/support/image.h"

namespace shoal::testkit {

// One tar entry. Paths and link targets are written exactly as given (nothing is sanitized).
struct TarEntry {
  enum class Type { kFile, kDir, kSymlink, kHardlink, kChar, kBlock, kFifo };
  std::string path;
  Type type = Type::kFile;
  std::string data;  // file contents
  std::string link;  // symlink or hard link target
  int mode = 0644;
  int64_t uid = 0, gid = 0;
  time_t mtime = 1704067200;  // 2024-01-01
  std::map<std::string, std::string> xattrs;
  unsigned dev_major = 0, dev_minor = 0;
};

// Shorthands.
TarEntry FileEntry(std::string path, std::string data, int mode = 0644);
TarEntry DirEntry(std::string path, int mode = 0755);
TarEntry SymlinkEntry(std::string path, std::string target);
TarEntry HardlinkEntry(std::string path, std::string target);

// A pax tar archive of the entries, in order. Throws std::runtime_error on libarchive errors.
std::string BuildTar(const std::vector<TarEntry>& entries);

// `data` compressed: kNone returns it; kGzip makes `members` gzip members (data split evenly,
// ISA-L level 1); kZstd one zstd frame (level 3).
std::string Compress(const std::string& data, Compression c, int members = 1);

// A layer for WriteOciImage: the tar and how to compress it.
struct RawLayer {
  std::string tar;
  Compression compression = Compression::kGzip;
  int gzip_members = 1;
};

// Writes an OCI image layout at `layout_dir` (created) holding one image tagged `tag` whose
// layers are `layers` (bottom first), with a config listing their diff_ids. Returns what was
// written (layer_digests, layer_sizes, diff_ids, manifest_digest...).
Result<BuiltImage> WriteOciImage(const std::string& layout_dir, const std::string& tag,
                                 const std::vector<RawLayer>& layers);

// What one path in a tree is.
struct NodeInfo {
  char type = '?';  // f d l c b p
  mode_t mode = 0;  // permission bits (07777)
  uid_t uid = 0;
  gid_t gid = 0;
  uint64_t size = 0;
  std::string content_sha;  // regular files
  std::string link;         // symlink target
  unsigned rdev_major = 0, rdev_minor = 0;
  int64_t mtime = 0;
  std::map<std::string, std::string> xattrs;
  std::string hardlink_group;  // regular files with st_nlink > 1: first path of the inode
  bool operator==(const NodeInfo&) const = default;
};

// Relative path ("a/b") -> node; the root itself is not included.
using Tree = std::map<std::string, NodeInfo>;

// Walks `dir` without following symlinks. Throws std::runtime_error on I/O errors.
Tree SnapshotTree(const std::string& dir);

// Differences between two trees, one line each ("only in a: x", "x: mode 0644 vs 0755"...);
// empty when equal. `compare_dir_mtimes`/`compare_hardlinks` select optional checks.
std::vector<std::string> DiffTrees(const Tree& a, const Tree& b, bool compare_dir_mtimes = true,
                                   bool compare_hardlinks = true);

// The overlay merged view of layer trees (bottom first) as the kernel would show it: a char
// device 0/0 or a ".wh.NAME" file hides NAME below; a directory with trusted.overlay.opaque=y
// or user.overlay.opaque=y hides everything below it. Overlay xattrs and markers are dropped.
Tree MergeLayers(const std::vector<Tree>& layers);

}  // namespace shoal::testkit
