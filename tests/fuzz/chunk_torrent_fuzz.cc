// Fuzzes ParseChunkTorrent: chunk metainfo arrives from peers and the tracker, and an agent
// trusts what this accepts. The input is the metainfo; the expected chunk length and piece size
// are read from its own "length" and "piece length" keys (so mutations keep them consistent and
// the checks past them are reached) and then also varied.
//
// Properties: an accepted torrent is private, single-file, exactly the expected length and piece
// size; its info_hash is the SHA-1 of the info dictionary's exact bytes; its piece hashes are the
// "pieces" string cut in 20-byte slices, one per piece; its name is a safe single path element;
// it can be rebuilt with BuildChunkTorrent to the same name and pieces; any other length or piece
// size is refused. Errors are kProtocol with a printable message.
//
// libtorrent itself is not instrumented: coverage feedback comes from shoal's code only.

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <openssl/evp.h>
#include <libtorrent/bdecode.hpp>

#include "lib/swarm/chunk_torrent.h"
#include "tests/fuzz/fuzz_check.h"

using namespace shoal;
using namespace shoal::swarm;
namespace lt = libtorrent;

namespace {

// The first integer value written as `key` in bencode ("6:lengthi123e"), if any.
std::optional<int64_t> FindInt(std::string_view metainfo, std::string_view key) {
  std::string needle = std::to_string(key.size()) + ":" + std::string(key) + "i";
  size_t at = metainfo.find(needle);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = metainfo.substr(at + needle.size());
  int64_t value = 0;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
  if (ec != std::errc() || end == rest.data() + rest.size() || *end != 'e') return std::nullopt;
  return value;
}

Sha1 Sha1Of(std::string_view bytes) {
  Sha1 out{};
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), out.data(), &n, EVP_sha1(), nullptr);
  FUZZ_CHECK(n == out.size());
  return out;
}

void CheckError(const Error& e) {
  FUZZ_CHECK(e.code == ErrorCode::kProtocol);
  FUZZ_CHECK(std::string_view(e.message).starts_with("chunk metainfo "));
  FUZZ_CHECK(fuzz::IsPrintable(e.message));
}

void CheckAccepted(std::string_view metainfo, uint64_t length, uint32_t piece_size,
                   const ChunkTorrent& t) {
  FUZZ_CHECK(t.metainfo == metainfo);
  FUZZ_CHECK(t.length == length);
  FUZZ_CHECK(t.piece_size == piece_size);
  FUZZ_CHECK(piece_size > 0);
  FUZZ_CHECK(t.piece_hashes.size() == (length + piece_size - 1) / piece_size);

  // What the agent believes about the torrent is what the bytes say.
  lt::error_code ec;
  lt::bdecode_node root = lt::bdecode(lt::span<char const>(metainfo.data(),
                                                           static_cast<long>(metainfo.size())),
                                      ec);
  FUZZ_CHECK(!ec && root.type() == lt::bdecode_node::dict_t);
  lt::bdecode_node info = root.dict_find_dict("info");
  FUZZ_CHECK(info.type() == lt::bdecode_node::dict_t);
  lt::span<char const> info_bytes = info.data_section();
  FUZZ_CHECK(Sha1Of(std::string_view(info_bytes.data(), static_cast<size_t>(info_bytes.size()))) ==
             t.info_hash);
  FUZZ_CHECK(info.dict_find_int_value("private", 0) != 0);
  lt::string_view lt_pieces = info.dict_find_string_value("pieces");
  std::string_view pieces(lt_pieces.data(), lt_pieces.size());
  FUZZ_CHECK(pieces.size() >= 20 * t.piece_hashes.size());
  for (size_t i = 0; i < t.piece_hashes.size(); ++i) {
    std::string_view slice = pieces.substr(20 * i, 20);
    FUZZ_CHECK(std::equal(slice.begin(), slice.end(), t.piece_hashes[i].begin(),
                          [](char a, uint8_t b) { return static_cast<uint8_t>(a) == b; }));
  }

  // The name is one harmless path element.
  FUZZ_CHECK(!t.name.empty());
  FUZZ_CHECK(t.name != "." && t.name != "..");
  FUZZ_CHECK(t.name.find('/') == std::string::npos);
  FUZZ_CHECK(t.name.find('\0') == std::string::npos);

  // Parsing is deterministic.
  auto again = ParseChunkTorrent(metainfo, length, piece_size);
  FUZZ_CHECK(again && again.value().info_hash == t.info_hash);

  // Any other layout is refused.
  for (uint64_t other : {length + 1, length - 1}) {
    auto wrong = ParseChunkTorrent(metainfo, other, piece_size);
    FUZZ_CHECK(!wrong);
    CheckError(wrong.error());
  }
  for (uint32_t other : {piece_size * 2, piece_size / 2}) {
    if (other == piece_size) continue;
    auto wrong = ParseChunkTorrent(metainfo, length, other);
    FUZZ_CHECK(!wrong);
    CheckError(wrong.error());
  }

  // What a peer published can be republished: same name, same pieces.
  bool buildable = length > 0 && piece_size >= (16u << 10) && (piece_size & (piece_size - 1)) == 0;
  if (buildable) {
    auto rebuilt = BuildChunkTorrent(t.name, length, piece_size, t.piece_hashes);
    FUZZ_CHECK(rebuilt);
    FUZZ_CHECK(rebuilt.value().name == t.name);
    FUZZ_CHECK(rebuilt.value().piece_hashes == t.piece_hashes);
    FUZZ_CHECK(rebuilt.value().length == length);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view metainfo(reinterpret_cast<const char*>(data), size);

  auto length_key = FindInt(metainfo, "length");
  auto piece_key = FindInt(metainfo, "piece length");
  uint64_t length = length_key && *length_key > 0 ? static_cast<uint64_t>(*length_key) : 1;
  uint32_t piece_size = piece_key && *piece_key > 0 && *piece_key <= INT32_MAX
                            ? static_cast<uint32_t>(*piece_key)
                            : 16u << 10;

  auto result = ParseChunkTorrent(metainfo, length, piece_size);
  if (result) {
    CheckAccepted(metainfo, length, piece_size, result.value());
  } else {
    CheckError(result.error());
  }
  // A layout picked from the input's size, mostly not matching.
  uint64_t other_length = 1 + size % 100000;
  auto other = ParseChunkTorrent(metainfo, other_length, 16u << 10);
  if (other) {
    CheckAccepted(metainfo, other_length, 16u << 10, other.value());
  } else {
    CheckError(other.error());
  }
  return 0;
}
