#pragma once
// The content-addressed blob cache on local disk (meant for the instance SSD).
//
// Layout under root: blobs/sha256/<2 hex>/<64 hex> holds complete, verified blobs; tmp/ holds
// blobs being written (never served as complete); meta/<64 hex>.json holds a manifest's media
// type. A blob appears under blobs/ only through BlobWriter::Commit, i.e. fsync + rename after
// its sha256 matched, so a crash can leave garbage in tmp/ but never a wrong blob.
//
// Budget and pins: the store keeps an index of its complete blobs (size, last use). Last use is
// recorded by Touch (the agent calls it when it serves a blob) and GetManifest (not atime, which
// noatime mounts do not keep) and saved in meta/access.json by Flush. Evict deletes least
// recently used blobs until the total fits the budget, skipping pinned blobs (pins.json, each with
// an owner and an optional expiry) and blobs in use (a MarkInUse handle: open readers; a writer
// until its Commit).

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "lib/core/digest.h"
#include "lib/core/error.h"

namespace shoal::store {

// A manifest as cached: its bytes plus the media type it was served with.
struct StoredManifest {
  std::string body;
  std::string media_type;
};

class BlobStore;

// Owns one temp file that will become a blob. Not thread-safe; PWrite may be called from any
// single thread at a time. Destroying an uncommitted writer removes the temp file.
class BlobWriter {
 public:
  ~BlobWriter();
  BlobWriter(const BlobWriter&) = delete;
  BlobWriter& operator=(const BlobWriter&) = delete;

  // The temp file's descriptor, readable and writable; stays valid (and keeps naming the same
  // inode) after Commit, until the writer is destroyed.
  int fd() const { return fd_; }
  const std::string& temp_path() const { return temp_path_; }

  // Writes all of [data, data+size) at offset. Errors: kIo (e.g. ENOSPC) naming the file.
  Status PWrite(const char* data, size_t size, uint64_t offset);
  // A hint: starts writing [offset, offset + length) to disk without waiting for it
  // (sync_file_range), so that Commit's fsync finds little left to write. Errors are ignored:
  // Commit reports any that matter.
  void StartWriteback(uint64_t offset, uint64_t length) const;
  // fsyncs and atomically renames the temp file to the blob's final path. The caller must have
  // verified the content hashes to the digest. Errors: kIo.
  Status Commit();
  // Removes the temp file now (the fd stays open for readers that still hold it).
  void Abort();

 private:
  friend class BlobStore;
  BlobWriter(BlobStore* store, Digest digest, int fd, std::string temp_path,
             std::string final_path);
  BlobStore* store_;
  Digest digest_;
  std::shared_ptr<void> in_use_;  // the digest is in use until Commit
  uint64_t reserved_ = 0;         // bytes counted in the store's in-flight total until Commit
  int fd_;
  std::string temp_path_;
  std::string final_path_;
  bool done_ = false;
};

// Parses a cache budget: bytes with an optional unit ("50GiB", "512MiB", "10GB", "1048576") or a
// percentage of the size of the file system holding `path` ("80%"). "0" means no budget.
// Errors: kInvalidArgument naming the bad text; kIo when the file system cannot be measured.
Result<uint64_t> ParseBudget(std::string_view spec, const std::string& path);

// One pin on a blob: while any unexpired pin holds it, eviction leaves the blob alone.
struct Pin {
  std::string owner;   // who pinned it ("prefetch", "operator"...); a digest has one pin per owner
  std::string reason;  // free text, e.g. the image reference
  std::optional<std::chrono::system_clock::time_point> expires;  // nullopt: until unpinned
};

// One cached blob as listed by BlobStore::List.
struct CacheEntry {
  Digest digest;
  uint64_t size = 0;
  std::chrono::system_clock::time_point last_use;
  bool in_use = false;
  std::vector<Pin> pins;  // unexpired pins only
};

// Totals of the cache.
struct CacheStats {
  uint64_t bytes = 0;         // complete blobs
  uint64_t budget = 0;        // 0: unlimited
  uint64_t pinned_bytes = 0;  // complete blobs with an unexpired pin
  uint64_t blobs = 0;
  uint64_t evictions = 0;       // blobs evicted since Open
  uint64_t inflight_bytes = 0;  // reserved by blobs being written (Create until Commit or Abort)
  uint64_t external_bytes = 0;  // held outside the cache on its budget (SetExternalUsage)
};

// What one Evict call did.
struct EvictReport {
  uint64_t freed_bytes = 0;
  std::vector<Digest> evicted;
  // Bytes still above the budget because the rest is pinned or in use (0 when it fits).
  uint64_t over_budget = 0;
};

// Thread-safe: all methods may be called concurrently (the index and the pins are guarded by a
// mutex; the file system is the rest of the state).
class BlobStore {
 public:
  // Creates the directory layout if needed and deletes leftover temp files from an earlier run.
  // Errors: kIo naming the path.
  static Result<std::unique_ptr<BlobStore>> Open(std::string root);

