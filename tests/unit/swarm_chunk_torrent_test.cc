#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <openssl/sha.h>

#include "lib/swarm/chunk_torrent.h"
#include "tests/support/why.h"

using namespace shoal;
using namespace shoal::swarm;

namespace {
std::string Bytes(size_t n) {
  std::string s(n, '\0');
  uint32_t x = 12345;
  for (auto& c : s) { x = x * 1103515245 + 12345; c = static_cast<char>(x >> 16); }
  return s;
}
}  // namespace

TEST_CASE("chunk layout: chunk and piece arithmetic") {
  ChunkLayout l{.blob_size = (10ull << 20) + 5, .chunk_size = 4ull << 20, .piece_size = 1u << 20};
  REQUIRE(l.Validate().has_value());
  CHECK(l.chunk_count() == 3);
  CHECK(l.chunk_begin(2) == (8ull << 20));
  CHECK(l.chunk_length(2) == (2ull << 20) + 5);
  CHECK(l.piece_count(2) == 3);
  CHECK(l.chunk_length(3) == 0);
  CHECK_FALSE(ChunkLayout{.blob_size = 0}.Validate().has_value());
  CHECK_FALSE((ChunkLayout{.blob_size = 1, .chunk_size = 3u << 20, .piece_size = 2u << 20})
                  .Validate().has_value());
  CHECK_FALSE((ChunkLayout{.blob_size = 1, .chunk_size = 1u << 20, .piece_size = 3u << 10})
                  .Validate().has_value());
}

TEST_CASE("chunk layout: a ramp of doubling first chunks, then full chunks, tiles the blob") {
  ChunkLayout l{.blob_size = (20ull << 20) + 7,
                .chunk_size = 8ull << 20,
                .piece_size = 1u << 20,
                .first_chunk_size = 1ull << 20};
  REQUIRE(l.Validate().has_value());
  // 1, 2, 4 MiB ramp (7 MiB), then 8 and a 5 MiB + 7 B tail.
  CHECK(l.chunk_count() == 5);
  const uint64_t begins[] = {0, 1ull << 20, 3ull << 20, 7ull << 20, 15ull << 20, 23ull << 20};
  const uint64_t lengths[] = {1ull << 20, 2ull << 20, 4ull << 20, 8ull << 20, (5ull << 20) + 7};
  for (uint32_t k = 0; k < 5; ++k) {
    CAPTURE(k);
    CHECK(l.chunk_begin(k) == begins[k]);
    CHECK(l.chunk_length(k) == lengths[k]);
  }
  CHECK(l.chunk_begin(5) == (23ull << 20));
  CHECK(l.chunk_length(5) == 0);
  // Pieces: a quarter of a ramp chunk (at least 16 KiB), piece_size for full chunks.
  CHECK(l.piece_size_of(0) == (256u << 10));
  CHECK(l.piece_size_of(2) == (1u << 20));
  CHECK(l.piece_size_of(3) == (1u << 20));
  CHECK(l.piece_count(0) == 4);
  CHECK(l.piece_count(4) == 6);
  // Every byte belongs to exactly the chunk whose range holds it.
  uint64_t covered = 0;
  for (uint32_t k = 0; k < l.chunk_count(); ++k) {
    CHECK(l.chunk_begin(k) == covered);
    CHECK(l.chunk_at(covered) == k);
    CHECK(l.chunk_at(covered + l.chunk_length(k) - 1) == k);
    covered += l.chunk_length(k);
  }
  CHECK(covered == l.blob_size);
  // A blob that ends inside the ramp.
  ChunkLayout small = l;
  small.blob_size = (2ull << 20);
  CHECK(small.chunk_count() == 2);
  CHECK(small.chunk_length(1) == (1ull << 20));
  small.blob_size = 100;
  CHECK(small.chunk_count() == 1);
  CHECK(small.chunk_length(0) == 100);
  CHECK(small.piece_count(0) == 1);
  // The ramp's first chunk must be a power of two below the chunk size.
  for (uint64_t bad : {3ull << 20, 8ull << 20, 8ull << 10, 16ull << 20}) {
    ChunkLayout b = l;
    b.first_chunk_size = bad;
    CHECK_FALSE(b.Validate().has_value());
  }
}

