#include "snapshotter/store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "lib/core/atomic_file.h"

namespace shoal::snapshotter {
namespace fs = std::filesystem;

namespace {

// containerd's limit on a label (key and value together), checked by its metadata layer too.
constexpr size_t kMaxLabelBytes = 4096;
constexpr int kMetadataVersion = 1;

StoreError Err(Errc code, std::string message) { return StoreError{code, std::move(message)}; }

StoreError IoErr(const std::string& what, const std::string& path, int err) {
  return Err(Errc::kIo, what + " " + path + ": " + std::strerror(err));
}

StoreResult<void> CheckLabels(const Labels& labels) {
  for (const auto& [k, v] : labels) {
    if (k.size() + v.size() > kMaxLabelBytes) {
      return Err(Errc::kInvalidArgument, "label \"" + k.substr(0, 64) + "\" is " +
                                             std::to_string(k.size() + v.size()) +
                                             " bytes with its value, over the limit of 4096");
    }
  }
  return boost::outcome_v2::success();
}

int64_t ToNanos(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

std::chrono::system_clock::time_point FromNanos(int64_t ns) {
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::nanoseconds(ns)));
}

// Replaces dir/name with content atomically (lib/core/atomic_file.h): a crash leaves either
// the old file or the new one. One writer at a time (the store's mutex).
StoreResult<void> WriteFileAtomic(const std::string& dir, const std::string& name,
                                  const std::string& content) {
  const std::string path = dir + "/" + name;
  ::unlink((path + ".tmp").c_str());  // left by a crash: the write below creates it exclusively
  Status written = shoal::WriteFileAtomic(path + ".tmp", path, content, 0600);
  if (!written) return Err(Errc::kIo, written.error().message);
  return boost::outcome_v2::success();
}

// Whether the name of an entry under snapshots/ is an id (a snapshot's directory) rather than a
// temporary "new-XXXXXX" directory of an unfinished Create.
bool IsIdName(const std::string& name, uint64_t* id) {
  if (name.empty() || name.size() > 19) return false;
  for (char c : name)
    if (c < '0' || c > '9') return false;
  *id = std::strtoull(name.c_str(), nullptr, 10);
  return true;
}

}  // namespace

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kView: return "view";
    case Kind::kActive: return "active";
    case Kind::kCommitted: return "committed";
  }
  return "unknown";
}

std::string StoreError::ToString() const {
  const char* name = "io";
  switch (code) {
    case Errc::kNotFound: name = "not_found"; break;
    case Errc::kAlreadyExists: name = "already_exists"; break;
    case Errc::kFailedPrecondition: name = "failed_precondition"; break;
    case Errc::kInvalidArgument: name = "invalid_argument"; break;
    case Errc::kIo: name = "io"; break;
  }
  return std::string(name) + ": " + message;
}

StoreResult<Usage> DiskUsage(const std::string& dir) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT) return Err(Errc::kNotFound, "snapshot directory " + dir + " is missing");
    return IoErr("stat", dir, err);
  }
  Usage usage;
  // Hard links share an inode: count each (device, inode) once, like du and containerd.
  std::set<std::pair<dev_t, ino_t>> seen;
  auto count = [&](const struct stat& s) {
    if (!seen.insert({s.st_dev, s.st_ino}).second) return;
    usage.inodes += 1;
    usage.size += static_cast<int64_t>(s.st_blocks) * 512;
  };
  count(st);
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (::lstat(it->path().c_str(), &st) != 0) {
      if (errno == ENOENT) continue;  // deleted while we walk
      return IoErr("stat", it->path().string(), errno);
    }
    count(st);
  }
  if (ec) return Err(Errc::kIo, "walk " + dir + ": " + ec.message());
  return usage;
}

Store::Store(std::string root) : root_(std::move(root)) {}

StoreResult<std::unique_ptr<Store>> Store::Open(const std::string& root) {
  if (root.empty()) return Err(Errc::kInvalidArgument, "snapshot store: empty root directory");
  std::error_code ec;
  fs::create_directories(root + "/snapshots", ec);
  if (ec) return Err(Errc::kIo, "create " + root + "/snapshots: " + ec.message());
  ::chmod(root.c_str(), 0700);
  std::unique_ptr<Store> store(new Store(fs::absolute(root).lexically_normal().string()));
  // containerd's overlay snapshotter mounts with index=off whenever the kernel has the option,
  // so that a lower layer shared by two mounts is not tied to the first upper dir it met.
  store->index_off_ = fs::exists("/sys/module/overlay/parameters/index", ec);
  if (auto st = store->Load(); !st) return st.error();
  return store;
}

