#include "lib/swarm/range_disk_io.h"

#include <utility>

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <spdlog/spdlog.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <libtorrent/add_torrent_params.hpp>
#include <libtorrent/disk_buffer_holder.hpp>
#include <libtorrent/disk_observer.hpp>
#include <libtorrent/error_code.hpp>
#include <libtorrent/file_storage.hpp>
#include <libtorrent/hasher.hpp>
#include <libtorrent/performance_counters.hpp>
#include <libtorrent/settings_pack.hpp>
#include <libtorrent/storage_defs.hpp>

namespace shoal::swarm {
namespace {

// A move-only nullary callable (std::function needs copyable targets; jobs own buffers).
class Task {
 public:
  Task() = default;
  template <typename F>
  explicit Task(F f) : impl_(std::make_unique<Model<F>>(std::move(f))) {}
  void operator()() { impl_->Run(); }
  explicit operator bool() const { return impl_ != nullptr; }

 private:
  struct Concept {
    virtual ~Concept() = default;
    virtual void Run() = 0;
  };
  template <typename F>
  struct Model final : Concept {
    explicit Model(F fn) : f(std::move(fn)) {}
    void Run() override { f(); }
    F f;
  };
  std::unique_ptr<Concept> impl_;
};

lt::error_code SysError(int err) { return lt::error_code(err, boost::system::system_category()); }

lt::storage_error StorageError(lt::error_code ec, lt::operation_t op) {
  return lt::storage_error(ec, lt::file_index_t(0), op);
}

// Reads exactly len bytes at off. A short file is an eof error; *got says how much was read.
lt::error_code PreadFull(int fd, char* buf, size_t len, uint64_t off, size_t* got = nullptr) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd, buf + done, len - done, static_cast<off_t>(off + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (got) *got = done;
      return SysError(errno);
    }
    if (n == 0) {
      if (got) *got = done;
      return boost::asio::error::eof;
    }
    done += static_cast<size_t>(n);
  }
  if (got) *got = done;
  return {};
}

lt::error_code PwriteFull(int fd, const char* buf, size_t len, uint64_t off) {
  while (len > 0) {
    ssize_t n = ::pwrite(fd, buf, len, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      return SysError(errno);
    }
    if (n == 0) return SysError(EIO);
    buf += n;
    len -= static_cast<size_t>(n);
    off += static_cast<uint64_t>(n);
  }
  return {};
}

// Drops the first `n` bytes of iov[*first..] (a short preadv/pwritev).
void AdvanceIov(std::vector<iovec>& iov, size_t* first, size_t n) {
  while (n > 0 && *first < iov.size()) {
    iovec& v = iov[*first];
    size_t take = std::min(n, v.iov_len);
    v.iov_base = static_cast<char*>(v.iov_base) + take;
    v.iov_len -= take;
    n -= take;
    if (v.iov_len == 0) ++*first;
  }
}

// Writes every buffer of `iov` (one contiguous file range from `off`). Modifies iov.
lt::error_code PwritevFull(int fd, std::vector<iovec>& iov, uint64_t off) {
  size_t first = 0;
  while (first < iov.size()) {
    ssize_t n = ::pwritev(fd, iov.data() + first, static_cast<int>(iov.size() - first),
                          static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      return SysError(errno);
    }
    if (n == 0) return SysError(EIO);
    off += static_cast<uint64_t>(n);
    AdvanceIov(iov, &first, static_cast<size_t>(n));
  }
  return {};
}

// Reads every buffer of `iov` from `off`. A short file is an eof error. Modifies iov.
lt::error_code PreadvFull(int fd, std::vector<iovec>& iov, uint64_t off) {
  size_t first = 0;
  while (first < iov.size()) {
    ssize_t n = ::preadv(fd, iov.data() + first, static_cast<int>(iov.size() - first),
                         static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      return SysError(errno);
    }
    if (n == 0) return boost::asio::error::eof;
    off += static_cast<uint64_t>(n);
    AdvanceIov(iov, &first, static_cast<size_t>(n));
  }
  return {};
}

// A piece's SHA-1 followed as its blocks are written, from the copies that were written: in
// the common case the piece is never read back from the file to be hashed.
struct PieceProgress {
  lt::hasher hash;      // over the piece's bytes [0, cursor)
  uint32_t cursor = 0;  // bytes hashed so far
  // Blocks written past the cursor (start -> bytes), hashed once the cursor reaches them.
  std::map<uint32_t, std::string> ahead;
  // No longer followed past `cursor` (memory cap): the rest is read back at hash time.
  bool stopped = false;
};

