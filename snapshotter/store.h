#pragma once
// The snapshot store behind shoal's containerd snapshotter: containerd's snapshot model (active,
// view and committed snapshots by key, each on a chain of committed parents, with labels) over
// overlayfs directories, with no gRPC in sight. Its semantics follow containerd 1.6's overlay
// snapshotter (snapshots/overlay/overlay.go) and its metadata store (snapshots/storage), so that
// containerd cannot tell the two apart.
//
// On disk, under the root:
//   metadata.json             every snapshot's record, replaced atomically on each change
//   snapshots/<id>/fs         the snapshot's files (an overlay upperdir or lowerdir)
//   snapshots/<id>/work       the overlay workdir (active snapshots only)
// Ids are decimal numbers that are never reused, so a directory whose id has no record is
// garbage (Cleanup removes it).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <boost/outcome/result.hpp>

namespace shoal::snapshotter {

// A snapshot's kind; the numbers are containerd's (snapshots.Kind and the proto enum).
enum class Kind { kView = 1, kActive = 2, kCommitted = 3 };

// "view", "active" or "committed".
const char* KindName(Kind kind);

using Labels = std::map<std::string, std::string>;

// What containerd knows of a snapshot (snapshots.Info). `name` is the key it is stored under.
struct Info {
  std::string name;
  std::string parent;  // the committed parent's name; empty for a base snapshot
  Kind kind = Kind::kActive;
  std::chrono::system_clock::time_point created;
  std::chrono::system_clock::time_point updated;
  Labels labels;
};

// One mount(2) call, as containerd's mount.Mount: "overlay" with lowerdir/upperdir/workdir
// options, or "bind" of a single directory.
struct Mount {
  std::string type;
  std::string source;
  std::vector<std::string> options;

  bool operator==(const Mount&) const = default;
};

// Disk use of a snapshot's own files: allocated bytes (blocks x 512, each inode counted once)
// and inodes, as containerd's fs.DiskUsage reports them.
struct Usage {
  int64_t size = 0;
  int64_t inodes = 0;
};

// The failures containerd distinguishes (its errdefs); the gRPC service maps each to the status
// code containerd converts back.
enum class Errc {
  kNotFound,            // no snapshot with that key (or parent)
  kAlreadyExists,       // the key or commit name is taken
  kFailedPrecondition,  // wrong kind for the operation, or it still has children
  kInvalidArgument,     // empty key, parent not committed, an unknown field, oversized label
  kIo,                  // the disk failed (the message names the path)
};

// An error: a code and a message that names the snapshot or path it concerns.
struct StoreError {
  Errc code = Errc::kIo;
  std::string message;

  std::string ToString() const;
};

template <typename T>
using StoreResult = boost::outcome_v2::result<T, StoreError, boost::outcome_v2::policy::terminate>;

// The store. Thread-safe: every method may be called from any thread (the gRPC server's). The
// record set is guarded by one mutex; disk-usage walks and the deletion of a removed
// snapshot's files run outside it.
class Store {
 public:
  // Opens (or creates) a store under `root`: creates root/snapshots, loads metadata.json if it
  // exists. Errors: kIo naming the path (an unreadable or corrupt metadata.json included).
  static StoreResult<std::unique_ptr<Store>> Open(const std::string& root);

