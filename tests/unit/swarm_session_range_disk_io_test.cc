// range_disk_io driven directly (no session): a chunk torrent mapped onto a byte range of a
// larger file, plus the pure helpers (FileRange, registry, request mapping).

#include <doctest/doctest.h>

#include <utility>

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <libtorrent/add_torrent_params.hpp>
#include <libtorrent/disk_interface.hpp>
#include <libtorrent/disk_observer.hpp>
#include <libtorrent/file_storage.hpp>
#include <libtorrent/hasher.hpp>
#include <libtorrent/io_context.hpp>
#include <libtorrent/performance_counters.hpp>
#include <libtorrent/session_handle.hpp>
#include <libtorrent/settings_pack.hpp>
#include <libtorrent/storage_defs.hpp>

#include "lib/swarm/file_range.h"
#include "lib/swarm/range_disk_io.h"

namespace shoal::swarm {
namespace {

namespace lt = libtorrent;
using std::chrono::milliseconds;

std::string Bytes(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed;
  for (auto& c : s) {
    x = x * 1103515245 + 12345;
    c = static_cast<char>(x >> 16);
  }
  return s;
}

// A temp file of `size` bytes of `fill`, unlinked at once (the fd keeps it).
std::shared_ptr<BlobFile> TempFile(size_t size, char fill) {
  char path[] = "/tmp/shoal-rdio-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  unlink(path);
  std::string data(size, fill);
  REQUIRE(pwrite(fd, data.data(), data.size(), 0) == static_cast<ssize_t>(data.size()));
  auto f = BlobFile::Adopt(fd);
  REQUIRE(f.has_value());
  return f.value();
}

std::string ReadAt(const BlobFile& f, uint64_t off, size_t len) {
  std::string out(len, '\0');
  ssize_t n = pread(f.fd(), out.data(), len, static_cast<off_t>(off));
  out.resize(n < 0 ? 0 : static_cast<size_t>(n));
  return out;
}

Sha1 Ih(uint8_t b) {
  Sha1 h{};
  h.fill(b);
  return h;
}

struct Observer final : lt::disk_observer {
  int calls = 0;
  void on_disk() override { ++calls; }
};

// One disk I/O instance over a registry, with libtorrent's pieces around it.
struct Rig {
  static constexpr int kPiece = 32 * 1024;  // two 16 KiB blocks per piece
  // Destroyed before `disk`: pending completions hold read buffers that `disk` frees.
  std::unique_ptr<lt::io_context> ioc_owner = std::make_unique<lt::io_context>();
  lt::io_context& ioc = *ioc_owner;
  lt::settings_pack settings;
  lt::counters counters;
  std::shared_ptr<FileRangeRegistry> registry = std::make_shared<FileRangeRegistry>();
  std::unique_ptr<lt::disk_interface> disk;

  // While `hold` is set, the disk threads stop after each write (in on_write_landed).
  std::mutex mu;
  std::condition_variable cv;
  bool hold = false;
  int landed = 0;

  std::shared_ptr<RangeDiskIoStats> stats = std::make_shared<RangeDiskIoStats>();

  explicit Rig(int max_queued = 1 << 20, int64_t max_retained = int64_t{64} << 20,
               std::chrono::microseconds write_delay = std::chrono::microseconds(2000)) {
    settings.set_int(lt::settings_pack::max_queued_disk_bytes, max_queued);
    RangeDiskIoOptions o{registry, 2, nullptr, max_retained, stats, write_delay};
    o.on_write_landed = [this](const Sha1&, uint64_t, uint64_t) {
      std::unique_lock<std::mutex> lock(mu);
      ++landed;
      cv.wait(lock, [&] { return !hold; });
    };
    disk = MakeRangeDiskIo(ioc, settings, counters, std::move(o));
  }
  void Hold(bool on) {
    std::lock_guard<std::mutex> lock(mu);
    hold = on;
    cv.notify_all();
  }
  ~Rig() {
    Hold(false);
    disk->abort(true);  // joins the disk threads
    ioc_owner.reset();  // drops completions not run (their captures may be gone)
    disk.reset();
  }

