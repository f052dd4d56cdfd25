#include "lib/store/blob_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "lib/core/atomic_file.h"
#include "lib/core/content_hash.h"

namespace shoal::store {
namespace fs = std::filesystem;
namespace {

using TimePoint = std::chrono::system_clock::time_point;

Error IoError(std::string_view what, const std::string& path, int err) {
  return MakeError(ErrorCode::kIo, std::string(what) + " " + path + ": " + std::strerror(err));
}

std::string UniqueSuffix() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  std::ostringstream s;
  s << ::getpid() << "." << std::hex << (salt ^ counter.fetch_add(1));
  return s.str();
}

// Writes a whole small file under a unique temp name in tmp_dir and renames it into place
// (fsynced, with its directory).
Status WriteSmallFile(const std::string& tmp_dir, const std::string& path,
                      std::string_view content) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  return WriteFileAtomic(tmp_dir + "/small." + UniqueSuffix(), path, content);
}

}  // namespace

BlobWriter::BlobWriter(BlobStore* store, Digest digest, int fd, std::string temp_path,
                       std::string final_path)
    : store_(store),
      digest_(std::move(digest)),
      in_use_(store->MarkInUse(digest_)),
      fd_(fd),
      temp_path_(std::move(temp_path)),
      final_path_(std::move(final_path)) {}

BlobWriter::~BlobWriter() {
  if (!done_) ::unlink(temp_path_.c_str());
  ::close(fd_);
  store_->Unreserve(reserved_);
}

Status BlobWriter::PWrite(const char* data, size_t size, uint64_t offset) {
  while (size > 0) {
    ssize_t n = ::pwrite(fd_, data, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError("write", temp_path_, errno);
    }
    data += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Ok();
}

void BlobWriter::StartWriteback(uint64_t offset, uint64_t length) const {
  if (length == 0) return;
  // Not a durability point (fsync is): this only spreads the writeback over the download, where
  // it otherwise came all at once at the end (1.2-1.4 s for six 256 MiB blobs at the end of a
  // swarm bench run, with the clients' own fsyncs queued behind it).
  (void)::sync_file_range(fd_, static_cast<off64_t>(offset), static_cast<off64_t>(length),
                          SYNC_FILE_RANGE_WRITE);
}

Status BlobWriter::Commit() {
  if (done_) return MakeError(ErrorCode::kInternal, "commit twice: " + temp_path_);
  if (::fsync(fd_) != 0) return IoError("fsync", temp_path_, errno);
  std::error_code ec;
  fs::create_directories(fs::path(final_path_).parent_path(), ec);
  if (ec) return MakeError(ErrorCode::kIo, "mkdir for " + final_path_ + ": " + ec.message());
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    return IoError("rename into", final_path_, errno);
  }
  done_ = true;
  struct stat st;
  if (::fstat(fd_, &st) == 0) store_->Added(digest_, static_cast<uint64_t>(st.st_size));
  store_->Unreserve(reserved_);  // now counted as a cached blob
  reserved_ = 0;
  // From here on the blob is a cache entry like any other: whoever still reads it through fd()
  // (a reader of the fetch) holds its own MarkInUse handle. The writer itself may live on for
  // as long as its chunk torrents seed from fd(), which must not pin the blob forever.
  in_use_.reset();
  return FsyncDir(fs::path(final_path_).parent_path().string());
}

void BlobWriter::Abort() {
  if (!done_) ::unlink(temp_path_.c_str());
  done_ = true;
  // The inode lives on while readers hold fd(), but it no longer counts against the budget;
  // truncating it would give those readers short reads, so its blocks go with the last fd.
  store_->Unreserve(reserved_);
  reserved_ = 0;
}