std::string Store::FsPath(uint64_t id) const {
  return root_ + "/snapshots/" + std::to_string(id) + "/fs";
}

std::string Store::WorkPath(uint64_t id) const {
  return root_ + "/snapshots/" + std::to_string(id) + "/work";
}

StoreResult<void> Store::Load() {
  const std::string path = root_ + "/metadata.json";
  std::error_code ec;
  if (fs::exists(path, ec)) {
    if (auto st = LoadRecords(path); !st) return st.error();
  }
  // A crash between a Create's rename and its Save leaves a directory with the next id: never
  // hand that id out again (Cleanup deletes the directory).
  for (fs::directory_iterator it(root_ + "/snapshots", ec), end; !ec && it != end;
       it.increment(ec)) {
    uint64_t id = 0;
    if (IsIdName(it->path().filename().string(), &id) && id >= next_id_) next_id_ = id + 1;
  }
  if (ec) return Err(Errc::kIo, "list " + root_ + "/snapshots: " + ec.message());
  CountCommittedLocked();
  return boost::outcome_v2::success();
}

void Store::CountCommittedLocked() {
  uint64_t total = 0;
  for (const auto& [key, r] : records_) {
    if (r.info.kind == Kind::kCommitted)
      total += static_cast<uint64_t>(std::max<int64_t>(0, r.usage.size));
  }
  committed_bytes_.store(total, std::memory_order_relaxed);
}

StoreResult<void> Store::LoadRecords(const std::string& path) {
  std::string text;
  {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return IoErr("open", path, errno);
    char buf[65536];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        int err = errno;
        ::close(fd);
        return IoErr("read", path, err);
      }
      if (n == 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
  }
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return Err(Errc::kIo, "snapshot metadata " + path + " is not a JSON object");
  }
  // Field types are checked by nlohmann's get<>, which throws; this runs at startup only.
  try {
    if (doc.value("version", 0) != kMetadataVersion) {
      return Err(Errc::kIo, "snapshot metadata " + path + " has version " +
                                doc.value("version", nlohmann::json()).dump() + ", not 1");
    }
    next_id_ = doc.at("next_id").get<uint64_t>();
    for (const auto& s : doc.at("snapshots")) {
      Record r;
      r.id = s.at("id").get<uint64_t>();
      r.info.name = s.at("key").get<std::string>();
      r.info.parent = s.value("parent", "");
      std::string kind = s.at("kind").get<std::string>();
      if (kind == "active") {
        r.info.kind = Kind::kActive;
      } else if (kind == "view") {
        r.info.kind = Kind::kView;
      } else if (kind == "committed") {
        r.info.kind = Kind::kCommitted;
      } else {
        return Err(Errc::kIo, "snapshot metadata " + path + ": snapshot \"" + r.info.name +
                                  "\" has unknown kind \"" + kind + "\"");
      }
      r.info.created = FromNanos(s.at("created_ns").get<int64_t>());
      r.info.updated = FromNanos(s.at("updated_ns").get<int64_t>());
      r.info.labels = s.value("labels", Labels{});
      r.usage.size = s.value("size", int64_t{0});
      r.usage.inodes = s.value("inodes", int64_t{0});
      if (r.id >= next_id_) next_id_ = r.id + 1;
      records_[r.info.name] = std::move(r);
    }
  } catch (const nlohmann::json::exception& e) {
    return Err(Errc::kIo, "snapshot metadata " + path + " is malformed: " + e.what());
  }
  for (const auto& [key, r] : records_) {
    if (!r.info.parent.empty() && !records_.count(r.info.parent)) {
      return Err(Errc::kIo, "snapshot metadata " + path + ": snapshot \"" + key +
                                "\" has parent \"" + r.info.parent + "\", which is not recorded");
    }
  }
  return boost::outcome_v2::success();
}