  // Runs libtorrent's side (completions) until cond() or 5 s.
  bool RunUntil(const std::function<bool()>& cond, milliseconds timeout = milliseconds(5000)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!cond() && std::chrono::steady_clock::now() < deadline) {
      ioc.run_one_for(milliseconds(10));
    }
    return cond();
  }

  struct Torrent {
    lt::file_storage fs;
    lt::aux::vector<lt::download_priority_t, lt::file_index_t> prio;
    std::string save = ".";
    lt::storage_holder holder;
  };

  std::unique_ptr<Torrent> Add(const Sha1& ih, uint64_t length) {
    auto t = std::make_unique<Torrent>();
    t->fs.add_file("chunk.0", static_cast<std::int64_t>(length));
    t->fs.set_piece_length(kPiece);
    t->fs.set_num_pieces(static_cast<int>((length + kPiece - 1) / kPiece));
    lt::storage_params p(t->fs, nullptr, t->save, lt::storage_mode_sparse, t->prio,
                         lt::sha1_hash(reinterpret_cast<const char*>(ih.data())));
    t->holder = disk->new_torrent(p, nullptr);
    return t;
  }

  // Writes the block of `data` at chunk offset `off`; ++*completed when it completes.
  void WriteBlock(lt::storage_index_t st, const std::string& data, size_t off, int* completed) {
    lt::peer_request r;
    r.piece = lt::piece_index_t(static_cast<int>(off / kPiece));
    r.start = static_cast<int>(off % kPiece);
    r.length = static_cast<int>(std::min<size_t>(lt::default_block_size, data.size() - off));
    disk->async_write(st, r, data.data() + off, nullptr, [completed](const lt::storage_error& e) {
      CHECK_FALSE(e);
      ++*completed;
    });
    disk->submit_jobs();
  }
  int Landed() {
    std::lock_guard<std::mutex> lock(mu);
    return landed;
  }
  // The v1 hash of `piece`, as libtorrent asks for it.
  lt::sha1_hash Hash(lt::storage_index_t st, int piece) {
    std::optional<lt::sha1_hash> h;
    disk->async_hash(
        st, lt::piece_index_t(piece), {}, lt::disk_interface::v1_hash,
        [&](lt::piece_index_t, const lt::sha1_hash& got, const lt::storage_error& e) {
          CHECK_FALSE(e);
          h = got;
        });
    disk->submit_jobs();
    REQUIRE(RunUntil([&] { return h.has_value(); }));
    return *h;
  }

  // Writes `data` (whole chunk) block by block; returns how many writes said "queue full".
  int WriteAll(lt::storage_index_t st, const std::string& data, int* completed,
               std::shared_ptr<Observer> obs = nullptr) {
    int full = 0;
    for (size_t off = 0; off < data.size(); off += lt::default_block_size) {
      lt::peer_request r;
      r.piece = lt::piece_index_t(static_cast<int>(off / kPiece));
      r.start = static_cast<int>(off % kPiece);
      r.length = static_cast<int>(std::min<size_t>(lt::default_block_size, data.size() - off));
      bool f =
          disk->async_write(st, r, data.data() + off, obs, [completed](const lt::storage_error& e) {
            CHECK_FALSE(e);
            ++*completed;
          });
      full += f ? 1 : 0;
    }
    disk->submit_jobs();
    return full;
  }
};

}  // namespace