// One chunk torrent's storage.
struct Storage {
  explicit Storage(std::shared_ptr<std::atomic<int64_t>> retained_bytes)
      : retained(std::move(retained_bytes)) {}
  ~Storage() {
    for (auto& [piece, p] : progress) Drop(p);
  }
  // Frees the blocks waiting in p.ahead.
  void Drop(PieceProgress& p) {
    int64_t bytes = 0;
    for (auto& [start, block] : p.ahead) bytes += static_cast<int64_t>(block.size());
    p.ahead.clear();
    retained->fetch_sub(bytes);
  }

  Sha1 info_hash{};
  std::string name;
  FileRange range;       // range.file is null when the storage is unusable
  lt::error_code error;  // why it is unusable
  uint32_t piece_length = 0;
  int num_pieces = 0;
  std::atomic<bool> write_error_logged{false};  // log the first failed write only

  // The fields below are guarded by RangeDiskIo::mu_.
  // Writes issued for a piece that have not landed in the file yet.
  std::unordered_map<int, int> pending_writes;
  // Hash jobs waiting for a piece's pending writes.
  std::unordered_map<int, std::vector<Task>> parked;
  // Every job gets a sequence number; the ones not completed yet are in `inflight`.
  uint64_t next_seq = 0;
  std::set<uint64_t> inflight;
  // (F, action): run action once every job with a sequence number below F has completed.
  std::deque<std::pair<uint64_t, Task>> fences;

  // Pieces being hashed as they are written; guarded by hash_mu.
  std::mutex hash_mu;
  std::unordered_map<int, PieceProgress> progress;
  // Bytes waiting in every storage's `ahead` blocks (shared with RangeDiskIo's cap).
  std::shared_ptr<std::atomic<int64_t>> retained;
};
using StoragePtr = std::shared_ptr<Storage>;

// A queued disk job. Reads and writes stay data, not closures, so that a disk thread can merge
// neighbouring ones into one preadv/pwritev; everything else is an opaque task.
struct Job {
  enum class Kind { kTask, kRead, kWrite };
  Kind kind = Kind::kTask;
  Task task;  // kTask
  // kRead and kWrite:
  StoragePtr st;
  uint64_t seq = 0;
  uint64_t off = 0;  // in the blob file
  size_t len = 0;
  int piece = 0;
  uint32_t start = 0;  // kWrite: offset in the piece
  std::string block;   // kWrite: a copy (libtorrent's buffer is only valid during async_write)
  std::function<void(const lt::storage_error&)> on_written;
  std::function<void(lt::disk_buffer_holder, const lt::storage_error&)> on_read;
  int fd() const { return st->range.file->fd(); }
};

// A job that has run: Finish releases what it held.
struct Done {
  Storage* st;
  uint64_t seq;
  std::optional<int> written_piece;
  int64_t written_bytes;
};

// Neighbouring reads or writes merged into one system call: at most this many blocks (well
// under IOV_MAX) and bytes.
constexpr size_t kMaxMergedJobs = 64;
constexpr size_t kMaxMergedBytes = 4u << 20;
// Jobs a disk thread takes from the queue at once.
constexpr size_t kMaxBatchJobs = 256;

class RangeDiskIo final : public lt::disk_interface, public lt::buffer_allocator_interface {
 public:
  RangeDiskIo(lt::io_context& ioc, const lt::settings_interface& settings, lt::counters& counters,
              RangeDiskIoOptions options)
      : ioc_(ioc), settings_(settings), counters_(counters), options_(std::move(options)) {
    if (!options_.registry) options_.registry = std::make_shared<FileRangeRegistry>();
    settings_updated();
    int n = std::max(1, options_.threads);
    thread_count_ = static_cast<size_t>(n);
    running_ = n;
    for (int i = 0; i < n; ++i) {
      // Each thread keeps libtorrent's io_context alive until it exits, so completions posted
      // while the session shuts down still run (the same contract as libtorrent's own disk I/O).
      threads_.emplace_back(
          [this, guard = boost::asio::make_work_guard(ioc_)]() mutable { ThreadMain(guard); });
    }
  }