TEST_CASE("piece hasher: SHA-1 per piece for any split, matching OpenSSL one-shot") {
  const uint32_t piece = 16u << 10;
  std::string data = Bytes(3 * piece + 100);
  PieceHasher h(data.size(), piece);
  size_t pos = 0;
  for (size_t step : {1u, 7000u, 16384u, 20000u, 99999u}) {
    size_t take = std::min(step, data.size() - pos);
    REQUIRE(h.Update(data.data() + pos, take).has_value());
    pos += take;
  }
  REQUIRE(h.Update(data.data() + pos, data.size() - pos).has_value());
  auto hashes = h.Finish();
  REQUIRE(hashes.has_value());
  REQUIRE(hashes.value().size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    size_t len = std::min<size_t>(piece, data.size() - i * piece);
    Sha1 want{};
    SHA1(reinterpret_cast<const unsigned char*>(data.data() + i * piece), len, want.data());
    CHECK(hashes.value()[i] == want);
  }
  CHECK_FALSE(h.Update("x", 1).has_value());
  PieceHasher partial(10, piece);
  CHECK_FALSE(partial.Finish().has_value());
}

TEST_CASE("chunk torrent: build, parse back, reject mismatched layouts") {
  const uint32_t piece = 16u << 10;
  std::string data = Bytes(2 * piece + 1);
  PieceHasher h(data.size(), piece);
  REQUIRE(h.Update(data.data(), data.size()).has_value());
  auto built = BuildChunkTorrent("abc.0", data.size(), piece, h.Finish().value());
  REQUIRE_MESSAGE(built.has_value(), Why(built));
  CHECK(built.value().name == "abc.0");
  CHECK(built.value().piece_hashes.size() == 3);

  auto parsed = ParseChunkTorrent(built.value().metainfo, data.size(), piece);
  REQUIRE(parsed.has_value());
  CHECK(parsed.value().info_hash == built.value().info_hash);
  CHECK(Sha1Hex(parsed.value().info_hash).size() == 40);

  auto wrong_len = ParseChunkTorrent(built.value().metainfo, data.size() + 1, piece);
  REQUIRE_FALSE(wrong_len.has_value());
  CHECK(wrong_len.error().code == ErrorCode::kProtocol);
  CHECK_FALSE(ParseChunkTorrent(built.value().metainfo, data.size(), piece * 2).has_value());
  CHECK_FALSE(ParseChunkTorrent("d4:infoi3ee", data.size(), piece).has_value());
  CHECK_FALSE(ParseChunkTorrent("", data.size(), piece).has_value());
  CHECK_FALSE(BuildChunkTorrent("x", data.size(), piece, {}).has_value());
}

TEST_CASE("chunk torrent: an SSL torrent carries exactly the cluster's peer CA") {
  const uint32_t piece = 16u << 10;
  std::string data = Bytes(piece + 5);
  PieceHasher h(data.size(), piece);
  REQUIRE(h.Update(data.data(), data.size()).has_value());
  std::vector<Sha1> hashes = h.Finish().value();
  const std::string ca = "-----BEGIN CERTIFICATE-----\ncluster\n-----END CERTIFICATE-----\n";
  const std::string other = "-----BEGIN CERTIFICATE-----\nother\n-----END CERTIFICATE-----\n";

  auto plain = BuildChunkTorrent("abc.0", data.size(), piece, hashes);
  auto ssl = BuildChunkTorrent("abc.0", data.size(), piece, hashes, ca);
  REQUIRE(plain.has_value());
  REQUIRE(ssl.has_value());
  // The certificate is in the info dict: the same bytes make another swarm.
  CHECK(ssl.value().info_hash != plain.value().info_hash);
  CHECK(ssl.value().piece_hashes == plain.value().piece_hashes);

  CHECK(ParseChunkTorrent(ssl.value().metainfo, data.size(), piece, ca).has_value());
  auto no_ca = ParseChunkTorrent(ssl.value().metainfo, data.size(), piece);
  REQUIRE_FALSE(no_ca.has_value());
  CHECK(no_ca.error().code == ErrorCode::kProtocol);
  CHECK(no_ca.error().message.find("plain peers") != std::string::npos);
  auto foreign = ParseChunkTorrent(ssl.value().metainfo, data.size(), piece, other);
  REQUIRE_FALSE(foreign.has_value());
  CHECK(foreign.error().message.find("another root certificate") != std::string::npos);
  auto unsigned_plain = ParseChunkTorrent(plain.value().metainfo, data.size(), piece, ca);
  REQUIRE_FALSE(unsigned_plain.has_value());
  CHECK(unsigned_plain.error().message.find("plain torrent") != std::string::npos);
}