  const std::string& root() const { return root_; }
  // Final path of a blob, whether or not it exists.
  std::string BlobPath(const Digest& digest) const;
  // Size of a complete blob, or nullopt when it is not cached.
  std::optional<uint64_t> Stat(const Digest& digest) const;
  // Opens a complete blob for reading; the caller owns the fd. Errors: kNotFound, kIo.
  Result<int> OpenBlob(const Digest& digest) const;
  // Starts writing a blob of `size` bytes into a new temp file whose disk space is allocated
  // at once (fallocate), after making room: the size counts against the budget from now on
  // (in-flight bytes, see CacheStats), and least recently used blobs that are neither pinned nor
  // in use are evicted until the blob fits the budget (a pinned blob is exempt from the budget,
  // as pinned blobs always were) and the disk. Errors: kInsufficientStorage
  // with what holds the space (budget, pinned, in use, in flight, free on disk) when it cannot
  // fit; kIo.
  Result<std::unique_ptr<BlobWriter>> Create(const Digest& digest, uint64_t size);
  // Create for a blob of unknown size (nothing reserved; tests).
  Result<std::unique_ptr<BlobWriter>> Create(const Digest& digest) { return Create(digest, 0); }

  // Stores a small blob (a manifest) after checking that it hashes to digest, with its media
  // type. Errors: kDigestMismatch, kIo.
  Status PutManifest(const Digest& digest, std::string_view body, std::string_view media_type);
  // Reads a cached manifest back (re-verifying its digest). nullopt when absent or corrupt.
  std::optional<StoredManifest> GetManifest(const Digest& digest) const;

  // Number of leftover temp files removed by Open (for logs and tests).
  int cleaned_temp_files() const { return cleaned_temp_files_; }

  // --- Budget, last use and pins ---

  using Clock = std::function<std::chrono::system_clock::time_point()>;
  // Replaces the wall clock used for last use and pin expiry (tests). Call before other use.
  void SetClock(Clock clock);
  // The budget in bytes; 0 (the default) means unlimited. Takes effect at the next Evict.
  void SetBudget(uint64_t bytes);
  // The budget as ParseBudget's text. A percentage is of the file system's size as it is at each
  // use, so a grown disk is used. Errors: as ParseBudget.
  Status SetBudgetSpec(std::string_view spec);
  // Records a use of the blob now (for LRU). No-op for blobs not cached.
  void Touch(const Digest& digest);
  // Marks the blob in use until the returned handle is destroyed (handles nest): an open reader
  // or a writer. Eviction never deletes a blob in use.
  std::shared_ptr<void> MarkInUse(const Digest& digest);
  // Whether a MarkInUse handle on the blob is alive.
  bool InUse(const Digest& digest) const;
  // Pins a blob (cached or not yet) for `owner`; replaces that owner's earlier pin on it. ttl
  // nullopt or zero: until unpinned. Persisted at once. Errors: kIo.
  Status Pin(const Digest& digest, std::string owner, std::string reason,
             std::optional<std::chrono::seconds> ttl);
  // Pin(digest, "operator", "", ttl): the short form for callers with no owner of their own.
  Status Pin(const Digest& digest, std::optional<std::chrono::seconds> ttl) {
    return Pin(digest, "operator", "", ttl);
  }
  // Removes the pin of `owner` on the blob, or every pin on it when owner is empty. Returns how
  // many pins were removed. Errors: kIo when pins.json cannot be written.
  Result<int> Unpin(const Digest& digest, const std::string& owner = "");
  // Unexpired pins per digest (also of blobs not cached).
  std::map<Digest, std::vector<shoal::store::Pin>> Pins() const;
  bool IsPinned(const Digest& digest) const;
  // Every complete blob, least recently used first.
  std::vector<CacheEntry> List() const;
  CacheStats Stats() const;
  // Space on the budget held outside the blob cache on the same disk (the snapshotter's
  // extracted layers): `used` returns its bytes now. It counts with the blobs, so least recently
  // used blobs are evicted to make room for it; it is never evicted here. Called without the
  // store's lock; must be cheap and must not call the store. Set before the store is shared
  // between threads.
  void SetExternalUsage(std::function<uint64_t()> used);
  // Called with each digest just before its file is deleted by Evict, without the store's lock
  // held, on the thread that called Evict (the agent removes the blob's torrents from the swarm).
  void SetEvictHook(std::function<void(const Digest&)> hook);
  // Deletes least recently used unpinned blobs that are not in use until the cache fits the
  // budget (nothing with no budget) and drops expired pins. It does not save the last-use index
  // (Flush does, off the network thread): nothing here waits for an fsync.
  EvictReport Evict();
  // Drops a blob found corrupt on disk, if its file is still the inode `inode`: the evict hook
  // runs (the swarm stops seeding it), then it leaves the index and its file is deleted (open
  // readers keep their descriptors). Returns whether it was dropped.
  bool DropCorrupt(const Digest& digest, uint64_t inode);
  // Like Evict but with this budget instead of the configured one (gc --to).
  EvictReport EvictTo(uint64_t budget);
  // Saves the last-use index (meta/access.json, fsynced; may block on the disk: not for the
  // network thread). Thread-safe. Errors: kIo.
  Status Flush();