Result<std::unique_ptr<BlobStore>> BlobStore::Open(std::string root) {
  std::error_code ec;
  for (const char* sub : {"blobs/sha256", "blobs/sha512", "tmp", "meta"}) {
    fs::create_directories(fs::path(root) / sub, ec);
    if (ec) return MakeError(ErrorCode::kIo, "create " + root + "/" + sub + ": " + ec.message());
  }
  std::unique_ptr<BlobStore> store(new BlobStore(root));
  for (const auto& entry : fs::directory_iterator(fs::path(root) / "tmp", ec)) {
    std::error_code rm_ec;
    fs::remove_all(entry.path(), rm_ec);
    if (!rm_ec) ++store->cleaned_temp_files_;
  }
  if (ec) return MakeError(ErrorCode::kIo, "list " + root + "/tmp: " + ec.message());
  store->LoadIndex();
  return store;
}

std::string BlobStore::BlobPath(const Digest& digest) const {
  const std::string& hex = digest.hex();
  return root_ + "/blobs/" + std::string(DigestAlgorithmName(digest.algorithm())) + "/" +
         hex.substr(0, 2) + "/" + hex;
}

std::optional<uint64_t> BlobStore::Stat(const Digest& digest) const {
  struct stat st;
  if (::stat(BlobPath(digest).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return static_cast<uint64_t>(st.st_size);
}

Result<int> BlobStore::OpenBlob(const Digest& digest) const {
  std::string path = BlobPath(digest);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return MakeError(ErrorCode::kNotFound, "blob not cached: " + digest.str());
    return IoError("open", path, errno);
  }
  return fd;
}

Result<std::unique_ptr<BlobWriter>> BlobStore::Create(const Digest& digest, uint64_t size) {
  if (size > 0) {
    if (std::string why = MakeRoomInBudget(digest, size); !why.empty()) {
      return MakeError(ErrorCode::kInsufficientStorage,
                       "blob " + digest.str() + " (" + std::to_string(size) +
                           " bytes) cannot fit in this node's cache: " + why);
    }
  }
  std::string tmp = root_ + "/tmp/" + digest.hex() + "." + UniqueSuffix() + ".partial";
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    Unreserve(size);
    if (errno == ENOSPC || errno == EDQUOT) {
      return MakeError(ErrorCode::kInsufficientStorage,
                       "blob " + digest.str() + " cannot fit in this node's cache: create " + tmp +
                           ": " + std::strerror(errno));
    }
    return IoError("create", tmp, errno);
  }
  std::unique_ptr<BlobWriter> writer(new BlobWriter(this, digest, fd, tmp, BlobPath(digest)));
  writer->reserved_ = size;  // from here on the writer gives it back
  if (size > 0) {
    if (std::string why = AllocateEvicting(digest, fd, size); !why.empty()) {
      return MakeError(ErrorCode::kInsufficientStorage,
                       "blob " + digest.str() + " (" + std::to_string(size) +
                           " bytes) cannot fit in this node's cache: " + why);
    }
  }
  return writer;
}

void BlobStore::Unreserve(uint64_t size) {
  if (size == 0) return;
  std::lock_guard lk(mu_);
  reserved_ -= std::min(reserved_, size);
}

uint64_t BlobStore::BudgetLocked() const {
  if (!budget_percent_) return budget_;
  struct statvfs vfs;
  if (::statvfs(root_.c_str(), &vfs) != 0) return budget_;  // the last measure
  double fs_bytes = static_cast<double>(vfs.f_blocks) * static_cast<double>(vfs.f_frsize);
  return static_cast<uint64_t>(fs_bytes * *budget_percent_ / 100.0);
}

void BlobStore::SetExternalUsage(std::function<uint64_t()> used) { external_ = std::move(used); }

std::string BlobStore::SpaceReport() const {
  TimePoint now = Now();
  const uint64_t external = External();
  std::lock_guard lk(mu_);
  uint64_t pinned = 0, in_use = 0;
  for (const auto& [digest, e] : index_) {
    if (PinnedLocked(digest, now)) {
      pinned += e.size;
    } else if (users_.count(digest) > 0) {
      in_use += e.size;
    }
  }
  std::string out = "budget " + std::to_string(BudgetLocked()) + " bytes; cached " +
                    std::to_string(total_bytes_) + " (pinned " + std::to_string(pinned) +
                    ", in use " + std::to_string(in_use) + "); in flight " +
                    std::to_string(reserved_);
  if (external_) out += "; extracted layers (snapshotter) " + std::to_string(external);
  struct statvfs vfs;
  if (::statvfs(root_.c_str(), &vfs) == 0) {
    out += "; free on disk " + std::to_string(static_cast<uint64_t>(vfs.f_bavail) *
                                              static_cast<uint64_t>(vfs.f_frsize));
  }
  return out;
}