TEST_CASE("swarm file range: request mapping and validation") {
  auto file = TempFile(10, 0);
  FileRange r{file, 1000, 100000};
  CHECK(MapPieceRequest(r, 32768, 0, 0, 16384).value() == 1000);
  CHECK(MapPieceRequest(r, 32768, 1, 16384, 16384).value() == 1000 + 32768 + 16384);
  // Last piece: 100000 - 3*32768 = 1696 bytes.
  CHECK(MapPieceRequest(r, 32768, 3, 0, 1696).value() == 1000 + 3 * 32768);
  CHECK_FALSE(MapPieceRequest(r, 32768, 3, 0, 1697).has_value());
  CHECK_FALSE(MapPieceRequest(r, 32768, 4, 0, 1).has_value());
  CHECK_FALSE(MapPieceRequest(r, 32768, 0, 32768, 1).has_value());
  CHECK_FALSE(MapPieceRequest(r, 32768, -1, 0, 1).has_value());
  CHECK_FALSE(MapPieceRequest(r, 32768, 0, 0, 0).has_value());
  CHECK_FALSE(MapPieceRequest(r, 32768, int64_t{1} << 40, 0, 1).has_value());

  CHECK(ValidateFileRange(r).has_value());
  CHECK_FALSE(ValidateFileRange(FileRange{nullptr, 0, 1}).has_value());
  CHECK_FALSE(ValidateFileRange(FileRange{file, 0, 0}).has_value());
  CHECK_FALSE(ValidateFileRange(FileRange{file, ~uint64_t{0} - 5, 10}).has_value());

  FileRangeRegistry reg;
  CHECK(reg.Register(Ih(1), r).has_value());
  auto dup = reg.Register(Ih(1), r);
  REQUIRE_FALSE(dup.has_value());
  CHECK(dup.error().code == ErrorCode::kInvalidArgument);
  CHECK(reg.Find(Ih(1)).has_value());
  CHECK_FALSE(reg.Find(Ih(2)).has_value());
  reg.Unregister(Ih(1));
  CHECK(reg.size() == 0);

  CHECK_FALSE(BlobFile::Open("/nonexistent/shoal/blob", false).has_value());
  CHECK_FALSE(BlobFile::Adopt(-1).has_value());
}