  // Creates an active (writable) snapshot `key` on top of the committed snapshot `parent`
  // (empty: none) and returns its mounts. Errors: kAlreadyExists (key taken), kNotFound
  // (parent missing), kInvalidArgument (empty key, parent not committed, oversized label), kIo.
  StoreResult<std::vector<Mount>> Prepare(const std::string& key, const std::string& parent,
                                          const Labels& labels);
  // Like Prepare, but a read-only view of `parent`.
  StoreResult<std::vector<Mount>> View(const std::string& key, const std::string& parent,
                                       const Labels& labels);
  // The mounts of an active snapshot or a view. Errors: kNotFound, kFailedPrecondition
  // (committed).
  StoreResult<std::vector<Mount>> Mounts(const std::string& key) const;
  // Turns the active snapshot `key` into the committed snapshot `name` (same files, labels
  // replaced by `labels`, created and updated reset to now, usage recorded); `key` is gone
  // afterwards. Errors: kAlreadyExists (name taken), kNotFound (key), kFailedPrecondition
  // (key is not active), kInvalidArgument, kIo.
  StoreResult<void> Commit(const std::string& name, const std::string& key, const Labels& labels);
  // Removes the snapshot and deletes its directory. Errors: kNotFound, kFailedPrecondition
  // (another snapshot has it as parent), kIo.
  StoreResult<void> Remove(const std::string& key);
  // The snapshot's info. Errors: kNotFound.
  StoreResult<Info> Stat(const std::string& key) const;
  // Updates the labels of snapshot info.name: `fieldpaths` "labels" (all of them) or
  // "labels.<k>" (one; an empty value deletes it); no fieldpaths: all labels. Sets updated to
  // now and returns the new info. Errors: kNotFound, kInvalidArgument (another field), kIo.
  StoreResult<Info> Update(const Info& info, const std::vector<std::string>& fieldpaths);
  // Every snapshot, ordered by name.
  std::vector<Info> List() const;
  // Disk use: measured now for an active snapshot, as recorded at commit for a committed one,
  // zero for a view. Errors: kNotFound, kIo.
  StoreResult<Usage> GetUsage(const std::string& key) const;
  // Deletes every directory under root/snapshots that no snapshot refers to (left by a crash or
  // a failed deletion). Returns how many it removed. Errors: kIo.
  StoreResult<size_t> Cleanup();

  // The files directory (upper dir) of the active snapshot `key`, for a writer that fills it
  // before Commit (layer_prep.h). Errors: kNotFound, kFailedPrecondition (not active).
  StoreResult<std::string> ActiveFsDir(const std::string& key) const;

  const std::string& root() const { return root_; }

  // Bytes on disk of the committed snapshots (their usage recorded at commit), kept as a running
  // total: cheap, never waits for the store's lock (the agent counts it against its cache budget).
  uint64_t CommittedBytes() const { return committed_bytes_.load(std::memory_order_relaxed); }
  // Called after every Commit and Remove that succeeded, without the store's lock, on the
  // caller's thread (the agent re-checks its cache budget). Set before any other use.
  void SetOnChange(std::function<void()> hook) { on_change_ = std::move(hook); }

 private:
  struct Record {
    uint64_t id = 0;
    Info info;
    Usage usage;  // recorded at commit
  };

  explicit Store(std::string root);
  StoreResult<std::vector<Mount>> Create(Kind kind, const std::string& key,
                                         const std::string& parent, const Labels& labels);
  // Ids of `parent` and its ancestors, nearest first. Requires mu_.
  std::vector<uint64_t> ParentIds(const std::string& parent) const;
  std::vector<Mount> MountsOf(const Record& r) const;
  std::string FsPath(uint64_t id) const;
  std::string WorkPath(uint64_t id) const;
  // Writes metadata.json atomically from records_ and next_id_. Requires mu_.
  StoreResult<void> Save() const;
  // Recomputes committed_bytes_ from records_. Requires mu_.
  void CountCommittedLocked();
  // Loads metadata.json (if any) and moves next_id_ past every directory on disk.
  StoreResult<void> Load();
  StoreResult<void> LoadRecords(const std::string& path);

  const std::string root_;
  bool index_off_ = false;  // the kernel knows overlay's index option: mount with index=off

  mutable std::mutex mu_;
  std::map<std::string, Record> records_;  // by key; GUARDED_BY(mu_)
  uint64_t next_id_ = 1;                   // GUARDED_BY(mu_)
  std::atomic<uint64_t> committed_bytes_{0};  // written under mu_
  std::function<void()> on_change_;
};

// Measures `dir` as containerd's fs.DiskUsage does (see Usage). Errors: kNotFound when dir is
// missing, kIo.
StoreResult<Usage> DiskUsage(const std::string& dir);

}  // namespace shoal::snapshotter
