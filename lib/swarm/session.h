#pragma once
// Swarm: the agent's one libtorrent session, set up for a private LAN swarm of chunk torrents
// (see chunk_torrent.h). Every chunk torrent's data is a byte range of one blob file
// (range_disk_io.h), so a blob is downloaded by adding all its chunks over the same file.
//
// Threading: every method must be called from the thread running the io_context given to the
// constructor (the embedder's network thread). libtorrent runs its own network thread and disk
// threads; its alerts are popped and dispatched on the embedder's io_context, so every callback
// (on_piece, on_complete, on_error) runs on that thread too. Callbacks may call back into the
// Swarm (AddChunk, RemoveChunk, even Stop). Some methods make a synchronous call into
// libtorrent's network thread (AddChunk, RemoveChunk, Stats, Start, Stop): they block the
// caller for about a millisecond; Stop() blocks until the session has shut down (up to the
// stop-announce timeout of 2 s when a tracker does not answer).
//
// Peer TLS (SwarmOptions::tls): chunks are SSL torrents, each given this agent's certificate
// when libtorrent asks (torrent_need_cert_alert); the session has only a TLS listen socket.
//
// Settings (private LAN): no DHT, LSD, UPnP or NAT-PMP; TCP only (uTP is far slower on a
// LAN); LAN peers are *not* put in libtorrent's unlimited "local" peer class, so unchoke slots
// apply to them; tuned from lt::high_performance_seed(); torrents are never auto-managed
// (no queueing); every tracker of a chunk is announced to (one tier, announce_to_all_*).

#include <utility>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/system/error_code.hpp>

#include "lib/core/error.h"
#include "lib/swarm/chunk_torrent.h"
#include "lib/swarm/file_range.h"
#include "lib/tls/peer_tls.h"