uint64_t BlobStore::EvictableBytesLocked(TimePoint now) const {
  uint64_t out = 0;
  for (const auto& [digest, e] : index_) {
    if (users_.count(digest) == 0 && !PinnedLocked(digest, now)) out += e.size;
  }
  return out;
}

std::string BlobStore::MakeRoomInBudget(const Digest& digest, uint64_t size) {
  for (;;) {
    {
      TimePoint now = Now();
      const uint64_t external = External();
      std::lock_guard lk(mu_);
      uint64_t budget = BudgetLocked();
      // A pinned blob (a prefetch, an operator's pin) is wanted whatever the budget, which is
      // for what LRU eviction manages; only the disk itself (AllocateEvicting) limits it.
      if (budget == 0 || total_bytes_ + external + reserved_ + size <= budget ||
          PinnedLocked(digest, now)) {
        reserved_ += size;
        return "";
      }
      // Not even evicting everything evictable would do: say so and keep the cache.
      if (total_bytes_ - EvictableBytesLocked(now) + external + reserved_ + size > budget) break;
    }
    if (!EvictOne(digest)) break;
  }
  return SpaceReport();
}

std::string BlobStore::AllocateEvicting(const Digest& digest, int fd, uint64_t size) {
  for (;;) {
    int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
    if (rc == 0) return "";
    if (rc == EOPNOTSUPP || rc == EINVAL) return "";  // no fallocate here: writes will tell
    if (rc != ENOSPC && rc != EDQUOT) return std::string("fallocate: ") + std::strerror(rc);
    struct statvfs vfs;
    uint64_t avail = ::statvfs(root_.c_str(), &vfs) == 0
                         ? static_cast<uint64_t>(vfs.f_bavail) * static_cast<uint64_t>(vfs.f_frsize)
                         : 0;
    uint64_t evictable = 0;
    {
      TimePoint now = Now();
      std::lock_guard lk(mu_);
      evictable = EvictableBytesLocked(now);
    }
    if (avail + evictable < size || !EvictOne(digest)) {
      return std::string("the disk is full; ") + SpaceReport();
    }
  }
}

bool BlobStore::EvictOne(const Digest& keep) {
  TimePoint now = Now();
  std::function<void(const Digest&)> hook;
  std::optional<Digest> victim;
  {
    std::lock_guard lk(mu_);
    DropExpiredLocked(now);
    hook = evict_hook_;
    std::pair<TimePoint, uint64_t> oldest{TimePoint::max(), 0};
    for (const auto& [digest, e] : index_) {
      if (digest == keep || users_.count(digest) > 0 || PinnedLocked(digest, now)) continue;
      std::pair<TimePoint, uint64_t> when{e.last_use, e.seq};
      if (!victim || when < oldest) {
        oldest = when;
        victim = digest;
      }
    }
  }
  if (!victim) return false;
  if (hook) hook(*victim);
  std::lock_guard lk(mu_);
  auto it = index_.find(*victim);
  // The hook ran unlocked: if the blob became used or pinned meanwhile, report progress anyway
  // (the caller measures again) but keep it.
  if (it == index_.end() || users_.count(*victim) > 0 || PinnedLocked(*victim, now)) return true;
  std::string path = BlobPath(*victim);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return false;
  ::unlink((root_ + "/meta/" + victim->hex() + ".json").c_str());
  total_bytes_ -= it->second.size;
  index_.erase(it);
  ++evictions_;
  return true;
}