  ~RangeDiskIo() override {
    Stop();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  // ---- buffer_allocator_interface
  void free_disk_buffer(char* b) override { delete[] b; }

  // ---- disk_interface
  lt::storage_holder new_torrent(const lt::storage_params& p,
                                 const std::shared_ptr<void>&) override {
    auto st = std::make_shared<Storage>(retained_);
    std::copy(p.info_hash.begin(), p.info_hash.end(), st->info_hash.begin());
    st->name = p.files.name();
    st->piece_length = static_cast<uint32_t>(p.files.piece_length());
    st->num_pieces = p.files.num_pieces();
    uint64_t total = static_cast<uint64_t>(p.files.total_size());
    std::optional<FileRange> range = options_.registry->Find(st->info_hash);
    if (!range) {
      st->error = SysError(ENOENT);
      spdlog::error(
          "swarm disk: no file range registered for chunk torrent {} (info-hash {}); "
          "its storage fails every operation",
          st->name, Sha1Hex(st->info_hash));
    } else if (range->length != total) {
      st->error = SysError(EINVAL);
      spdlog::error(
          "swarm disk: file range of chunk torrent {} (info-hash {}) is {} bytes, the "
          "torrent is {} bytes; its storage fails every operation",
          st->name, Sha1Hex(st->info_hash), range->length, total);
    } else {
      st->range = std::move(*range);
    }
    lt::storage_index_t idx;
    if (free_slots_.empty()) {
      idx = lt::storage_index_t(static_cast<std::uint32_t>(torrents_.size()));
      torrents_.push_back(std::move(st));
    } else {
      idx = free_slots_.back();
      free_slots_.pop_back();
      torrents_[static_cast<std::uint32_t>(idx)] = std::move(st);
    }
    return lt::storage_holder(idx, *this);
  }

  void remove_torrent(lt::storage_index_t idx) override {
    // Jobs in flight hold their own reference to the storage.
    torrents_[static_cast<std::uint32_t>(idx)].reset();
    free_slots_.push_back(idx);
  }

  void async_read(lt::storage_index_t storage, const lt::peer_request& r,
                  std::function<void(lt::disk_buffer_holder, const lt::storage_error&)> handler,
                  lt::disk_job_flags_t) override {
    StoragePtr st = Get(storage);
    if (st->error) {
      PostResult([h = std::move(handler), e = st->error]() {
        h(lt::disk_buffer_holder(), StorageError(e, lt::operation_t::file_open));
      });
      return;
    }
    auto off =
        MapPieceRequest(st->range, st->piece_length, static_cast<int>(r.piece), r.start, r.length);
    if (!off) {
      PostResult([h = std::move(handler)]() {
        h(lt::disk_buffer_holder(), StorageError(SysError(EINVAL), lt::operation_t::file_read));
      });
      return;
    }
    Job job;
    job.kind = Job::Kind::kRead;
    job.st = std::move(st);
    job.off = off.value();
    job.len = static_cast<size_t>(r.length);
    job.on_read = std::move(handler);
    bool queued;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job.seq = BeginLocked(*job.st);
      queued = EnqueueLocked(job, /*wake=*/false);
    }
    if (!queued) RunInline(std::move(job));
  }