namespace shoal::swarm {

struct SwarmOptions {
  // "IP:port" to listen on; port 0 picks a free one (see Swarm::listen_port). Use the node's
  // IP: 0.0.0.0 opens one socket per interface, and each of them announces.
  std::string listen_interface = "0.0.0.0:0";
  // Several sessions on one host (tests) need this; a cluster node has one agent per IP.
  bool allow_multiple_connections_per_ip = false;
  // Threads doing the chunk torrents' disk I/O (pread, pwrite, piece hashing). One: a blob's
  // chunk torrents share one file, and two threads writing it contend for its inode lock
  // (ext4 i_rwsem, spinning): 6.6 core-s/GiB received with two, 5.7 with one, at the same
  // throughput (docs/benchmarks.md, "Where the receiver's core-seconds go").
  int disk_threads = 1;
  // Queued writes wait this long for more before the disk thread wakes (RangeDiskIoOptions).
  std::chrono::microseconds disk_write_delay{2000};
  // Peer connections of the whole session.
  int connections_limit = 400;
  // Peers unchoked at once (uploading to them); -1 unchokes everyone.
  int unchoke_slots = -1;
  // Peer connections of one chunk torrent, incoming and outgoing (libtorrent's per-torrent
  // max_connections); each announce asks the tracker for half as many (num_want), leaving the
  // other half for peers that connect to us. 0: libtorrent's defaults (200 wanted, no limit
  // but connections_limit). Few peers per chunk keep the TLS handshakes and the end game's
  // duplicate blocks (one per idle connection) small: every chunk is its own torrent, so an
  // agent with 1,723 chunks of a 17 GB image would otherwise open up to 200 connections for
  // each (docs/benchmarks.md, "Peers per chunk").
  int peers_per_chunk = 4;
  // Bytes received from peers and not yet written to the blob file before we stop reading
  // from sockets.
  int max_queued_disk_bytes = 16 << 20;
  // 16 KiB block requests in flight per peer connection, both ways (see MakeSettings): 16
  // blocks is 256 KiB, a LAN link's bandwidth-delay product several times over.
  int request_queue_blocks = 16;
  // Lower bound on the re-announce interval, in seconds (the tracker's interval wins if larger).
  int min_announce_interval_s = 30;
  // A downloading chunk that received no payload for this long, and has a free connection slot,
  // re-announces for more peers; again after twice as long while it stays idle, up to
  // min_announce_interval_s. Otherwise a chunk whose few peers have nothing it needs (they
  // joined when it did) would wait for the tracker's interval. 0: off.
  int stall_reannounce_ms = 3000;
  // A peer connection on which neither side wanted anything for this long is closed
  // (libtorrent's inactivity_timeout; high_performance_seed has 20 s), freeing the slot for a
  // peer with data: with a few peers per chunk, idle peers can fill a chunk's every slot.
  int idle_peer_timeout_s = 5;
  // Alerts libtorrent keeps before dropping; piece alerts must not be lost (we resync if they
  // are, see Swarm), so this is generous.
  int alert_queue_size = 100000;
  // libtorrent settings_pack overrides as "name=value" (settings_pack names, e.g.
  // "max_out_request_queue=64"), applied last. Start fails on an unknown name or a bad value.
  std::vector<std::string> libtorrent_settings;
  // Peer TLS (lib/tls/peer_tls.h): the session listens for TLS only, every chunk must be an SSL
  // torrent of tls->ca_pem, and peers must present certificates from that CA. Without it,
  // plain TCP peers, and every chunk must be a plain torrent.
  std::optional<tls::PeerTls> tls;
};

// One chunk torrent to download or seed.
struct ChunkSpec {
  ChunkTorrent torrent;  // parsed and validated (ParseChunkTorrent / BuildChunkTorrent)
  FileRange range;       // where its bytes live; range.length must equal torrent.length
  // True when every byte of the range is already there and verified (e.g. the blob's sha256
  // matched): the chunk is added as a seed with no hashing at all.
  bool seed = false;
  // Without `seed`: pieces already in the range and verified by the embedder (empty = none),
  // e.g. after a restart. They are not hashed and not reported through on_piece.
  std::vector<bool> have_pieces;
  // Announce URLs, one tier each in this order: announces go to the first that works, and move
  // to the next when it fails (libtorrent's announce_to_all_tiers = false).
  std::vector<std::string> tracker_urls;
  // Download pieces in order (helps streaming the blob out while it downloads).
  bool sequential = false;
  // A piece passed its hash check and its bytes [begin, end) (offsets in the chunk) are in the
  // file. Called exactly once per piece that was downloaded, never for seed/have_pieces ones.
  std::function<void(uint32_t piece, uint64_t begin, uint64_t end)> on_piece;
  // Every piece of the chunk is in the file (after the last on_piece). Not called for chunks
  // added with seed = true or with every piece in have_pieces. The chunk keeps seeding.
  std::function<void()> on_complete;
  // The torrent stopped on an error (disk error, unregistered or mismatched range, torrent
  // error). Called at most once per chunk; the chunk stays added until RemoveChunk.
  std::function<void(const Error&)> on_error;
};

struct ChunkHandle {
  Sha1 info_hash{};
};

// What the trackers said about one chunk since it was added, and its peer connections now.
struct ChunkAnnounces {
  int sent = 0;           // announces libtorrent sent (a UDP one may still be in flight, or lost)
  int replies = 0;        // announces answered
  int errors = 0;         // announces that failed (unreachable tracker, refused, timed out)
  int peers_offered = 0;  // peers in the latest answer
  int connected = 0;      // peer connections at the last sample (each second, while downloading)
  // The latest peer connection that got past connecting and was then closed: a peer whose
  // every slot for this chunk was taken closes us after the handshake. Unlike a failed connect
  // (a dead or unreachable peer), it says the swarm is alive. Default: none yet.
  std::chrono::steady_clock::time_point last_peer_closed{};
  std::string last_error;
  // The latest error says this host cannot route to the tracker (no route, unreachable
  // network, address not available), not that the tracker refused or timed out.
  bool unroutable = false;
};

struct ChunkStats {
  Sha1 info_hash{};
  std::string name;
  uint64_t downloaded = 0;  // payload bytes received from peers (including failed/redundant)
  uint64_t uploaded = 0;    // payload bytes sent to peers
  uint64_t redundant = 0;   // of downloaded: bytes we already had (end-game duplicates)
  uint32_t pieces_have = 0;
  uint32_t pieces_total = 0;
  int peers = 0;  // connected peers
  bool seeding = false;
};

// The reasons of SwarmStats::wasted, in order, as metric labels.
inline constexpr std::array<const char*, 6> kWasteReasons = {"timed_out", "cancelled", "unknown",
                                                             "seed",      "end_game",  "closing"};

struct SwarmStats {
  // Payload bytes from/to peers since Start(), including chunks removed since.
  uint64_t downloaded = 0;
  uint64_t uploaded = 0;
  uint64_t redundant = 0;  // of downloaded: bytes received that we already had
  // libtorrent's wasted piece bytes by reason (kWasteReasons), from its session counters
  // (ses.waste_piece_*), sampled every second.
  std::array<uint64_t, kWasteReasons.size()> wasted{};
  uint64_t hash_failures = 0;     // pieces that failed their hash check
  uint64_t peers_banned = 0;      // peers banned for sending bad data
  uint64_t announce_replies = 0;  // tracker announces answered
  uint64_t announce_errors = 0;   // tracker announces that failed
  // Re-announces of downloading chunks that got no payload for stall_reannounce_ms.
  uint64_t stall_reannounces = 0;
  // Peer connections that ended in their TLS handshake (no certificate, one from another CA, a
  // plain BitTorrent client on the TLS port): with peer TLS on, every outsider's attempt.
  uint64_t peer_tls_refused = 0;
  // Piece bytes hashed (SHA-1) as they were written, and read back from the blob file to be
  // hashed (range_disk_io.h): the second should stay near 0.
  uint64_t piece_bytes_hashed_from_memory = 0;
  uint64_t piece_bytes_read_back = 0;
  size_t torrents = 0;            // chunks currently added
  // Peer connections open now (libtorrent's peer.num_peers_connected, sampled every second).
  uint64_t peers_connected = 0;
  std::vector<ChunkStats> chunks;
};

// An announce URL without its scheme and query: the same tracker whether it is announced to
// over udp:// or http:// and whatever announce key the query carries.
std::string_view AnnounceUrlBase(std::string_view url);

// Whether a peer connection that ended with ec was closed by the remote end (EOF, reset, broken
// pipe, a TLS stream cut short), not by this session's own rules (idle, redundant, over a
// limit, a protocol error), which libtorrent reports with its own error category.
bool ClosedByRemote(const boost::system::error_code& ec);

class Swarm {
 public:
  // `ioc` must outlive the Swarm; see the threading note above.
  Swarm(boost::asio::io_context& ioc, SwarmOptions options);
  // Calls Stop().
  ~Swarm();
  Swarm(const Swarm&) = delete;
  Swarm& operator=(const Swarm&) = delete;