TEST_CASE("swarm range disk io: writes land in the range, hash waits for them, reads back") {
  Rig rig;
  const uint64_t kOffset = 5000;
  const std::string data = Bytes(3 * Rig::kPiece + 700, 7);  // 4 pieces, last one short
  auto file = TempFile(kOffset + data.size() + 3000, 'x');
  REQUIRE(rig.registry->Register(Ih(9), FileRange{file, kOffset, data.size()}).has_value());
  auto t = rig.Add(Ih(9), data.size());
  lt::storage_index_t st = t->holder;

  std::optional<lt::status_t> checked;
  rig.disk->async_check_files(st, nullptr, {},
                              [&](lt::status_t s, const lt::storage_error&) { checked = s; });
  REQUIRE(rig.RunUntil([&] { return checked.has_value(); }));
  CHECK(*checked == lt::status_t::no_error);

  int written = 0;
  CHECK(rig.WriteAll(st, data, &written) == 0);
  // Ask for every hash right away, as libtorrent does once a piece's last block is handed to
  // async_write: each must see its piece's bytes in the file.
  std::vector<std::optional<lt::sha1_hash>> hashes(4);
  for (int p = 0; p < 4; ++p) {
    rig.disk->async_hash(
        st, lt::piece_index_t(p), {}, lt::disk_interface::v1_hash,
        [&hashes](lt::piece_index_t piece, const lt::sha1_hash& h, const lt::storage_error& e) {
          CHECK_FALSE(e);
          hashes[static_cast<size_t>(static_cast<int>(piece))] = h;
        });
  }
  bool cleared = false;
  rig.disk->async_clear_piece(st, lt::piece_index_t(1), [&](lt::piece_index_t) {
    // A fence: every earlier job (all writes and hashes) has completed.
    CHECK(written == 7);
    for (auto& h : hashes) CHECK(h.has_value());
    cleared = true;
  });
  rig.disk->submit_jobs();
  REQUIRE(rig.RunUntil([&] { return cleared; }));
  for (int p = 0; p < 4; ++p) {
    size_t begin = static_cast<size_t>(p) * Rig::kPiece;
    size_t len = std::min<size_t>(Rig::kPiece, data.size() - begin);
    lt::sha1_hash want = lt::hasher(data.data() + begin, static_cast<int>(len)).final();
    CHECK(*hashes[static_cast<size_t>(p)] == want);
  }
  // The bytes are in the range, and nothing around it changed.
  CHECK(ReadAt(*file, kOffset, data.size()) == data);
  CHECK(ReadAt(*file, 0, kOffset) == std::string(kOffset, 'x'));
  CHECK(ReadAt(*file, kOffset + data.size(), 3000) == std::string(3000, 'x'));

  // Reads: an unaligned one inside a block, and the short tail of the last piece.
  std::vector<std::pair<lt::peer_request, std::string>> got;
  for (auto [piece, start, length] : {std::tuple{1, 100, 5000}, std::tuple{3, 0, 700}}) {
    lt::peer_request r;
    r.piece = lt::piece_index_t(piece);
    r.start = start;
    r.length = length;
    rig.disk->async_read(st, r, [&got, r](lt::disk_buffer_holder b, const lt::storage_error& e) {
      CHECK_FALSE(e);
      got.emplace_back(r, std::string(b.data(), static_cast<size_t>(b.size())));
    });
  }
  // Past the end of the chunk: an error, not a read of the neighbouring bytes.
  bool bad_read = false;
  lt::peer_request past;
  past.piece = lt::piece_index_t(3);
  past.start = 0;
  past.length = 701;
  rig.disk->async_read(st, past, [&](lt::disk_buffer_holder b, const lt::storage_error& e) {
    CHECK(bool(e));
    CHECK_FALSE(b);
    bad_read = true;
  });
  rig.disk->submit_jobs();
  REQUIRE(rig.RunUntil([&] { return got.size() == 2 && bad_read; }));
  for (auto& [r, bytes] : got) {
    size_t at =
        static_cast<size_t>(static_cast<int>(r.piece)) * Rig::kPiece + static_cast<size_t>(r.start);
    CHECK(bytes == data.substr(at, static_cast<size_t>(r.length)));
  }

  // Unsupported operations answer errors; priorities are accepted.
  bool moved = false, deleted = false, renamed = false, prio = false, stopped = false;
  rig.disk->async_move_storage(st, "/elsewhere", lt::move_flags_t::always_replace_files,
                               [&](lt::status_t s, const std::string&, const lt::storage_error& e) {
                                 CHECK(s == lt::status_t::fatal_disk_error);
                                 CHECK(bool(e));
                                 moved = true;
                               });
  rig.disk->async_delete_files(st, lt::session_handle::delete_files,
                               [&](const lt::storage_error& e) {
                                 CHECK(bool(e));
                                 deleted = true;
                               });
  rig.disk->async_rename_file(
      st, lt::file_index_t(0), "other",
      [&](const std::string&, lt::file_index_t, const lt::storage_error& e) {
        CHECK(bool(e));
        renamed = true;
      });
  rig.disk->async_set_file_priority(
      st, {},
      [&](const lt::storage_error& e, lt::aux::vector<lt::download_priority_t, lt::file_index_t>) {
        CHECK_FALSE(e);
        prio = true;
      });
  rig.disk->async_stop_torrent(st, [&] { stopped = true; });
  REQUIRE(rig.RunUntil([&] { return moved && deleted && renamed && prio && stopped; }));
  CHECK(ReadAt(*file, kOffset, data.size()) == data);
}