  bool async_write(lt::storage_index_t storage, const lt::peer_request& r, const char* buf,
                   std::shared_ptr<lt::disk_observer> o,
                   std::function<void(const lt::storage_error&)> handler,
                   lt::disk_job_flags_t) override {
    StoragePtr st = Get(storage);
    if (st->error) {
      PostResult([h = std::move(handler), e = st->error]() {
        h(StorageError(e, lt::operation_t::file_open));
      });
      return false;
    }
    auto off =
        MapPieceRequest(st->range, st->piece_length, static_cast<int>(r.piece), r.start, r.length);
    if (!off) {
      PostResult([h = std::move(handler)]() {
        h(StorageError(SysError(EINVAL), lt::operation_t::file_write));
      });
      return false;
    }
    Job job;
    job.kind = Job::Kind::kWrite;
    job.st = std::move(st);
    job.off = off.value();
    job.len = static_cast<size_t>(r.length);
    job.piece = static_cast<int>(r.piece);
    job.start = static_cast<uint32_t>(r.start);
    job.block.assign(buf, job.len);  // libtorrent's buffer is only valid during this call
    job.on_written = std::move(handler);
    bool exceeded = false;
    bool queued;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job.seq = BeginLocked(*job.st);
      ++job.st->pending_writes[job.piece];
      queued_write_bytes_ += static_cast<int64_t>(job.len);
      if (queued_write_bytes_ > max_queued_bytes_.load()) {
        exceeded_ = true;
        exceeded = true;
        if (o) observers_.push_back(std::move(o));
      }
      queued = EnqueueLocked(job, /*wake=*/false);
    }
    if (!queued) RunInline(std::move(job));
    return exceeded;
  }

  void async_hash(
      lt::storage_index_t storage, lt::piece_index_t piece, lt::span<lt::sha256_hash>,
      lt::disk_job_flags_t flags,
      std::function<void(lt::piece_index_t, const lt::sha1_hash&, const lt::storage_error&)>
          handler) override {
    StoragePtr st = Get(storage);
    if (st->error) {
      PostResult([h = std::move(handler), e = st->error, piece]() {
        h(piece, lt::sha1_hash(), StorageError(e, lt::operation_t::file_open));
      });
      return;
    }
    int p = static_cast<int>(piece);
    if (p < 0 || p >= st->num_pieces) {
      PostResult([h = std::move(handler), piece]() {
        h(piece, lt::sha1_hash(), StorageError(SysError(EINVAL), lt::operation_t::file_read));
      });
      return;
    }
    bool v1 = bool(flags & lt::disk_interface::v1_hash);
    Task job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      uint64_t seq = BeginLocked(*st);
      job = Task([this, st, seq, piece, v1, h = std::move(handler)]() mutable {
        lt::sha1_hash hash;
        lt::error_code ec;
        if (v1) ec = HashPiece(*st, static_cast<int>(piece), hash);
        PostResult([h = std::move(h), piece, hash, ec]() {
          h(piece, hash, ec ? StorageError(ec, lt::operation_t::file_read) : lt::storage_error());
        });
        Finish({Done{st.get(), seq, std::nullopt, 0}});
      });
      // libtorrent asks for the hash as soon as the piece's last block was handed to
      // async_write: wait until every write of the piece has landed, so the hash (and
      // piece_finished_alert after it) reflects what is in the file.
      auto it = st->pending_writes.find(p);
      if (it != st->pending_writes.end() && it->second > 0) {
        st->parked[p].push_back(std::move(job));
        // Its writes may be waiting for the write delay: they run now, so the hash does.
        if (deferred_ || unsignalled_) {
          SignalLocked();
          cv_.notify_all();
        }
        return;
      }
    }
    Submit(std::move(job));
  }

  void async_hash2(
      lt::storage_index_t, lt::piece_index_t piece, int, lt::disk_job_flags_t,
      std::function<void(lt::piece_index_t, const lt::sha256_hash&, const lt::storage_error&)>
          handler) override {
    PostResult([h = std::move(handler), piece]() {
      h(piece, lt::sha256_hash(), StorageError(SysError(EOPNOTSUPP), lt::operation_t::file_read));
    });
  }

  void async_move_storage(
      lt::storage_index_t, std::string p, lt::move_flags_t,
      std::function<void(lt::status_t, const std::string&, const lt::storage_error&)> handler)
      override {
    PostResult([h = std::move(handler), p = std::move(p)]() {
      h(lt::status_t::fatal_disk_error, p,
        StorageError(SysError(EOPNOTSUPP), lt::operation_t::file_rename));
    });
  }

  void async_release_files(lt::storage_index_t storage, std::function<void()> handler) override {
    Fence(Get(storage), std::move(handler));
  }

  void async_check_files(
      lt::storage_index_t storage, const lt::add_torrent_params*,
      lt::aux::vector<std::string, lt::file_index_t>,
      std::function<void(lt::status_t, const lt::storage_error&)> handler) override {
    StoragePtr st = Get(storage);
    lt::error_code e = st->error;
    PostResult([h = std::move(handler), e]() {
      if (e) {
        h(lt::status_t::fatal_disk_error, StorageError(e, lt::operation_t::file_open));
      } else {
        h(lt::status_t::no_error, lt::storage_error());
      }
    });
  }

  void async_stop_torrent(lt::storage_index_t storage, std::function<void()> handler) override {
    Fence(Get(storage), std::move(handler));
  }

  void async_rename_file(
      lt::storage_index_t, lt::file_index_t index, std::string name,
      std::function<void(const std::string&, lt::file_index_t, const lt::storage_error&)> handler)
      override {
    PostResult([h = std::move(handler), index, name = std::move(name)]() {
      h(name, index, lt::storage_error(SysError(EOPNOTSUPP), index, lt::operation_t::file_rename));
    });
  }

  void async_delete_files(lt::storage_index_t, lt::remove_flags_t,
                          std::function<void(const lt::storage_error&)> handler) override {
    PostResult([h = std::move(handler)]() {
      h(StorageError(SysError(EOPNOTSUPP), lt::operation_t::file_remove));
    });
  }

  void async_set_file_priority(
      lt::storage_index_t, lt::aux::vector<lt::download_priority_t, lt::file_index_t> prio,
      std::function<void(const lt::storage_error&,
                         lt::aux::vector<lt::download_priority_t, lt::file_index_t>)>
          handler) override {
    PostResult([h = std::move(handler), prio = std::move(prio)]() mutable {
      h(lt::storage_error(), std::move(prio));
    });
  }

  void async_clear_piece(lt::storage_index_t storage, lt::piece_index_t index,
                         std::function<void(lt::piece_index_t)> handler) override {
    StoragePtr st = Get(storage);
    Fence(st, [st, h = std::move(handler), index]() {
      {
        // The piece is downloaded again from scratch: what was followed of it is stale.
        std::lock_guard<std::mutex> lock(st->hash_mu);
        auto it = st->progress.find(static_cast<int>(index));
        if (it != st->progress.end()) {
          st->Drop(it->second);
          st->progress.erase(it);
        }
      }
      h(index);
    });
  }

  void update_stats_counters(lt::counters& c) const override {
    std::lock_guard<std::mutex> lock(mu_);
    c.set_value(lt::counters::queued_disk_jobs, static_cast<int64_t>(queue_.size()));
  }

  std::vector<lt::open_file_state> get_status(lt::storage_index_t) const override { return {}; }

  void abort(bool wait) override {
    Stop();
    if (wait) {
      for (auto& t : threads_) {
        if (t.joinable()) t.join();
      }
    }
  }

  // libtorrent calls this after a round of async_* calls: reads and writes queued since the
  // last call wake the disk threads once, not once per 16 KiB block. Writes alone, under
  // options.write_wake_bytes and with room in the write queue, are left for up to
  // options.write_delay (a thread waits for that deadline) so that more blocks share the
  // wake-up and the pwritev.
  void submit_jobs() override {
    std::lock_guard<std::mutex> lock(mu_);
    // The round's writes, counted even when a thread that was awake took some of them already
    // (then the rest would otherwise wait out the delay).
    const int64_t round_bytes = round_write_bytes_;
    round_write_bytes_ = 0;
    if (!unsignalled_) return;
    const bool now = unsignalled_read_ || exceeded_ || options_.write_delay.count() <= 0 ||
                     unsignalled_write_bytes_ >= options_.write_wake_bytes ||
                     round_bytes >= options_.write_wake_bytes;
    if (now) {
      SignalLocked();
      cv_.notify_all();
      return;
    }
    if (!deferred_) {
      deferred_ = true;
      defer_until_ = std::chrono::steady_clock::now() + options_.write_delay;
      cv_.notify_one();  // an idle thread goes back to sleep until the deadline
    }
  }

  void settings_updated() override {
    int64_t max = settings_.get_int(lt::settings_pack::max_queued_disk_bytes);
    max_queued_bytes_.store(std::max<int64_t>(max, 4 * lt::default_block_size));
  }

 private:
  StoragePtr Get(lt::storage_index_t idx) const {
    return torrents_[static_cast<std::uint32_t>(idx)];
  }

  // Queues `f` to run on libtorrent's thread. Results are handed over in batches: one post
  // carries every result queued until libtorrent's thread runs it (as libtorrent's own disk
  // I/O does), not one post and one wake-up per block.
  template <typename F>
  void PostResult(F f) {
    {
      std::lock_guard<std::mutex> lock(results_mu_);
      results_.emplace_back(std::move(f));
      if (results_posted_) return;
      results_posted_ = true;
    }
    boost::asio::post(ioc_, [this] { RunResults(); });
  }

  void RunResults() {
    std::vector<Task> batch;
    {
      std::lock_guard<std::mutex> lock(results_mu_);
      batch.swap(results_);
      results_posted_ = false;
    }
    for (Task& t : batch) t();
  }

  uint64_t BeginLocked(Storage& st) {
    uint64_t seq = st.next_seq++;
    st.inflight.insert(seq);
    return seq;
  }

  // Runs `t` on the pool (waking a thread now); inline once every pool thread has exited
  // (after abort).
  void Submit(Task t) {
    Job job;
    job.task = std::move(t);
    bool queued;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queued = EnqueueLocked(job, /*wake=*/true);
    }
    if (!queued) RunInline(std::move(job));
  }

  // Moves `job` into the pool's queue, unless every pool thread has exited (after abort):
  // then it returns false and the caller runs the job with RunInline. Without `wake` the
  // threads are woken by the next submit_jobs.
  bool EnqueueLocked(Job& job, bool wake) {
    if (running_ == 0) return false;
    const Job::Kind kind = job.kind;
    const int64_t len = static_cast<int64_t>(job.len);
    queue_.push_back(std::move(job));
    if (wake) {
      SignalLocked();  // the woken thread takes what was left waiting too
      cv_.notify_one();
    } else {
      unsignalled_ = true;
      if (kind == Job::Kind::kWrite) {
        unsignalled_write_bytes_ += len;
        round_write_bytes_ += len;
      } else {
        unsignalled_read_ = true;
      }
    }
    return true;
  }

  // Everything queued may run now: no deferral, nothing counted as unsignalled.
  void SignalLocked() {
    unsignalled_ = false;
    unsignalled_read_ = false;
    unsignalled_write_bytes_ = 0;
    deferred_ = false;
  }

  void RunInline(Job job) {
    std::vector<Job> one;
    one.push_back(std::move(job));
    RunBatch(one);
  }

  // Runs `handler` on libtorrent's thread once every job issued for `st` so far has completed.
  template <typename F>
  void Fence(const StoragePtr& st, F handler) {
    Task post([this, handler = std::move(handler)]() mutable {
      if constexpr (std::is_same_v<F, std::function<void()>>) {
        if (!handler) return;
      }
      PostResult(std::move(handler));
    });
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!st->inflight.empty()) {
        st->fences.emplace_back(st->next_seq, std::move(post));
        return;
      }
    }
    post();
  }

  // Jobs finished (their results already posted), under one lock. For writes,
  // `written_piece` and `written_bytes` release the piece's parked hash jobs and the write
  // queue's memory.
  void Finish(const std::vector<Done>& done) {
    std::vector<Task> resubmit;
    std::vector<Task> fences;
    std::vector<std::shared_ptr<lt::disk_observer>> observers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const Done& d : done) {
        Storage& st = *d.st;
        if (d.written_piece) {
          queued_write_bytes_ -= d.written_bytes;
          auto it = st.pending_writes.find(*d.written_piece);
          if (it != st.pending_writes.end() && --it->second <= 0) {
            st.pending_writes.erase(it);
            auto pk = st.parked.find(*d.written_piece);
            if (pk != st.parked.end()) {
              for (Task& t : pk->second) resubmit.push_back(std::move(t));
              st.parked.erase(pk);
            }
          }
        }
        st.inflight.erase(d.seq);
        while (!st.fences.empty() &&
               (st.inflight.empty() || *st.inflight.begin() >= st.fences.front().first)) {
          fences.push_back(std::move(st.fences.front().second));
          st.fences.pop_front();
        }
      }
      if (exceeded_ && queued_write_bytes_ <= max_queued_bytes_.load() / 2) {
        exceeded_ = false;
        observers.swap(observers_);
      }
    }
    for (auto& t : resubmit) Submit(std::move(t));
    for (auto& f : fences) f();
    for (auto& o : observers) {
      PostResult([o = std::move(o)]() { o->on_disk(); });
    }
  }

  // Follows piece `piece` of `st` with the block just written at `start` (`block`, or null
  // when the write failed). A block written over bytes already followed (a piece downloaded
  // again) makes the whole piece be read back from the file at hash time.
  void Absorb(Storage& st, int piece, uint32_t start, std::string* block) {
    std::lock_guard<std::mutex> lock(st.hash_mu);
    PieceProgress& p = st.progress[piece];
    const uint32_t len = block ? static_cast<uint32_t>(block->size()) : 0;
    const uint32_t end = start + len;
    bool overlaps = start < p.cursor;
    if (!overlaps && !p.ahead.empty()) {
      auto it = p.ahead.lower_bound(start);
      if (it != p.ahead.end() && it->first < end) overlaps = true;
      if (it != p.ahead.begin()) {
        --it;
        if (it->first + it->second.size() > start) overlaps = true;
      }
    }
    if (overlaps) {  // from byte 0: everything is read back
      st.Drop(p);
      p = PieceProgress();
    }
    // A failed write leaves a hole: the cursor stops before it.
    if (overlaps || p.stopped || block == nullptr) {
      StopFollowing(st, p);
      return;
    }
    if (start == p.cursor) {
      p.hash.update(block->data(), static_cast<int>(len));
      p.cursor = end;
      while (!p.ahead.empty() && p.ahead.begin()->first == p.cursor) {
        std::string& next = p.ahead.begin()->second;
        p.hash.update(next.data(), static_cast<int>(next.size()));
        p.cursor += static_cast<uint32_t>(next.size());
        retained_->fetch_sub(static_cast<int64_t>(next.size()));
        p.ahead.erase(p.ahead.begin());
      }
      return;
    }
    if (retained_->fetch_add(len) + len > options_.max_retained_bytes) {
      retained_->fetch_sub(len);
      StopFollowing(st, p);
      return;
    }
    p.ahead.emplace(start, std::move(*block));
  }

  // p is no longer followed past its cursor; its waiting blocks are freed.
  static void StopFollowing(Storage& st, PieceProgress& p) {
    st.Drop(p);
    p.stopped = true;
  }

  // The piece's SHA-1: what Absorb followed, then the rest read back from the file.
  lt::error_code HashPiece(Storage& st, int piece, lt::sha1_hash& out) {
    constexpr size_t kSlice = 1u << 20;
    uint64_t begin = static_cast<uint64_t>(piece) * st.piece_length;
    uint64_t end = std::min<uint64_t>(begin + st.piece_length, st.range.length);
    lt::hasher h;
    uint64_t pos = begin;
    {
      std::lock_guard<std::mutex> lock(st.hash_mu);
      auto it = st.progress.find(piece);
      if (it != st.progress.end()) {
        if (it->second.cursor <= end - begin) {
          h = it->second.hash;
          pos = begin + it->second.cursor;
        }
        st.Drop(it->second);
        st.progress.erase(it);
      }
    }
    if (options_.stats) {
      options_.stats->bytes_hashed_from_memory.fetch_add(pos - begin);
      options_.stats->bytes_read_back.fetch_add(end - pos);
    }
    thread_local std::vector<char> buf;
    if (pos < end && buf.size() < kSlice) buf.resize(kSlice);
    while (pos < end) {
      size_t take = static_cast<size_t>(std::min<uint64_t>(kSlice, end - pos));
      size_t got = 0;
      lt::error_code ec =
          PreadFull(st.range.file->fd(), buf.data(), take, st.range.offset + pos, &got);
      // Past the end of a file that is not full size yet: hash zeros, as a sparse file would
      // read. The piece then fails its check instead of putting the torrent in error.
      if (ec == boost::asio::error::eof) {
        std::memset(buf.data() + got, 0, take - got);
      } else if (ec) {
        return ec;
      }
      h.update(buf.data(), static_cast<int>(take));
      pos += take;
    }
    out = h.final();
    return {};
  }

  void ThreadMain(boost::asio::executor_work_guard<lt::io_context::executor_type>& guard) {
    std::vector<Job> batch;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
          if (stopping_) break;
          if (!queue_.empty() && !deferred_) break;
          if (queue_.empty()) {
            cv_.wait(lock);
          } else if (cv_.wait_until(lock, defer_until_) == std::cv_status::timeout && deferred_ &&
                     std::chrono::steady_clock::now() >= defer_until_) {
            SignalLocked();  // deferred writes are due: every thread may help
            cv_.notify_all();
          }
        }
        if (queue_.empty()) {
          // Stopping and drained. A job still running on another thread may queue more work
          // (a parked hash); that thread keeps going until the queue is empty.
          --running_;
          break;
        }
        // A share of what is queued, so that other threads get the rest.
        size_t n = (queue_.size() + thread_count_ - 1) / thread_count_;
        n = std::clamp<size_t>(n, 1, kMaxBatchJobs);
        for (size_t i = 0; i < n; ++i) {
          batch.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
        if (queue_.empty()) SignalLocked();  // nothing left waiting for a wake-up
      }
      RunBatch(batch);
      batch.clear();
    }
    guard.reset();
  }

  // Runs `batch` in order, except that each run of consecutive reads (or writes) goes in file
  // order, and neighbouring blocks in it are read (written) with one system call.
  void RunBatch(std::vector<Job>& batch) {
    size_t i = 0;
    while (i < batch.size()) {
      const Job::Kind kind = batch[i].kind;
      if (kind == Job::Kind::kTask) {
        batch[i++].task();
        continue;
      }
      size_t j = i + 1;
      while (j < batch.size() && batch[j].kind == kind) ++j;
      // Stable: two writes of the same bytes keep their order.
      std::stable_sort(batch.begin() + static_cast<std::ptrdiff_t>(i),
                       batch.begin() + static_cast<std::ptrdiff_t>(j),
                       [](const Job& a, const Job& b) {
                         return std::pair(a.fd(), a.off) < std::pair(b.fd(), b.off);
                       });
      std::vector<Done> done;
      while (i < j) {
        size_t k = i + 1;
        size_t bytes = batch[i].len;
        while (k < j && k - i < kMaxMergedJobs && batch[k].fd() == batch[i].fd() &&
               batch[k].off == batch[k - 1].off + batch[k - 1].len &&
               bytes + batch[k].len <= kMaxMergedBytes) {
          bytes += batch[k].len;
          ++k;
        }
        if (kind == Job::Kind::kWrite) {
          WriteMerged(batch, i, k, done);
        } else {
          ReadMerged(batch, i, k, done);
        }
        i = k;
      }
      Finish(done);
    }
  }

  // Writes jobs [b, e) of `batch`, neighbours in one file, with one pwritev; posts each one's
  // result and adds it to `done`.
  void WriteMerged(std::vector<Job>& batch, size_t b, size_t e, std::vector<Done>& done) {
    std::vector<lt::error_code> errors(e - b);
    std::vector<iovec> iov;
    for (size_t x = b; x < e; ++x) iov.push_back({batch[x].block.data(), batch[x].len});
    lt::error_code ec = PwritevFull(batch[b].fd(), iov, batch[b].off);
    if (ec && e - b > 1) {
      // Which blocks failed: each one on its own.
      for (size_t x = b; x < e; ++x) {
        errors[x - b] =
            PwriteFull(batch[x].fd(), batch[x].block.data(), batch[x].len, batch[x].off);
      }
    } else {
      std::fill(errors.begin(), errors.end(), ec);
    }
    for (size_t x = b; x < e; ++x) {
      Job& job = batch[x];
      Storage& st = *job.st;
      const lt::error_code& err = errors[x - b];
      // Before Finish: a hash job parked on this piece runs only after it.
      Absorb(st, job.piece, job.start, err ? nullptr : &job.block);
      if (err) {
        if (!st.write_error_logged.exchange(true)) {
          spdlog::warn("swarm disk: writing {} bytes at offset {} for chunk {} failed: {}", job.len,
                       job.off, st.name, err.message());
        }
      } else {
        counters_.inc_stats_counter(lt::counters::num_blocks_written);
        if (options_.on_write_landed) options_.on_write_landed(st.info_hash, job.off, job.len);
      }
      PostResult([h = std::move(job.on_written), err]() {
        h(err ? StorageError(err, lt::operation_t::file_write) : lt::storage_error());
      });
      done.push_back(Done{&st, job.seq, job.piece, static_cast<int64_t>(job.len)});
    }
  }

  // Reads jobs [b, e) of `batch`, neighbours in one file, with one preadv into a buffer each;
  // posts each one's result and adds it to `done`.
  void ReadMerged(std::vector<Job>& batch, size_t b, size_t e, std::vector<Done>& done) {
    std::vector<char*> bufs;
    std::vector<iovec> iov;
    for (size_t x = b; x < e; ++x) {
      bufs.push_back(new char[batch[x].len]);
      iov.push_back({bufs.back(), batch[x].len});
    }
    std::vector<lt::error_code> errors(e - b);
    lt::error_code ec = PreadvFull(batch[b].fd(), iov, batch[b].off);
    if (ec && e - b > 1) {
      for (size_t x = b; x < e; ++x) {
        errors[x - b] = PreadFull(batch[x].fd(), bufs[x - b], batch[x].len, batch[x].off);
      }
    } else {
      std::fill(errors.begin(), errors.end(), ec);
    }
    for (size_t x = b; x < e; ++x) {
      Job& job = batch[x];
      const lt::error_code& err = errors[x - b];
      lt::disk_buffer_holder holder;
      if (err) {
        delete[] bufs[x - b];
      } else {
        holder = lt::disk_buffer_holder(*this, bufs[x - b], static_cast<int>(job.len));
        counters_.inc_stats_counter(lt::counters::num_blocks_read);
      }
      PostResult([h = std::move(job.on_read), holder = std::move(holder), err]() mutable {
        h(std::move(holder),
          err ? StorageError(err, lt::operation_t::file_read) : lt::storage_error());
      });
      done.push_back(Done{job.st.get(), job.seq, std::nullopt, 0});
    }
  }

  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }

  lt::io_context& ioc_;
  const lt::settings_interface& settings_;
  lt::counters& counters_;
  RangeDiskIoOptions options_;
  std::atomic<int64_t> max_queued_bytes_{1 << 20};
  // Bytes of blocks kept for hashing (PieceProgress::ahead), at most options_.max_retained_bytes.
  std::shared_ptr<std::atomic<int64_t>> retained_ = std::make_shared<std::atomic<int64_t>>(0);

  // Touched on libtorrent's network thread only.
  std::vector<StoragePtr> torrents_;
  std::vector<lt::storage_index_t> free_slots_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool unsignalled_ = false;  // reads or writes queued since the threads were last woken
  bool unsignalled_read_ = false;        // ... and a read among them
  int64_t unsignalled_write_bytes_ = 0;  // ... and the bytes of the writes among them
  int64_t round_write_bytes_ = 0;        // writes queued since the last submit_jobs
  bool deferred_ = false;  // queued writes wait for more until defer_until_ (submit_jobs)
  std::chrono::steady_clock::time_point defer_until_;
  int running_ = 0;
  size_t thread_count_ = 1;  // set before the threads start
  bool stopping_ = false;
  int64_t queued_write_bytes_ = 0;
  bool exceeded_ = false;
  std::vector<std::shared_ptr<lt::disk_observer>> observers_;

  std::vector<std::thread> threads_;

  // Results waiting for libtorrent's thread; one post runs them all (RunResults).
  std::mutex results_mu_;
  std::vector<Task> results_;    // guarded by results_mu_
  bool results_posted_ = false;  // guarded by results_mu_: a RunResults is posted, not yet run
};

}  // namespace

std::unique_ptr<lt::disk_interface> MakeRangeDiskIo(lt::io_context& ioc,
                                                    const lt::settings_interface& settings,
                                                    lt::counters& counters,
                                                    RangeDiskIoOptions options) {
  return std::make_unique<RangeDiskIo>(ioc, settings, counters, std::move(options));
}

lt::disk_io_constructor_type RangeDiskIoConstructor(RangeDiskIoOptions options) {
  return [options = std::move(options)](lt::io_context& ioc, const lt::settings_interface& s,
                                        lt::counters& c) {
    return MakeRangeDiskIo(ioc, s, c, options);
  };
}

}  // namespace shoal::swarm