StoreResult<void> Store::Save() const {
  nlohmann::json snaps = nlohmann::json::array();
  for (const auto& [key, r] : records_) {
    nlohmann::json s = {{"key", key},
                        {"id", r.id},
                        {"kind", KindName(r.info.kind)},
                        {"created_ns", ToNanos(r.info.created)},
                        {"updated_ns", ToNanos(r.info.updated)},
                        {"labels", r.info.labels}};
    if (!r.info.parent.empty()) s["parent"] = r.info.parent;
    if (r.info.kind == Kind::kCommitted) {
      s["size"] = r.usage.size;
      s["inodes"] = r.usage.inodes;
    }
    snaps.push_back(std::move(s));
  }
  nlohmann::json doc = {{"version", kMetadataVersion}, {"next_id", next_id_}, {"snapshots", snaps}};
  return WriteFileAtomic(root_, "metadata.json", doc.dump());
}

std::vector<uint64_t> Store::ParentIds(const std::string& parent) const {
  std::vector<uint64_t> ids;
  for (std::string p = parent; !p.empty();) {
    auto it = records_.find(p);
    if (it == records_.end()) break;  // Load and Create keep chains whole
    ids.push_back(it->second.id);
    p = it->second.info.parent;
  }
  return ids;
}

std::vector<Mount> Store::MountsOf(const Record& r) const {
  std::vector<uint64_t> parents = ParentIds(r.info.parent);
  // As containerd's overlay snapshotter: a snapshot without parents is a bind mount of its own
  // directory (overlay needs a lower dir), a view of one layer a read-only bind of that layer.
  if (parents.empty()) {
    return {Mount{"bind", FsPath(r.id), {r.info.kind == Kind::kView ? "ro" : "rw", "rbind"}}};
  }
  std::vector<std::string> options;
  if (index_off_) options.push_back("index=off");
  if (r.info.kind == Kind::kActive) {
    options.push_back("workdir=" + WorkPath(r.id));
    options.push_back("upperdir=" + FsPath(r.id));
  } else if (parents.size() == 1) {
    return {Mount{"bind", FsPath(parents.front()), {"ro", "rbind"}}};
  }
  std::string lower = "lowerdir=";
  for (size_t i = 0; i < parents.size(); ++i) {
    if (i > 0) lower += ":";
    lower += FsPath(parents[i]);
  }
  options.push_back(std::move(lower));
  return {Mount{"overlay", "overlay", std::move(options)}};
}

StoreResult<std::vector<Mount>> Store::Prepare(const std::string& key, const std::string& parent,
                                               const Labels& labels) {
  return Create(Kind::kActive, key, parent, labels);
}

StoreResult<std::vector<Mount>> Store::View(const std::string& key, const std::string& parent,
                                            const Labels& labels) {
  return Create(Kind::kView, key, parent, labels);
}

StoreResult<std::vector<Mount>> Store::Create(Kind kind, const std::string& key,
                                              const std::string& parent, const Labels& labels) {
  if (key.empty()) return Err(Errc::kInvalidArgument, "snapshot key is empty");
  if (auto st = CheckLabels(labels); !st) return st.error();
  std::lock_guard<std::mutex> lock(mu_);
  if (records_.count(key)) return Err(Errc::kAlreadyExists, "snapshot \"" + key + "\" exists");
  const Record* parent_record = nullptr;
  if (!parent.empty()) {
    auto it = records_.find(parent);
    if (it == records_.end()) {
      return Err(Errc::kNotFound, "parent snapshot \"" + parent + "\" of \"" + key +
                                      "\" does not exist");
    }
    if (it->second.info.kind != Kind::kCommitted) {
      return Err(Errc::kInvalidArgument, "parent \"" + parent + "\" of \"" + key +
                                             "\" is not a committed snapshot");
    }
    parent_record = &it->second;
  }
  // The directory is built under a temporary name and renamed to its id, so a crash leaves
  // either nothing or a complete directory without a record, both of which Cleanup removes.
  std::string tmpl = root_ + "/snapshots/new-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return IoErr("create", tmpl, errno);
  const std::string td = tmpl;
  auto fail = [&](StoreError e) {
    std::error_code ec;
    fs::remove_all(td, ec);
    return e;
  };
  if (::mkdir((td + "/fs").c_str(), 0755) != 0) return fail(IoErr("create", td + "/fs", errno));
  if (kind == Kind::kActive && ::mkdir((td + "/work").c_str(), 0711) != 0) {
    return fail(IoErr("create", td + "/work", errno));
  }
  if (parent_record) {
    // The new upper dir takes the owner of the parent's root, as containerd's does.
    struct stat st;
    const std::string pfs = FsPath(parent_record->id);
    if (::stat(pfs.c_str(), &st) != 0) return fail(IoErr("stat parent", pfs, errno));
    if (::lchown((td + "/fs").c_str(), st.st_uid, st.st_gid) != 0) {
      return fail(IoErr("chown", td + "/fs", errno));
    }
  }
  Record r;
  r.id = next_id_;
  r.info.name = key;
  r.info.parent = parent;
  r.info.kind = kind;
  r.info.created = r.info.updated = std::chrono::system_clock::now();
  r.info.labels = labels;
  const std::string dir = root_ + "/snapshots/" + std::to_string(r.id);
  if (::rename(td.c_str(), dir.c_str()) != 0) return fail(IoErr("rename into", dir, errno));
  ++next_id_;
  records_[key] = r;
  if (auto st = Save(); !st) {
    records_.erase(key);
    std::error_code ec;
    fs::remove_all(dir, ec);
    return st.error();
  }
  return MountsOf(r);
}

