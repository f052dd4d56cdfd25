#include "lib/swarm/chunk_torrent.h"

#include <utility>

#include <algorithm>
#include <cstdio>

#include <openssl/evp.h>
#include <libtorrent/create_torrent.hpp>
#include <libtorrent/file_storage.hpp>
#include <libtorrent/torrent_info.hpp>

namespace shoal::swarm {
namespace lt = libtorrent;

namespace {

constexpr uint32_t kMinPieceSize = 16u << 10;
constexpr uint32_t kMaxPieceSize = 64u << 20;
// Matches libtorrent's load_torrent_limits default (10 MB, 2M pieces) from below.
constexpr size_t kMaxMetainfo = 4u << 20;

Sha1 FromLt(const lt::sha1_hash& h) {
  Sha1 out{};
  std::copy(h.begin(), h.end(), out.begin());
  return out;
}

}  // namespace

std::string Sha1Hex(const Sha1& hash) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(40, '0');
  for (size_t i = 0; i < hash.size(); ++i) {
    out[2 * i] = kHex[hash[i] >> 4];
    out[2 * i + 1] = kHex[hash[i] & 15];
  }
  return out;
}

Status ChunkLayout::Validate() const {
  if (blob_size == 0) return MakeError(ErrorCode::kInvalidArgument, "blob size is 0");
  if (piece_size < kMinPieceSize || piece_size > kMaxPieceSize ||
      (piece_size & (piece_size - 1)) != 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "piece size " + std::to_string(piece_size) +
                         " is not a power of two between 16 KiB and 64 MiB");
  }
  if (chunk_size == 0 || chunk_size % piece_size != 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "chunk size " + std::to_string(chunk_size) +
                         " is not a positive multiple of the piece size " +
                         std::to_string(piece_size));
  }
  if (first_chunk_size != 0 &&
      (first_chunk_size < kMinPieceSize || first_chunk_size >= chunk_size ||
       (first_chunk_size & (first_chunk_size - 1)) != 0)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "first chunk size " + std::to_string(first_chunk_size) +
                         " is not 0 or a power of two from 16 KiB up to below the chunk size " +
                         std::to_string(chunk_size));
  }
  if (blob_size / chunk_size + ramp_count() + 1 > (1ull << 31)) {
    return MakeError(ErrorCode::kInvalidArgument, "blob has too many chunks");
  }
  return Ok();
}

uint32_t ChunkLayout::ramp_count() const {
  if (first_chunk_size == 0) return 0;
  uint32_t r = 0;
  while ((first_chunk_size << r) < chunk_size) ++r;
  return r;
}

uint64_t ChunkLayout::ramp_bytes() const {
  return first_chunk_size * ((uint64_t{1} << ramp_count()) - 1);
}

uint64_t ChunkLayout::nominal_length(uint32_t k) const {
  return k < ramp_count() ? first_chunk_size << k : chunk_size;
}

uint32_t ChunkLayout::chunk_count() const {
  if (blob_size == 0) return 0;
  return chunk_at(blob_size - 1) + 1;
}

uint32_t ChunkLayout::chunk_at(uint64_t offset) const {
  const uint32_t r = ramp_count();
  const uint64_t ramp = ramp_bytes();
  if (offset < ramp) {
    // Chunk k starts at first * (2^k - 1): the largest k with that <= offset.
    uint32_t k = 0;
    while (k + 1 < r && first_chunk_size * ((uint64_t{1} << (k + 1)) - 1) <= offset) ++k;
    return k;
  }
  return r + static_cast<uint32_t>((offset - ramp) / chunk_size);
}

uint64_t ChunkLayout::chunk_begin(uint32_t k) const {
  const uint32_t r = ramp_count();
  if (k < r) return first_chunk_size * ((uint64_t{1} << k) - 1);
  return ramp_bytes() + uint64_t{k - r} * chunk_size;
}

uint64_t ChunkLayout::chunk_length(uint32_t k) const {
  uint64_t begin = chunk_begin(k);
  if (begin >= blob_size) return 0;
  return std::min<uint64_t>(nominal_length(k), blob_size - begin);
}

uint32_t ChunkLayout::piece_size_of(uint32_t k) const {
  uint64_t nominal = nominal_length(k);
  if (nominal >= chunk_size) return piece_size;
  return static_cast<uint32_t>(
      std::min<uint64_t>(piece_size, std::max<uint64_t>(kMinPieceSize, nominal / 4)));
}

uint32_t ChunkLayout::piece_count(uint32_t k) const {
  uint32_t p = piece_size_of(k);
  return static_cast<uint32_t>((chunk_length(k) + p - 1) / p);
}

struct PieceHasher::Ctx {
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  ~Ctx() { EVP_MD_CTX_free(md); }
};

PieceHasher::PieceHasher(uint64_t chunk_length, uint32_t piece_size)
    : length_(chunk_length), piece_size_(piece_size), ctx_(std::make_unique<Ctx>()) {
  EVP_DigestInit_ex(ctx_->md, EVP_sha1(), nullptr);
}
PieceHasher::~PieceHasher() = default;
PieceHasher::PieceHasher(PieceHasher&&) noexcept = default;
PieceHasher& PieceHasher::operator=(PieceHasher&&) noexcept = default;