TEST_CASE("swarm range disk io: a corrupt piece hashes to something else") {
  Rig rig;
  const std::string data = Bytes(2 * Rig::kPiece, 3);
  auto file = TempFile(data.size(), 0);
  REQUIRE(rig.registry->Register(Ih(4), FileRange{file, 0, data.size()}).has_value());
  auto t = rig.Add(Ih(4), data.size());
  std::string bad = data;
  bad[Rig::kPiece + 10] ^= 1;
  int written = 0;
  rig.WriteAll(t->holder, bad, &written);
  std::optional<lt::sha1_hash> h;
  rig.disk->async_hash(
      t->holder, lt::piece_index_t(1), {}, lt::disk_interface::v1_hash,
      [&](lt::piece_index_t, const lt::sha1_hash& got, const lt::storage_error&) { h = got; });
  REQUIRE(rig.RunUntil([&] { return h.has_value(); }));
  CHECK(*h != lt::hasher(data.data() + Rig::kPiece, Rig::kPiece).final());
  CHECK(*h == lt::hasher(bad.data() + Rig::kPiece, Rig::kPiece).final());
}

TEST_CASE("swarm range disk io: unregistered or mismatched ranges fail with a storage error") {
  Rig rig;
  auto file = TempFile(100000, 0);
  REQUIRE(rig.registry->Register(Ih(2), FileRange{file, 0, 1234}).has_value());
  auto missing = rig.Add(Ih(1), 65536);  // nothing registered
  auto wrong = rig.Add(Ih(2), 65536);    // registered with the wrong length
  for (auto* t : {missing.get(), wrong.get()}) {
    std::optional<lt::status_t> status;
    lt::storage_error err;
    rig.disk->async_check_files(t->holder, nullptr, {},
                                [&](lt::status_t s, const lt::storage_error& e) {
                                  status = s;
                                  err = e;
                                });
    bool write_failed = false;
    lt::peer_request r;
    r.piece = lt::piece_index_t(0);
    r.start = 0;
    r.length = 16384;
    std::string block(16384, 'a');
    rig.disk->async_write(t->holder, r, block.data(), nullptr,
                          [&](const lt::storage_error& e) { write_failed = bool(e); });
    REQUIRE(rig.RunUntil([&] { return status.has_value() && write_failed; }));
    CHECK(*status == lt::status_t::fatal_disk_error);
    CHECK(bool(err));
  }
  CHECK(ReadAt(*file, 0, 16384) == std::string(16384, '\0'));
}

TEST_CASE("swarm range disk io: the write queue is bounded and wakes its observers") {
  Rig rig(64 * 1024);                                  // the smallest bound: four blocks
  const std::string data = Bytes(8 * Rig::kPiece, 5);  // 16 blocks
  auto file = TempFile(data.size(), 0);
  REQUIRE(rig.registry->Register(Ih(6), FileRange{file, 0, data.size()}).has_value());
  auto t = rig.Add(Ih(6), data.size());
  auto obs = std::make_shared<Observer>();
  int written = 0;
  // Both disk threads stop after their first write, so the rest queues up.
  rig.Hold(true);
  // Writes are copied, so the caller's buffer may change right after async_write returns.
  std::string scratch = data;
  int full = rig.WriteAll(t->holder, scratch, &written, obs);
  scratch.assign(scratch.size(), 'z');
  // 16 blocks of 16 KiB against a 64 KiB bound: at most the first four fit.
  CHECK(full >= 12);
  rig.RunUntil([&] { return false; }, milliseconds(50));
  CHECK(obs->calls == 0);
  rig.Hold(false);
  REQUIRE(rig.RunUntil([&] { return written == 16 && obs->calls > 0; }));
  {
    std::lock_guard<std::mutex> lock(rig.mu);
    CHECK(rig.landed == 16);
  }
  CHECK(ReadAt(*file, 0, data.size()) == data);
}