Status BlobStore::PutManifest(const Digest& digest, std::string_view body,
                              std::string_view media_type) {
  Digest actual = ContentHash::Of(digest.algorithm(), body);
  if (actual != digest) {
    return MakeError(ErrorCode::kDigestMismatch,
                     "manifest bytes hash to " + actual.str() + ", not " + digest.str());
  }
  nlohmann::json meta = {{"mediaType", media_type}, {"size", body.size()}};
  auto st = WriteSmallFile(root_ + "/tmp", root_ + "/meta/" + digest.hex() + ".json", meta.dump());
  if (!st) return st;
  st = WriteSmallFile(root_ + "/tmp", BlobPath(digest), body);
  if (st) Added(digest, body.size());
  return st;
}

std::optional<StoredManifest> BlobStore::GetManifest(const Digest& digest) const {
  std::ifstream meta_in(root_ + "/meta/" + digest.hex() + ".json");
  std::ifstream body_in(BlobPath(digest), std::ios::binary);
  if (!meta_in || !body_in) return std::nullopt;
  auto meta = nlohmann::json::parse(meta_in, nullptr, false);
  if (meta.is_discarded() || !meta.contains("mediaType") || !meta["mediaType"].is_string()) {
    return std::nullopt;
  }
  std::ostringstream body;
  body << body_in.rdbuf();
  StoredManifest m{body.str(), meta["mediaType"].get<std::string>()};
  if (!ContentHash::Matches(digest, m.body)) return std::nullopt;
  const_cast<BlobStore*>(this)->Touch(digest);
  return m;
}

// --- Budget, last use and pins ---

