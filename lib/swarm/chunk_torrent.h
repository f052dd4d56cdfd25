#pragma once
// Chunk torrents: a blob of S bytes is split into fixed-size chunks, and each chunk is shared as
// its own private v1 torrent with a single file. The tracker dictates the layout (chunk and
// piece size); the agent that fetched a chunk from upstream builds its metainfo; everyone else
// validates it with ParseChunkTorrent before trusting it.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/error.h"

namespace shoal::swarm {

// 20-byte SHA-1 as used by v1 torrents (piece hashes and info-hashes).
using Sha1 = std::array<uint8_t, 20>;

// Lowercase hex of a SHA-1 (40 chars).
std::string Sha1Hex(const Sha1& hash);

// How a blob of blob_size bytes is cut into chunks. Without a ramp (first_chunk_size 0) chunk k
// covers [k*chunk_size, min(S, (k+1)*chunk_size)). With a ramp the first chunks are small so
// that the swarm starts at once: chunk 0 has first_chunk_size bytes and each next chunk doubles
// until it reaches chunk_size; the rest are chunk_size. Each chunk's torrent has pieces of
// piece_size(k) bytes (the last one may be shorter).
struct ChunkLayout {
  uint64_t blob_size = 0;
  uint64_t chunk_size = 64ull << 20;  // a multiple of piece_size
  uint32_t piece_size = 4u << 20;     // full chunks' pieces: a power of two, at least 16 KiB
  uint64_t first_chunk_size = 0;      // 0, or a power of two in [16 KiB, chunk_size)

  // Checks the invariants above (and blob_size > 0). Errors: kInvalidArgument saying which.
  Status Validate() const;
  uint32_t chunk_count() const;
  uint64_t chunk_begin(uint32_t k) const;
  uint64_t chunk_length(uint32_t k) const;
  // The piece size of chunk k's torrent: piece_size for full chunks; a ramp chunk of c bytes
  // has pieces of min(piece_size, max(16 KiB, c / 4)).
  uint32_t piece_size_of(uint32_t k) const;
  uint32_t piece_count(uint32_t k) const;
  // The chunk holding byte offset (offset < blob_size).
  uint32_t chunk_at(uint64_t offset) const;
  bool operator==(const ChunkLayout&) const = default;

 private:
  // Ramp chunks (each smaller than chunk_size) and the bytes they cover together.
  uint32_t ramp_count() const;
  uint64_t ramp_bytes() const;
  uint64_t nominal_length(uint32_t k) const;
};

// Streaming SHA-1 per piece over a chunk's bytes fed in order (any split). Not thread-safe.
class PieceHasher {
 public:
  PieceHasher(uint64_t chunk_length, uint32_t piece_size);
  ~PieceHasher();
  PieceHasher(PieceHasher&&) noexcept;
  PieceHasher& operator=(PieceHasher&&) noexcept;

  // Feeds the next bytes; feeding past chunk_length is a kInvalidArgument error.
  Status Update(const void* data, size_t size);
  uint64_t fed() const { return fed_; }
  // The piece hashes; valid once fed() == chunk_length. Errors: kInternal when incomplete.
  Result<std::vector<Sha1>> Finish();

 private:
  struct Ctx;
  uint64_t length_;
  uint32_t piece_size_;
  uint64_t fed_ = 0;
  std::vector<Sha1> hashes_;
  std::unique_ptr<Ctx> ctx_;
};

// A parsed, validated chunk torrent.
struct ChunkTorrent {
  std::string metainfo;  // the bencoded .torrent, byte for byte as published
  Sha1 info_hash{};      // v1 info-hash
  std::string name;      // the single file's name
  uint64_t length = 0;   // the single file's length = the chunk's length
  uint32_t piece_size = 0;
  std::vector<Sha1> piece_hashes;
};

// Builds a private v1 single-file torrent named `name` (e.g. "<digest hex>.<k>") over a chunk of
// `length` bytes from its piece hashes. No announce URL is embedded: agents add trackers
// themselves. With a root_cert (the cluster's peer CA, canonical PEM) it is an SSL torrent
// (lib/tls/peer_tls.h): the certificate is in its info dict, and so in its info-hash. Errors:
// kInvalidArgument when the hash count does not match length/piece_size.
Result<ChunkTorrent> BuildChunkTorrent(std::string name, uint64_t length, uint32_t piece_size,
                                       std::vector<Sha1> piece_hashes,
                                       std::string_view root_cert = {});

// Parses metainfo from a peer or the tracker and checks that it is a private v1 single-file
// torrent of exactly `length` bytes with pieces of `piece_size` bytes, carrying exactly
// `root_cert` (empty: a plain torrent, no certificate). Errors: kProtocol with the reason (not
// bencode, v2-only, multi-file, wrong length, wrong piece size, too large, another or no root
// certificate).
Result<ChunkTorrent> ParseChunkTorrent(std::string_view metainfo, uint64_t length,
                                       uint32_t piece_size, std::string_view root_cert = {});

}  // namespace shoal::swarm