StoreResult<std::vector<Mount>> Store::Mounts(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = records_.find(key);
  if (it == records_.end()) return Err(Errc::kNotFound, "snapshot \"" + key + "\" does not exist");
  if (it->second.info.kind == Kind::kCommitted) {
    return Err(Errc::kFailedPrecondition,
               "snapshot \"" + key + "\" is committed: only active snapshots and views mount");
  }
  return MountsOf(it->second);
}

StoreResult<std::string> Store::ActiveFsDir(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = records_.find(key);
  if (it == records_.end()) return Err(Errc::kNotFound, "snapshot \"" + key + "\" does not exist");
  if (it->second.info.kind != Kind::kActive) {
    return Err(Errc::kFailedPrecondition, "snapshot \"" + key + "\" is " +
                                              KindName(it->second.info.kind) + ", not active");
  }
  return FsPath(it->second.id);
}

StoreResult<void> Store::Commit(const std::string& name, const std::string& key,
                                const Labels& labels) {
  if (name.empty()) return Err(Errc::kInvalidArgument, "commit of \"" + key + "\": empty name");
  if (auto st = CheckLabels(labels); !st) return st.error();
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (records_.count(name)) {
      return Err(Errc::kAlreadyExists, "commit of \"" + key + "\": snapshot \"" + name +
                                           "\" exists");
    }
    auto it = records_.find(key);
    if (it == records_.end()) {
      return Err(Errc::kNotFound, "commit: active snapshot \"" + key + "\" does not exist");
    }
    if (it->second.info.kind != Kind::kActive) {
      return Err(Errc::kFailedPrecondition, "commit: snapshot \"" + key + "\" is " +
                                                KindName(it->second.info.kind) + ", not active");
    }
    id = it->second.id;
  }
  // The walk can be long (a whole layer); it runs without the lock. The snapshot is then
  // checked again: a concurrent Remove or Commit of the same key wins.
  auto usage = DiskUsage(FsPath(id));
  if (!usage) return usage.error();
  std::unique_lock<std::mutex> lock(mu_);
  auto it = records_.find(key);
  if (it == records_.end() || it->second.id != id || it->second.info.kind != Kind::kActive) {
    return Err(Errc::kNotFound, "commit: active snapshot \"" + key + "\" went away");
  }
  if (records_.count(name)) {
    return Err(Errc::kAlreadyExists, "commit of \"" + key + "\": snapshot \"" + name + "\" exists");
  }
  Record old = it->second;
  Record r = old;
  r.info.name = name;
  r.info.kind = Kind::kCommitted;
  r.info.created = r.info.updated = std::chrono::system_clock::now();
  r.info.labels = labels;
  r.usage = usage.value();
  records_.erase(it);
  records_[name] = r;
  if (auto st = Save(); !st) {
    records_.erase(name);
    records_[key] = std::move(old);
    return st.error();
  }
  CountCommittedLocked();
  lock.unlock();
  // The work dir only served the overlay mount of the active snapshot; committed layers are
  // lower dirs only.
  std::error_code ec;
  fs::remove_all(WorkPath(id), ec);
  if (on_change_) on_change_();
  return boost::outcome_v2::success();
}