namespace {

// The shard directories blobs/<algorithm>/<xx> of both digest algorithms.
std::vector<fs::directory_entry> ShardDirs(const std::string& root) {
  std::vector<fs::directory_entry> out;
  for (const char* algo : {"sha256", "sha512"}) {
    std::error_code ec;
    for (const auto& shard : fs::directory_iterator(fs::path(root) / "blobs" / algo, ec)) {
      out.push_back(shard);
    }
  }
  return out;
}

int64_t ToMs(TimePoint t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}
TimePoint FromMs(int64_t ms) { return TimePoint(std::chrono::milliseconds(ms)); }

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

Result<uint64_t> ParseBudget(std::string_view spec, const std::string& path) {
  std::string text(spec);
  auto bad = [&](const std::string& why) {
    return MakeError(ErrorCode::kInvalidArgument, "cache budget \"" + text + "\": " + why);
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) return bad("expected a number, e.g. 50GiB or 80%");
  double number = 0;
  try {
    number = std::stod(text.substr(0, i));
  } catch (const std::exception&) {
    return bad("not a number");
  }
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  if (unit == "%") {
    if (number > 100) return bad("a percentage must be at most 100");
    struct statvfs vfs;
    if (::statvfs(path.c_str(), &vfs) != 0) return IoError("statvfs", path, errno);
    double fs_bytes = static_cast<double>(vfs.f_blocks) * static_cast<double>(vfs.f_frsize);
    return static_cast<uint64_t>(fs_bytes * number / 100.0);
  }
  std::string u;
  for (char c : unit) u += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> kUnits = {{"", 1},
                                                       {"b", 1},
                                                       {"k", 1024.0},
                                                       {"kib", 1024.0},
                                                       {"kb", 1e3},
                                                       {"m", 1 << 20},
                                                       {"mib", 1 << 20},
                                                       {"mb", 1e6},
                                                       {"g", 1 << 30},
                                                       {"gib", 1 << 30},
                                                       {"gb", 1e9},
                                                       {"t", 1099511627776.0},
                                                       {"tib", 1099511627776.0},
                                                       {"tb", 1e12}};
  auto it = kUnits.find(u);
  if (it == kUnits.end())
    return bad("unknown unit \"" + unit + "\" (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB or %)");
  return static_cast<uint64_t>(number * it->second);
}

TimePoint BlobStore::Now() const {
  std::lock_guard lk(mu_);
  return clock_ ? clock_() : std::chrono::system_clock::now();
}

void BlobStore::SetClock(Clock clock) {
  std::lock_guard lk(mu_);
  clock_ = std::move(clock);
}

void BlobStore::SetBudget(uint64_t bytes) {
  std::lock_guard lk(mu_);
  budget_ = bytes;
  budget_percent_.reset();
}

Status BlobStore::SetBudgetSpec(std::string_view spec) {
  auto bytes = ParseBudget(spec, root_);
  if (!bytes) return bytes.error();
  std::string text(spec);
  std::lock_guard lk(mu_);
  budget_ = bytes.value();
  budget_percent_.reset();
  if (!text.empty() && text.back() == '%') budget_percent_ = std::stod(text);
  return Ok();
}

void BlobStore::SetEvictHook(std::function<void(const Digest&)> hook) {
  std::lock_guard lk(mu_);
  evict_hook_ = std::move(hook);
}

void BlobStore::Added(const Digest& digest, uint64_t size) {
  TimePoint now = Now();
  std::lock_guard lk(mu_);
  auto [it, inserted] = index_.try_emplace(digest);
  if (!inserted) total_bytes_ -= it->second.size;
  it->second.size = size;
  it->second.last_use = now;
  it->second.seq = ++seq_;
  total_bytes_ += size;
}

void BlobStore::Touch(const Digest& digest) {
  TimePoint now = Now();
  std::lock_guard lk(mu_);
  auto it = index_.find(digest);
  if (it == index_.end()) return;
  it->second.last_use = std::max(it->second.last_use, now);
  it->second.seq = ++seq_;
}

std::shared_ptr<void> BlobStore::MarkInUse(const Digest& digest) {
  {
    std::lock_guard lk(mu_);
    ++users_[digest];
  }
  // The deleter only holds the digest: the store outlives every handle (readers and writers are
  // gone before the agent destroys its store).
  return std::shared_ptr<void>(nullptr, [this, digest](void*) { Release(digest); });
}

bool BlobStore::InUse(const Digest& digest) const {
  std::lock_guard lk(mu_);
  return users_.count(digest) > 0;
}

void BlobStore::Release(const Digest& digest) {
  std::lock_guard lk(mu_);
  auto it = users_.find(digest);
  if (it != users_.end() && --it->second <= 0) users_.erase(it);
}

bool BlobStore::PinnedLocked(const Digest& digest, TimePoint now) const {
  auto it = pins_.find(digest);
  if (it == pins_.end()) return false;
  for (const auto& [owner, pin] : it->second) {
    if (!pin.expires || *pin.expires > now) return true;
  }
  return false;
}

void BlobStore::DropExpiredLocked(TimePoint now) {
  bool changed = false;
  for (auto it = pins_.begin(); it != pins_.end();) {
    for (auto p = it->second.begin(); p != it->second.end();) {
      if (p->second.expires && *p->second.expires <= now) {
        p = it->second.erase(p);
        changed = true;
      } else {
        ++p;
      }
    }
    it = it->second.empty() ? pins_.erase(it) : std::next(it);
  }
  // Saved with the next Pin, Unpin or Flush (off this lock): an expired pin that comes back
  // after a crash expires again at load.
  if (changed) pins_dirty_ = true;
}

Status BlobStore::SavePins() {
  std::lock_guard saving(flush_mu_);
  std::string json;
  {
    std::lock_guard lk(mu_);
    json = PinsJsonLocked();
    pins_dirty_ = false;
  }
  return WriteSmallFile(root_ + "/tmp", root_ + "/pins.json", json);
}

std::string BlobStore::PinsJsonLocked() const {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& [digest, by_owner] : pins_) {
    for (const auto& [owner, pin] : by_owner) {
      nlohmann::json j = {{"digest", digest.str()}, {"owner", owner}, {"reason", pin.reason}};
      if (pin.expires) j["expires_ms"] = ToMs(*pin.expires);
      arr.push_back(j);
    }
  }
  return arr.dump(1);
}

Status BlobStore::Pin(const Digest& digest, std::string owner, std::string reason,
                      std::optional<std::chrono::seconds> ttl) {
  TimePoint now = Now();
  {
    std::lock_guard lk(mu_);
    shoal::store::Pin pin{owner, std::move(reason), std::nullopt};
    if (ttl && ttl->count() > 0) pin.expires = now + *ttl;
    pins_[digest].insert_or_assign(std::move(owner), std::move(pin));
  }
  return SavePins();
}