 private:
  struct IndexEntry {
    uint64_t size = 0;
    std::chrono::system_clock::time_point last_use;
    uint64_t seq = 0;  // order of uses within this process (ties of last_use)
  };
  explicit BlobStore(std::string root) : root_(std::move(root)) {}
  // The budget now (a percentage is measured again). Requires mu_.
  uint64_t BudgetLocked() const;
  // SetExternalUsage's bytes now (0 without it). Must be called without mu_.
  uint64_t External() const { return external_ ? external_() : 0; }
  // Makes room for `size` more bytes in the budget (evicting); "" or why it cannot fit.
  std::string MakeRoomInBudget(const Digest& digest, uint64_t size);
  // Allocates fd's disk space, evicting while the disk is full; "" or why it cannot fit.
  std::string AllocateEvicting(const Digest& digest, int fd, uint64_t size);
  // Evicts the least recently used evictable blob; false when none is left.
  bool EvictOne(const Digest& keep);
  // Bytes of cached blobs that are neither pinned nor in use. Requires mu_.
  uint64_t EvictableBytesLocked(std::chrono::system_clock::time_point now) const;
  // What holds the cache's space, for "cannot fit" messages.
  std::string SpaceReport() const;
  void Unreserve(uint64_t size);
  // Registers a complete blob in the index (after a commit or a manifest write).
  void Added(const Digest& digest, uint64_t size);
  void Release(const Digest& digest);
  void LoadIndex();
  // Writes pins.json (fsync) from a snapshot taken under mu_; must be called without mu_.
  Status SavePins();
  std::string PinsJsonLocked() const;   // requires mu_
  std::string IndexJsonLocked() const;  // requires mu_
  bool PinnedLocked(const Digest& digest, std::chrono::system_clock::time_point now) const;
  void DropExpiredLocked(std::chrono::system_clock::time_point now);
  std::chrono::system_clock::time_point Now() const;

  std::string root_;
  int cleaned_temp_files_ = 0;

  mutable std::mutex mu_;
  std::mutex flush_mu_;  // one file write at a time; taken before mu_, never while holding it
  bool pins_dirty_ = false;  // GUARDED_BY(mu_): expired pins dropped since pins.json was saved
  Clock clock_;                                   // GUARDED_BY(mu_)
  uint64_t budget_ = 0;                           // GUARDED_BY(mu_)
  std::optional<double> budget_percent_;          // GUARDED_BY(mu_): "N%" budgets
  uint64_t reserved_ = 0;                         // GUARDED_BY(mu_): in-flight bytes
  uint64_t total_bytes_ = 0;                      // GUARDED_BY(mu_)
  uint64_t seq_ = 0;                              // GUARDED_BY(mu_)
  uint64_t evictions_ = 0;                        // GUARDED_BY(mu_)
  std::unordered_map<Digest, IndexEntry> index_;  // GUARDED_BY(mu_): complete blobs
  std::unordered_map<Digest, int> users_;         // GUARDED_BY(mu_): in-use counts
  std::map<Digest, std::map<std::string, shoal::store::Pin>> pins_;  // GUARDED_BY(mu_): by owner
  std::function<void(const Digest&)> evict_hook_;                    // GUARDED_BY(mu_)
  std::function<uint64_t()> external_;  // set before use; called without mu_
  friend class BlobWriter;
};

}  // namespace shoal::store