StoreResult<void> Store::Remove(const std::string& key) {
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = records_.find(key);
    if (it == records_.end()) {
      return Err(Errc::kNotFound, "remove: snapshot \"" + key + "\" does not exist");
    }
    for (const auto& [child_key, child] : records_) {
      if (child.info.parent == key) {
        return Err(Errc::kFailedPrecondition, "remove: snapshot \"" + key +
                                                  "\" has a child, \"" + child_key + "\"");
      }
    }
    Record old = std::move(it->second);
    records_.erase(it);
    if (auto st = Save(); !st) {
      records_[key] = std::move(old);
      return st.error();
    }
    id = old.id;
    CountCommittedLocked();
  }
  // The record is gone and ids are never reused, so nobody reaches this directory any more.
  // A failure here leaves garbage for Cleanup, not an error: the snapshot is removed.
  const std::string dir = root_ + "/snapshots/" + std::to_string(id);
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (ec) spdlog::warn("snapshot \"{}\" removed, but deleting {} failed: {}", key, dir, ec.message());
  if (on_change_) on_change_();
  return boost::outcome_v2::success();
}

StoreResult<Info> Store::Stat(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = records_.find(key);
  if (it == records_.end()) return Err(Errc::kNotFound, "snapshot \"" + key + "\" does not exist");
  return it->second.info;
}

StoreResult<Info> Store::Update(const Info& info, const std::vector<std::string>& fieldpaths) {
  if (auto st = CheckLabels(info.labels); !st) return st.error();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = records_.find(info.name);
  if (it == records_.end()) {
    return Err(Errc::kNotFound, "update: snapshot \"" + info.name + "\" does not exist");
  }
  Labels labels = it->second.info.labels;
  if (fieldpaths.empty()) {
    labels = info.labels;
  }
  for (const std::string& path : fieldpaths) {
    if (path.rfind("labels.", 0) == 0) {
      std::string k = path.substr(7);
      auto v = info.labels.find(k);
      if (v == info.labels.end() || v->second.empty()) {
        labels.erase(k);
      } else {
        labels[k] = v->second;
      }
    } else if (path == "labels") {
      labels = info.labels;
    } else {
      return Err(Errc::kInvalidArgument, "update: cannot update field \"" + path +
                                             "\" of snapshot \"" + info.name + "\"");
    }
  }
  // containerd stores no label with an empty value.
  for (auto l = labels.begin(); l != labels.end();) l = l->second.empty() ? labels.erase(l) : ++l;
  Info old = it->second.info;
  it->second.info.labels = std::move(labels);
  it->second.info.updated = std::chrono::system_clock::now();
  if (auto st = Save(); !st) {
    it->second.info = std::move(old);
    return st.error();
  }
  return it->second.info;
}

std::vector<Info> Store::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Info> out;
  out.reserve(records_.size());
  for (const auto& [key, r] : records_) out.push_back(r.info);
  return out;
}

StoreResult<Usage> Store::GetUsage(const std::string& key) const {
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = records_.find(key);
    if (it == records_.end()) {
      return Err(Errc::kNotFound, "usage: snapshot \"" + key + "\" does not exist");
    }
    if (it->second.info.kind != Kind::kActive) return it->second.usage;
    id = it->second.id;
  }
  auto usage = DiskUsage(FsPath(id));
  if (!usage && usage.error().code == Errc::kNotFound) {
    return Err(Errc::kNotFound, "usage: snapshot \"" + key + "\" was removed");
  }
  return usage;
}

StoreResult<size_t> Store::Cleanup() {
  const std::string dir = root_ + "/snapshots";
  std::vector<std::string> garbage;
  size_t removed = 0;
  {
    // Create makes and renames its directories under the lock, so while it is held every
    // directory without a record is garbage, and stays so (ids are never reused).
    std::lock_guard<std::mutex> lock(mu_);
    std::set<uint64_t> live;
    for (const auto& [key, r] : records_) live.insert(r.id);
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const fs::directory_entry& entry = *it;
      std::string name = entry.path().filename().string();
      uint64_t id = 0;
      if (IsIdName(name, &id) && live.count(id)) continue;
      // A temporary directory holds nothing but an empty fs/ and work/ (files arrive after the
      // rename to its id), so it goes now, before mkdtemp could hand its name out again.
      if (!IsIdName(name, &id)) {
        std::error_code rm;
        fs::remove_all(entry.path(), rm);
        if (rm) return Err(Errc::kIo, "delete " + entry.path().string() + ": " + rm.message());
        ++removed;
        continue;
      }
      garbage.push_back(entry.path().string());
    }
    if (ec) return Err(Errc::kIo, "list " + dir + ": " + ec.message());
  }
  for (const auto& path : garbage) {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) {
      spdlog::warn("snapshot cleanup: deleting {} failed: {}", path, ec.message());
      continue;
    }
    ++removed;
  }
  return removed;
}

}  // namespace shoal::snapshotter