Result<int> BlobStore::Unpin(const Digest& digest, const std::string& owner) {
  int removed = 0;
  {
    std::lock_guard lk(mu_);
    auto it = pins_.find(digest);
    if (it == pins_.end()) return 0;
    if (owner.empty()) {
      removed = static_cast<int>(it->second.size());
      pins_.erase(it);
    } else {
      removed = static_cast<int>(it->second.erase(owner));
      if (it->second.empty()) pins_.erase(it);
    }
  }
  if (removed == 0) return 0;
  if (auto st = SavePins(); !st) return st.error();
  return removed;
}

std::map<Digest, std::vector<Pin>> BlobStore::Pins() const {
  TimePoint now = Now();
  std::lock_guard lk(mu_);
  std::map<Digest, std::vector<shoal::store::Pin>> out;
  for (const auto& [digest, by_owner] : pins_) {
    for (const auto& [owner, pin] : by_owner) {
      if (!pin.expires || *pin.expires > now) out[digest].push_back(pin);
    }
  }
  return out;
}

bool BlobStore::IsPinned(const Digest& digest) const {
  TimePoint now = Now();
  std::lock_guard lk(mu_);
  return PinnedLocked(digest, now);
}

std::vector<CacheEntry> BlobStore::List() const {
  TimePoint now = Now();
  std::lock_guard lk(mu_);
  std::vector<std::pair<std::pair<TimePoint, uint64_t>, CacheEntry>> rows;
  for (const auto& [digest, e] : index_) {
    CacheEntry c{digest, e.size, e.last_use, users_.count(digest) > 0, {}};
    if (auto p = pins_.find(digest); p != pins_.end()) {
      for (const auto& [owner, pin] : p->second) {
        if (!pin.expires || *pin.expires > now) c.pins.push_back(pin);
      }
    }
    rows.push_back({{e.last_use, e.seq}, std::move(c)});
  }
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<CacheEntry> out;
  out.reserve(rows.size());
  for (auto& r : rows) out.push_back(std::move(r.second));
  return out;
}

CacheStats BlobStore::Stats() const {
  TimePoint now = Now();
  const uint64_t external = External();
  std::lock_guard lk(mu_);
  CacheStats s;
  s.external_bytes = external;
  s.bytes = total_bytes_;
  s.budget = BudgetLocked();
  s.inflight_bytes = reserved_;
  s.blobs = index_.size();
  s.evictions = evictions_;
  for (const auto& [digest, e] : index_) {
    if (PinnedLocked(digest, now)) s.pinned_bytes += e.size;
  }
  return s;
}

EvictReport BlobStore::Evict() {
  uint64_t budget;
  {
    std::lock_guard lk(mu_);
    budget = BudgetLocked();
  }
  if (budget == 0) {
    EvictReport none;
    TimePoint now = Now();
    std::lock_guard lk(mu_);
    DropExpiredLocked(now);
    return none;
  }
  return EvictTo(budget);
}

EvictReport BlobStore::EvictTo(uint64_t budget) {
  EvictReport report;
  TimePoint now = Now();
  std::function<void(const Digest&)> hook;
  std::vector<std::pair<std::pair<TimePoint, uint64_t>, Digest>> order;
  {
    std::lock_guard lk(mu_);
    DropExpiredLocked(now);
    hook = evict_hook_;
    for (const auto& [digest, e] : index_) order.push_back({{e.last_use, e.seq}, digest});
  }
  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  // The snapshotter's layers are not evicted here: the blobs make room for them.
  const uint64_t external = External();
  const uint64_t blob_budget = budget > external ? budget - external : 0;
  for (const auto& [when, digest] : order) {
    {
      std::lock_guard lk(mu_);
      if (total_bytes_ <= blob_budget) break;
      auto it = index_.find(digest);
      // Re-checked under the lock: a reader may have opened it, or someone pinned it, since.
      if (it == index_.end() || users_.count(digest) > 0 || PinnedLocked(digest, now)) continue;
    }
    if (hook) hook(digest);
    std::lock_guard lk(mu_);
    auto it = index_.find(digest);
    // The hook ran unlocked: skip the blob if it became used or pinned meanwhile.
    if (it == index_.end() || users_.count(digest) > 0 || PinnedLocked(digest, now)) continue;
    std::string path = BlobPath(digest);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) continue;
    ::unlink((root_ + "/meta/" + digest.hex() + ".json").c_str());
    total_bytes_ -= it->second.size;
    report.freed_bytes += it->second.size;
    report.evicted.push_back(digest);
    index_.erase(it);
    ++evictions_;
  }
  {
    std::lock_guard lk(mu_);
    report.over_budget = total_bytes_ + external > budget ? total_bytes_ + external - budget : 0;
  }
  return report;
}