  // Creates the session and starts listening. Errors: kUnavailable when the listen address
  // cannot be bound (libtorrent's message), kInvalidArgument for a malformed one, kInternal
  // when already started.
  Status Start();
  // The bound TCP port (the TLS one with peer TLS); 0 before Start() or after Stop().
  uint16_t listen_port() const;
  // The root certificate chunk torrents of this swarm carry: options.tls->ca_pem, or empty
  // (plain peers). Pass it to BuildChunkTorrent and ParseChunkTorrent.
  const std::string& root_cert() const;
  // Graceful shutdown: pauses every torrent, sends stop announces, aborts the session and stops
  // the disk threads. Blocks until done. Idempotent. Chunks are forgotten without callbacks.
  void Stop();
  // The first half of Stop, for trackers served on this thread (the agent's announce relay):
  // pauses every torrent, so each announces `stopped` and no more data moves, and returns. Keep
  // the io_context running until AnnouncesInFlight() is false (or long enough), then Stop().
  void Pause();
  // Whether some chunk torrent's tracker announce is still on its way (after Pause: whether the
  // `stopped` announces are answered). False when stopped.
  bool AnnouncesInFlight() const;

  // Adds a chunk torrent over spec.range and starts it (not auto-managed, not paused), then
  // announces to its trackers at once. Errors: kInvalidArgument when the info-hash is already
  // added (remove it first) or the range is invalid or not the torrent's length; kProtocol
  // when the metainfo does not load; kUnavailable when not started; kInternal when libtorrent
  // refuses it.
  Result<ChunkHandle> AddChunk(ChunkSpec spec);
  // Removes the chunk torrent (never touches the file); no callbacks for it afterwards. No-op
  // when absent. libtorrent drops the torrent asynchronously: re-adding the same info-hash
  // right away may fail with kInternal (duplicate) for a moment.
  void RemoveChunk(const Sha1& info_hash);
  bool HasChunk(const Sha1& info_hash) const;
  // Tracker announces answered so far, over every chunk (cheap: no call into libtorrent).
  uint64_t AnnounceReplies() const;

  SwarmStats Stats();
  // Announces every chunk to its trackers now.
  void ReannounceAll();
  // Announces, each at a random moment within `spread`, the chunks whose announce URLs (tier i
  // = urls[i]) `pick` accepts, to the first of their tiers that works: a restarted replica lost
  // its peer lists, or a dead one's chunks move to the next tier. Returns how many.
  size_t ReannounceWhere(const std::function<bool(const std::vector<std::string>& urls)>& pick,
                         std::chrono::seconds spread);
  // Replaces each chunk's announce URLs with those of `urls` that differ from them only in the
  // scheme or after the '?' (each chunk keeps its order of tiers), and re-announces: the
  // agent's token, and with it the announce key in the URLs' query, rotated; or a replica's
  // announces moved from udp:// to http://.
  void ReplaceTrackers(const std::vector<std::string>& urls);
  // UDP announces that timed out so far, by tracker URL without its query.
  std::map<std::string, uint64_t> UdpAnnounceTimeouts() const;
  // Announces one chunk now, to learn peers that joined since (no-op when absent).
  void Reannounce(const Sha1& info_hash);
  // Holds the session's downloads from peers to bytes_per_s (> 0), or back to the configured
  // limit (libtorrent's download_rate_limit, after overrides; 0: none) when 0. No-op before
  // Start(). libtorrent applies it asynchronously.
  void CapDownloadRate(int64_t bytes_per_s);
  // The chunk's announce results and connected peers (sampled each second); nullopt when it is
  // not added. No call into libtorrent.
  std::optional<ChunkAnnounces> Announces(const Sha1& info_hash) const;
  // The chunk's peer connections now, seeding or not (-1 when it is not added): a synchronous
  // call into libtorrent (about a millisecond), to confirm a decision or in tests; not to poll.
  int PeersNow(const Sha1& info_hash) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace shoal::swarm