// Piece hashes follow the writes: the file is not read back to hash a piece, also when its
// blocks land out of order (the later block waits in memory for the earlier one).
TEST_CASE("swarm range disk io: pieces are hashed as they are written, out of order too") {
  for (int64_t cap : {int64_t{64} << 20, int64_t{0}}) {
    CAPTURE(cap);
    Rig rig(1 << 20, cap);
    const std::string data = Bytes(2 * Rig::kPiece, 11);
    auto file = TempFile(data.size(), 0);
    REQUIRE(rig.registry->Register(Ih(7), FileRange{file, 0, data.size()}).has_value());
    auto t = rig.Add(Ih(7), data.size());
    int written = 0;
    // Piece 0: its second block lands (and a disk thread holds) before its first is issued.
    rig.Hold(true);
    rig.WriteBlock(t->holder, data, lt::default_block_size, &written);
    REQUIRE(rig.RunUntil([&] { return rig.Landed() == 1; }));
    rig.Hold(false);
    rig.WriteBlock(t->holder, data, 0, &written);
    REQUIRE(rig.RunUntil([&] { return written == 2; }));
    // Piece 1 in order (each write completes before the next is issued).
    rig.WriteBlock(t->holder, data, Rig::kPiece, &written);
    REQUIRE(rig.RunUntil([&] { return written == 3; }));
    rig.WriteBlock(t->holder, data, Rig::kPiece + lt::default_block_size, &written);
    for (int p = 0; p < 2; ++p) {
      CHECK(rig.Hash(t->holder, p) ==
            lt::hasher(data.data() + p * Rig::kPiece, Rig::kPiece).final());
    }
    REQUIRE(rig.RunUntil([&] { return written == 4; }));
    CHECK(ReadAt(*file, 0, data.size()) == data);
    if (cap > 0) {
      CHECK(rig.stats->bytes_hashed_from_memory == data.size());
      CHECK(rig.stats->bytes_read_back == 0);
    } else {
      // No memory for the block that came early: piece 0 is read back, piece 1 is not.
      CHECK(rig.stats->bytes_hashed_from_memory == Rig::kPiece);
      CHECK(rig.stats->bytes_read_back == Rig::kPiece);
    }
  }
}

// A block written again over bytes already hashed (a piece downloaded again) must not leave a
// hash of the old bytes: the piece is read back, and the hash is of what the file holds.
TEST_CASE("swarm range disk io: a block written twice makes its piece be hashed from the file") {
  Rig rig;
  const std::string data = Bytes(Rig::kPiece, 12);
  const std::string other = Bytes(Rig::kPiece, 13);
  auto file = TempFile(data.size(), 0);
  REQUIRE(rig.registry->Register(Ih(8), FileRange{file, 0, data.size()}).has_value());
  auto t = rig.Add(Ih(8), data.size());
  int written = 0;
  rig.WriteAll(t->holder, data, &written);
  REQUIRE(rig.RunUntil([&] { return written == 2; }));
  rig.WriteBlock(t->holder, other, 0, &written);
  REQUIRE(rig.RunUntil([&] { return written == 3; }));
  std::string now = other.substr(0, lt::default_block_size) + data.substr(lt::default_block_size);
  CHECK(rig.Hash(t->holder, 0) == lt::hasher(now.data(), Rig::kPiece).final());
  CHECK(ReadAt(*file, 0, data.size()) == now);
  CHECK(rig.stats->bytes_read_back == Rig::kPiece);

  // After clear_piece (a failed hash), the piece is followed from scratch again.
  bool cleared = false;
  rig.disk->async_clear_piece(t->holder, lt::piece_index_t(0), [&](lt::piece_index_t) {
    cleared = true;
  });
  REQUIRE(rig.RunUntil([&] { return cleared; }));
  rig.WriteAll(t->holder, data, &written);
  REQUIRE(rig.RunUntil([&] { return written == 5; }));
  CHECK(rig.Hash(t->holder, 0) == lt::hasher(data.data(), Rig::kPiece).final());
  CHECK(rig.stats->bytes_read_back == Rig::kPiece);
  CHECK(rig.stats->bytes_hashed_from_memory == Rig::kPiece);
}

