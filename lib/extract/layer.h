#pragma once
// Extraction of one layer (tar, tar+gzip or tar+zstd) into a directory, in overlay2's form:
// OCI whiteouts become overlay whiteouts, and nothing is ever written outside the directory.
//
// Whiteouts. Privileged (CAP_MKNOD, i.e. root here): ".wh.NAME" becomes a character device 0/0
// named NAME, and ".wh..wh..opq" sets the xattr trusted.overlay.opaque=y on its directory, which
// is what the kernel's overlayfs (and docker's overlay2 driver) reads. Unprivileged (or
// WhiteoutMode::kUser): the form rootless overlays read without privileges: ".wh.NAME" is kept
// as an empty regular file of mode 0 named ".wh.NAME" (fuse-overlayfs's own whiteout when it
// cannot mknod), and an opaque directory gets user.overlay.opaque=y (read by fuse-overlayfs and
// by kernel overlayfs mounted with "userxattr"). Xattrs in the tar named trusted.overlay.* or
// user.overlay.* are dropped, so a layer cannot forge whiteouts.
//
// Safety. Entry paths are normalized and checked (entry_path.h); each parent directory is
// opened with openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) from the layer root, so a
// symlink that leads outside (absolute, or ".." above the root) is refused with the entry's
// name; where openat2 is unavailable, every component is opened with O_NOFOLLOW (any symlink in
// a parent path is then refused). The last component is created with *at calls that never
// follow it. Hard link targets go through the same checks. Device nodes need privilege.
//
// Atomicity. The layer is extracted into "<dir>.partial-XXXXXX" and renamed to <dir> only when
// every entry is written; on any failure the partial tree is removed.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "lib/core/digest.h"
#include "lib/core/error.h"
#include "lib/extract/byte_source.h"
#include "lib/extract/decompress.h"
#include "lib/extract/entry_path.h"

namespace shoal::extract {

// How whiteouts and opaque directories are written (see the file comment).
enum class WhiteoutMode {
  kAuto,      // kOverlay when the process runs as root, else kUser
  kOverlay,   // char device 0/0 and trusted.overlay.opaque=y
  kUser,      // ".wh.NAME" empty files and user.overlay.opaque=y
};

// How parent directories are resolved safely (see the file comment).
enum class Resolver {
  kAuto,      // openat2 when the kernel offers it, else kWalk
  kOpenat2,   // RESOLVE_BENEATH: in-layer symlinks are followed, escapes refused
  kWalk,      // one O_NOFOLLOW open per component: every symlink in a parent path is refused
};

// Bounds and choices for one layer. The defaults suit real images (the largest known have a few
// hundred thousand entries and files of tens of GiB).
struct ExtractOptions {
  PathLimits path_limits;
  uint64_t max_entries = 2'000'000;
  uint64_t max_file_bytes = 64ull << 30;     // one regular file
  uint64_t max_total_bytes = 512ull << 30;   // all file data of the layer
  uint64_t max_xattr_bytes = 64 << 10;       // one xattr value
  size_t max_symlink_bytes = 4096;           // one symlink target
  WhiteoutMode whiteouts = WhiteoutMode::kAuto;
  Resolver resolver = Resolver::kAuto;
  // Privileged extraction only: apply the entries' uid/gid (else files belong to the caller).
  bool keep_owners = true;
  // Device nodes are refused unless this is set and the process runs as root.
  bool allow_devices = true;
  // Behave as an unprivileged process even as root: no owners, no device nodes, no trusted.* or
  // security.* xattrs, and kAuto whiteouts become kUser.
  bool unprivileged = false;
  // If set, the raw (compressed) bytes must hash to this digest; checked before the rename,
  // after reading the source to its end. Mismatch: kDigestMismatch.
  std::optional<Digest> expected_digest;
  // If set, the uncompressed tar stream (every decoded byte, to the stream's end) must hash to
  // this digest: the layer's diff ID (the image config's rootfs.diff_ids). Checked before the
  // rename. Mismatch: kDigestMismatch.
  std::optional<Digest> expected_diff_id;
  // If set, called after every entry is written and before the rename; an error aborts the
  // layer (e.g. a download that turned out bad).
  std::function<Status()> before_commit;
};

// What one layer held.
struct LayerStats {
  Compression compression = Compression::kNone;
  uint64_t raw_bytes = 0;      // compressed bytes read
  uint64_t tar_bytes = 0;      // uncompressed tar bytes
  uint64_t data_bytes = 0;     // regular file data written
  uint64_t entries = 0;
  uint64_t files = 0, dirs = 0, symlinks = 0, hardlinks = 0, others = 0;
  uint64_t whiteouts = 0, opaque_dirs = 0;
  uint64_t xattrs_dropped = 0;  // reserved overlay names, or privileged ones when unprivileged
  bool root_entry = false;      // the tar had an entry for the layer root ("./"); its metadata
                                // was applied to the root (else the root is mkdtemp's 0700)
};

// True if the process can create overlay whiteouts and trusted.* xattrs (euid 0).
bool RunningPrivileged();

// Extracts the (possibly compressed) tar read from `source` into `dir`, which must not exist
// (its parent must). Blocking; call from a worker thread. Thread-safe for distinct dirs.
// Errors: kInvalidArgument for a hostile or malformed entry, message
// "<source>: entry \"<path>\": <reason>"; kInvalidArgument for corrupt compression; kIo for
// local disk failures (naming the path); kDigestMismatch; kInvalidArgument if `dir` exists;
// kUnsupported for Resolver::kOpenat2 without openat2. On error nothing is left at `dir` or
// beside it.
Result<LayerStats> ExtractLayer(ByteSource& source, const std::string& dir,
                                const ExtractOptions& options = {});

}  // namespace shoal::extract
