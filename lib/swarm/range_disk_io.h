#pragma once
// A libtorrent disk subsystem (lt::disk_interface) that stores each chunk torrent in a byte range
// of a larger blob file. libtorrent's own storages map a torrent onto whole files only.
//
// - When libtorrent creates a torrent's storage (new_torrent), the torrent's v1 info-hash is
//   looked up in a FileRangeRegistry. An unregistered torrent gets a storage that fails every
//   operation with ENOENT: adding it fails its file check and the torrent is left in error
//   (file_error_alert). The same happens when the registered range's length is not the
//   torrent's size.
// - Reads (into a freshly allocated 16 KiB buffer), writes (of a copy of the block) and piece
//   hashing run on a small thread pool of our own. Reads and writes wake the pool once per
//   submit_jobs (libtorrent calls it after each round of async_* calls), not once per block;
//   a thread takes a batch of queued jobs and reads (writes) neighbouring blocks of the file
//   with one preadv (pwritev). Results go to libtorrent's io_context in batches: one post runs
//   every result queued until libtorrent's thread gets to it.
// - A piece's SHA-1 is followed as its blocks are written, from the copy just written: a block
//   that lands past the piece's hashed prefix waits in memory (at most max_retained_bytes in
//   all) until the prefix reaches it. At hash time only what was not followed is read back
//   from the file (pread): after the memory cap, a failed write, or a block written twice.
// - Writes are bounded in memory: once more than max_queued_disk_bytes (libtorrent setting) are
//   waiting, async_write returns true and libtorrent stops reading from that peer until we call
//   its disk_observer back, when the queue has drained to half of that.
// - A hash job for a piece waits until every write issued for that piece has landed in the
//   file. So when libtorrent reports a piece as passed (piece_finished_alert), its bytes are
//   already in the blob file (in the page cache; nothing here fsyncs).
// - Fence-like jobs (clear_piece, stop_torrent, release_files) complete once every job issued
//   for that torrent before them has completed.
// - move_storage, rename_file and delete_files answer operation_not_supported: the blob file
//   belongs to the embedding code and is never moved or deleted through libtorrent. Setting
//   file priorities is accepted and ignored; check_files answers no_error (the embedding code
//   says which pieces it has through add_torrent_params).
// - Only v1 hashes are computed (chunk torrents are v1-only); async_hash2 answers an error.

#include <utility>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include <libtorrent/disk_interface.hpp>
#include <libtorrent/io_context.hpp>
#include <libtorrent/session_params.hpp>

#include "lib/swarm/file_range.h"

namespace shoal::swarm {

namespace lt = libtorrent;

// Where hashed bytes came from; counters only grow. Shared with the embedding code's metrics.
struct RangeDiskIoStats {
  std::atomic<uint64_t> bytes_hashed_from_memory{0};  // followed as the blocks were written
  std::atomic<uint64_t> bytes_read_back{0};           // read back from the file to be hashed
};

struct RangeDiskIoOptions {
  // Chunk torrents' info-hash -> file range. Required.
  std::shared_ptr<FileRangeRegistry> registry;
  // Threads doing pread/pwrite/hashing.
  int threads = 2;
  // Optional: called on a disk thread after a block was written into the blob file, before
  // libtorrent hears of it, with the file offset and length written. Must be quick and
  // thread-safe. (A piece's completion still comes from libtorrent's piece_finished_alert.)
  std::function<void(const Sha1& info_hash, uint64_t file_offset, uint64_t length)> on_write_landed;
  // Blocks kept in memory for hashing (written past a piece's hashed prefix), in all storages.
  int64_t max_retained_bytes = 64ll << 20;
  // Optional: counts where hashed bytes came from.
  std::shared_ptr<RangeDiskIoStats> stats;
  // Writes (no read among them) queued since the disk threads last woke may wait this long for
  // more before the threads wake for them, unless they reach write_wake_bytes first: one wake-up
  // and one pwritev per several blocks where a peer hands over a block at a time (TLS peers).
  // Hash jobs, reads and a full write queue wake the threads at once. 0: wake on every round.
  std::chrono::microseconds write_delay{2000};
  int64_t write_wake_bytes = 256 << 10;
};

// Creates the disk subsystem directly (tests drive it without a session). `ioc` is libtorrent's
// network io_context, `settings` the session's settings (read in settings_updated only).
std::unique_ptr<lt::disk_interface> MakeRangeDiskIo(lt::io_context& ioc,
                                                    const lt::settings_interface& settings,
                                                    lt::counters& counters,
                                                    RangeDiskIoOptions options);

// For session_params::disk_io_constructor.
lt::disk_io_constructor_type RangeDiskIoConstructor(RangeDiskIoOptions options);

}  // namespace shoal::swarm