// Blocks queued together are read and written with one system call per run of neighbours
// (preadv/pwritev): every block still gets its own bytes and its own result.
TEST_CASE("swarm range disk io: neighbouring blocks queued together each get their bytes") {
  Rig rig;
  const uint64_t kOffset = 3000;
  const std::string data = Bytes(6 * Rig::kPiece, 21);  // 12 blocks
  auto file = TempFile(kOffset + data.size(), 'x');
  REQUIRE(rig.registry->Register(Ih(5), FileRange{file, kOffset, data.size()}).has_value());
  auto t = rig.Add(Ih(5), data.size());
  int written = 0;
  rig.Hold(true);  // the threads stop after their first write: the rest is queued together
  rig.WriteAll(t->holder, data, &written);
  rig.RunUntil([&] { return false; }, milliseconds(20));
  rig.Hold(false);
  REQUIRE(rig.RunUntil([&] { return written == 12; }));
  CHECK(ReadAt(*file, kOffset, data.size()) == data);
  for (int p = 0; p < 6; ++p) {
    CHECK(rig.Hash(t->holder, p) == lt::hasher(data.data() + p * Rig::kPiece, Rig::kPiece).final());
  }
  // Every block read back in one submission, in reverse order.
  std::vector<std::optional<std::string>> got(12);
  for (int b = 11; b >= 0; --b) {
    lt::peer_request r;
    r.piece = lt::piece_index_t(b / 2);
    r.start = (b % 2) * lt::default_block_size;
    r.length = lt::default_block_size;
    rig.disk->async_read(
        t->holder, r, [&got, b](lt::disk_buffer_holder h, const lt::storage_error& e) {
          CHECK_FALSE(e);
          got[static_cast<size_t>(b)] = std::string(h.data(), static_cast<size_t>(h.size()));
        });
  }
  rig.disk->submit_jobs();
  REQUIRE(rig.RunUntil([&] {
    for (auto& g : got) {
      if (!g) return false;
    }
    return true;
  }));
  for (size_t b = 0; b < 12; ++b) {
    CHECK(*got[b] == data.substr(b * lt::default_block_size, lt::default_block_size));
  }
}

TEST_CASE("swarm range disk io: lone writes wait for the write delay, a full batch or a hash does not") {
  // A long delay, so that "not yet written" is not a race: the deadline is 2 s away.
  Rig rig(1 << 20, int64_t{64} << 20, std::chrono::microseconds(2'000'000));
  const std::string data = Bytes(256 * 1024, 3);  // 16 blocks, 8 pieces
  auto file = TempFile(data.size(), 0);
  REQUIRE(rig.registry->Register(Ih(1), FileRange{file, 0, data.size()}).has_value());
  auto t = rig.Add(Ih(1), data.size());
  int written = 0;
  const auto start = std::chrono::steady_clock::now();
  SUBCASE("one block is written once the delay has passed") {
    rig.WriteBlock(t->holder, data, 0, &written);
    rig.RunUntil([&] { return written > 0; }, milliseconds(300));
    CHECK(written == 0);
    REQUIRE(rig.RunUntil([&] { return written == 1; }));
    CHECK(std::chrono::steady_clock::now() - start >= milliseconds(1900));
    CHECK(ReadAt(*file, 0, lt::default_block_size) == data.substr(0, lt::default_block_size));
  }
  SUBCASE("256 KiB of writes in one round wake the disk thread at once") {
    rig.WriteAll(t->holder, data, &written);
    CHECK(rig.RunUntil([&] { return written == 16; }, milliseconds(1500)));
    CHECK(ReadAt(*file, 0, data.size()) == data);
  }
  SUBCASE("a hash job takes the waiting writes of its piece with it") {
    rig.WriteBlock(t->holder, data, 0, &written);
    rig.WriteBlock(t->holder, data, lt::default_block_size, &written);
    CHECK(rig.Hash(t->holder, 0) == lt::hasher(data.data(), Rig::kPiece).final());
    REQUIRE(rig.RunUntil([&] { return written == 2; }));
    CHECK(std::chrono::steady_clock::now() - start < milliseconds(1500));
  }
}

}  // namespace shoal::swarm