bool BlobStore::DropCorrupt(const Digest& digest, uint64_t inode) {
  const std::string path = BlobPath(digest);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_ino) != inode) return false;
  std::function<void(const Digest&)> hook;
  {
    std::lock_guard lk(mu_);
    hook = evict_hook_;
  }
  if (hook) hook(digest);
  std::lock_guard lk(mu_);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return false;
  ::unlink((root_ + "/meta/" + digest.hex() + ".json").c_str());
  if (auto it = index_.find(digest); it != index_.end()) {
    total_bytes_ -= it->second.size;
    index_.erase(it);
  }
  return true;
}

std::string BlobStore::IndexJsonLocked() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [digest, e] : index_) j[digest.hex()] = ToMs(e.last_use);
  return j.dump();
}

Status BlobStore::Flush() {
  // The fsync happens outside mu_, so that Stat, Touch and MarkInUse (the network thread's
  // calls) never wait for the disk; flush_mu_ keeps the snapshots in the order they were taken.
  bool pins_dirty = false;
  {
    std::lock_guard lk(mu_);
    pins_dirty = pins_dirty_;
  }
  if (pins_dirty) {
    if (auto st = SavePins(); !st) return st;
  }
  std::lock_guard flushing(flush_mu_);
  std::string json;
  {
    std::lock_guard lk(mu_);
    json = IndexJsonLocked();
  }
  return WriteSmallFile(root_ + "/tmp", root_ + "/meta/access.json", json);
}

void BlobStore::LoadIndex() {
  std::lock_guard lk(mu_);
  std::map<std::string, int64_t> last_use;
  if (auto text = ReadSmallFile(root_ + "/meta/access.json")) {
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_object()) {
      for (const auto& [hex, ms] : j.items()) {
        if (ms.is_number_integer()) last_use[hex] = ms.get<int64_t>();
      }
    }
  }
  std::error_code ec;
  for (const auto& shard : ShardDirs(root_)) {
    std::error_code ec2;
    for (const auto& f : fs::directory_iterator(shard.path(), ec2)) {
      auto digest = Digest::Parse(shard.path().parent_path().filename().string() + ":" +
                                  f.path().filename().string());
      if (!digest) continue;
      struct stat st;
      if (::stat(f.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      IndexEntry e;
      e.size = static_cast<uint64_t>(st.st_size);
      auto lu = last_use.find(f.path().filename().string());
      e.last_use =
          lu != last_use.end() ? FromMs(lu->second) : TimePoint(std::chrono::seconds(st.st_mtime));
      total_bytes_ += e.size;
      index_.insert_or_assign(digest.value(), e);
    }
  }
  if (auto text = ReadSmallFile(root_ + "/pins.json")) {
    auto arr = nlohmann::json::parse(*text, nullptr, false);
    if (arr.is_array()) {
      for (const auto& j : arr) {
        if (!j.is_object() || !j.contains("digest") || !j["digest"].is_string()) continue;
        auto digest = Digest::Parse(j["digest"].get<std::string>());
        if (!digest) continue;
        shoal::store::Pin pin{j.value("owner", std::string("operator")),
                              j.value("reason", std::string()), std::nullopt};
        if (j.contains("expires_ms") && j["expires_ms"].is_number_integer())
          pin.expires = FromMs(j["expires_ms"].get<int64_t>());
        std::string owner = pin.owner;
        pins_[digest.value()].insert_or_assign(owner, std::move(pin));
      }
    }
  }
}

}  // namespace shoal::store