Status PieceHasher::Update(const void* data, size_t size) {
  if (size > length_ - fed_) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "piece hasher fed " + std::to_string(fed_ + size) + " bytes of a " +
                         std::to_string(length_) + "-byte chunk");
  }
  const auto* p = static_cast<const unsigned char*>(data);
  while (size > 0) {
    uint64_t in_piece = fed_ % piece_size_;
    size_t take = static_cast<size_t>(std::min<uint64_t>(size, piece_size_ - in_piece));
    EVP_DigestUpdate(ctx_->md, p, take);
    fed_ += take;
    p += take;
    size -= take;
    if (fed_ % piece_size_ == 0 || fed_ == length_) {
      Sha1 h{};
      unsigned int n = 0;
      EVP_DigestFinal_ex(ctx_->md, h.data(), &n);
      hashes_.push_back(h);
      EVP_DigestInit_ex(ctx_->md, EVP_sha1(), nullptr);
    }
  }
  return Ok();
}

Result<std::vector<Sha1>> PieceHasher::Finish() {
  if (fed_ != length_) {
    return MakeError(ErrorCode::kInternal, "piece hasher finished after " +
                                               std::to_string(fed_) + " of " +
                                               std::to_string(length_) + " bytes");
  }
  return hashes_;
}

Result<ChunkTorrent> BuildChunkTorrent(std::string name, uint64_t length, uint32_t piece_size,
                                       std::vector<Sha1> piece_hashes,
                                       std::string_view root_cert) {
  if (length == 0) return MakeError(ErrorCode::kInvalidArgument, "chunk length is 0");
  if (piece_size < kMinPieceSize || (piece_size & (piece_size - 1)) != 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "piece size " + std::to_string(piece_size) + " is not a power of two >= 16 KiB");
  }
  uint64_t pieces = (length + piece_size - 1) / piece_size;
  if (pieces != piece_hashes.size()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "chunk of " + std::to_string(length) + " bytes needs " +
                         std::to_string(pieces) + " piece hashes, got " +
                         std::to_string(piece_hashes.size()));
  }
  try {
    lt::file_storage fs;
    fs.add_file(name, static_cast<std::int64_t>(length));
    lt::create_torrent ct(fs, static_cast<int>(piece_size), lt::create_torrent::v1_only);
    for (size_t i = 0; i < piece_hashes.size(); ++i) {
      lt::sha1_hash h(reinterpret_cast<const char*>(piece_hashes[i].data()));
      ct.set_hash(lt::piece_index_t(static_cast<int>(i)), h);
    }
    ct.set_priv(true);
    ct.set_creator("shoal");
    if (!root_cert.empty()) ct.set_root_cert(lt::string_view(root_cert.data(), root_cert.size()));
    std::vector<char> buf = ct.generate_buf();
    return ParseChunkTorrent(std::string_view(buf.data(), buf.size()), length, piece_size,
                             root_cert);
  } catch (const std::exception& e) {
    return MakeError(ErrorCode::kInvalidArgument,
                     std::string("cannot build chunk torrent: ") + e.what());
  }
}

Result<ChunkTorrent> ParseChunkTorrent(std::string_view metainfo, uint64_t length,
                                       uint32_t piece_size, std::string_view root_cert) {
  if (metainfo.size() > kMaxMetainfo) {
    return MakeError(ErrorCode::kProtocol, "chunk metainfo of " + std::to_string(metainfo.size()) +
                                               " bytes is larger than " +
                                               std::to_string(kMaxMetainfo));
  }
  lt::error_code ec;
  lt::torrent_info ti(lt::span<char const>(metainfo.data(), static_cast<long>(metainfo.size())),
                      ec, lt::from_span);
  if (ec) return MakeError(ErrorCode::kProtocol, "chunk metainfo does not parse: " + ec.message());
  if (!ti.info_hashes().has_v1()) {
    return MakeError(ErrorCode::kProtocol, "chunk metainfo has no v1 info-hash (v2-only)");
  }
  if (!ti.priv()) return MakeError(ErrorCode::kProtocol, "chunk metainfo is not private");
  const lt::file_storage& fs = ti.files();
  if (fs.num_files() != 1) {
    return MakeError(ErrorCode::kProtocol,
                     "chunk metainfo has " + std::to_string(fs.num_files()) + " files, not 1");
  }
  if (static_cast<uint64_t>(ti.total_size()) != length) {
    return MakeError(ErrorCode::kProtocol, "chunk metainfo is " +
                                               std::to_string(ti.total_size()) +
                                               " bytes long, the chunk is " +
                                               std::to_string(length));
  }
  if (static_cast<uint32_t>(ti.piece_length()) != piece_size) {
    return MakeError(ErrorCode::kProtocol, "chunk metainfo has pieces of " +
                                               std::to_string(ti.piece_length()) +
                                               " bytes, the layout says " +
                                               std::to_string(piece_size));
  }
  lt::string_view carried = ti.ssl_cert();
  if (std::string_view(carried.data(), carried.size()) != root_cert) {
    if (root_cert.empty()) {
      return MakeError(ErrorCode::kProtocol,
                       "chunk metainfo is an SSL torrent; this swarm has plain peers (no peer CA)");
    }
    return MakeError(ErrorCode::kProtocol,
                     carried.empty()
                         ? "chunk metainfo is a plain torrent; this swarm's peers use TLS (it must "
                           "carry the cluster's peer CA)"
                         : "chunk metainfo carries another root certificate than the cluster's "
                           "peer CA");
  }
  ChunkTorrent out;
  out.metainfo = std::string(metainfo);
  out.info_hash = FromLt(ti.info_hashes().v1);
  out.name = fs.file_name(lt::file_index_t(0)).to_string();
  out.length = length;
  out.piece_size = piece_size;
  out.piece_hashes.reserve(static_cast<size_t>(ti.num_pieces()));
  for (int i = 0; i < ti.num_pieces(); ++i) {
    out.piece_hashes.push_back(FromLt(ti.hash_for_piece(lt::piece_index_t(i))));
  }
  return out;
}

}  // namespace shoal::swarm
