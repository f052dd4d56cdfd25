#include <doctest/doctest.h>

#include <isa-l/igzip_lib.h>
#include <zstd.h>

#include <cstring>
#include <string>
#include <vector>

#include "lib/extract/decompress.h"

#include "tests/support/why.h"

namespace shoal::extract {
namespace {

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::string Gzip(const std::string& data) {
  isal_zstream z;
  isal_deflate_init(&z);
  std::vector<uint8_t> level_buf(ISAL_DEF_LVL1_DEFAULT);
  z.level = 1;
  z.level_buf = level_buf.data();
  z.level_buf_size = static_cast<uint32_t>(level_buf.size());
  z.gzip_flag = IGZIP_GZIP;
  z.end_of_stream = 1;
  z.next_in = reinterpret_cast<uint8_t*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uint32_t>(data.size());
  std::string out(data.size() + 1024, '\0');
  z.next_out = reinterpret_cast<uint8_t*>(out.data());
  z.avail_out = static_cast<uint32_t>(out.size());
  REQUIRE(isal_deflate(&z) == COMP_OK);
  REQUIRE(z.internal_state.state == ZSTATE_END);
  out.resize(out.size() - z.avail_out);
  return out;
}

std::string Zstd(const std::string& data) {
  std::string out(ZSTD_compressBound(data.size()), '\0');
  // With the content checksum (as `zstd` writes by default), so corruption is always detected.
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, 3);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  size_t n = ZSTD_compress2(cctx, out.data(), out.size(), data.data(), data.size());
  ZSTD_freeCCtx(cctx);
  REQUIRE_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

// Some compressible but not trivial bytes.
std::string Payload(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1103515245 + 12345;
    s[i] = static_cast<char>(i % 7 == 0 ? (x >> 16) : 'a' + (i % 13));
  }
  return s;
}

Result<std::string> DecodeAll(const std::string& raw, Compression* seen = nullptr) {
  auto src = MemorySource(Bytes(raw), "test");
  auto dec = OpenDecoder(*src);
  if (!dec) return dec.error();
  if (seen) *seen = dec.value()->compression();
  std::string out;
  std::vector<std::byte> buf(4096 + 7);  // odd size: exercises partial outputs
  for (;;) {
    auto n = dec.value()->Read(buf);
    if (!n) return n.error();
    if (n.value() == 0) break;
    out.append(reinterpret_cast<const char*>(buf.data()), n.value());
  }
  CHECK(dec.value()->decoded_bytes() == out.size());
  return out;
}

}  // namespace

TEST_CASE("extract decompress: plain, gzip and zstd are detected by their magic bytes") {
  const std::string data = Payload(3 << 20, 1);
  Compression c;
  auto plain = DecodeAll(data, &c);
  REQUIRE(plain.has_value());
  CHECK(c == Compression::kNone);
  CHECK(plain.value() == data);
  auto gz = DecodeAll(Gzip(data), &c);
  REQUIRE_MESSAGE(gz.has_value(), Why(gz));
  CHECK(c == Compression::kGzip);
  CHECK(gz.value() == data);
  auto zs = DecodeAll(Zstd(data), &c);
  REQUIRE_MESSAGE(zs.has_value(), Why(zs));
  CHECK(c == Compression::kZstd);
  CHECK(zs.value() == data);
}

TEST_CASE("extract decompress: multi-member gzip and multi-frame zstd decode to the concatenation") {
  const std::string a = Payload(100000, 2), b = Payload(1, 3), c = Payload(2 << 20, 4);
  auto gz = DecodeAll(Gzip(a) + Gzip(b) + Gzip(c));
  REQUIRE_MESSAGE(gz.has_value(), Why(gz));
  CHECK(gz.value() == a + b + c);
  auto zs = DecodeAll(Zstd(a) + Zstd(b) + Zstd(c));
  REQUIRE_MESSAGE(zs.has_value(), Why(zs));
  CHECK(zs.value() == a + b + c);
}

TEST_CASE("extract decompress: corrupt or truncated streams fail with the compression named") {
  const std::string data = Payload(1 << 20, 5);
  std::string gz = Gzip(data);
  std::string flipped = gz;
  flipped[gz.size() / 2] ^= 0x55;
  auto bad = DecodeAll(flipped);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code == ErrorCode::kInvalidArgument);
  CHECK(bad.error().message.find("gzip stream of test: ") == 0);
  CHECK(bad.error().message.find("compressed offset") != std::string::npos);

  std::string crc = gz;
  crc[gz.size() - 6] ^= 1;  // inside the CRC-32 of the trailer
  auto bad_crc = DecodeAll(crc);
  REQUIRE_FALSE(bad_crc.has_value());
  CHECK(bad_crc.error().message.find("CRC-32 or length mismatch") != std::string::npos);

  auto cut = DecodeAll(gz.substr(0, gz.size() / 2));
  REQUIRE_FALSE(cut.has_value());
  CHECK(cut.error().message.find("truncated") != std::string::npos);

  std::string zs = Zstd(data);
  std::string zflip = zs;
  zflip[zs.size() / 2] ^= 0x55;
  zflip[zs.size() / 2 + 1] ^= 0x55;
  auto zbad = DecodeAll(zflip);
  REQUIRE_FALSE(zbad.has_value());
  CHECK(zbad.error().message.find("zstd stream of test: ") == 0);
  auto zcut = DecodeAll(zs.substr(0, zs.size() - 10));
  REQUIRE_FALSE(zcut.has_value());
  CHECK(zcut.error().message.find("truncated") != std::string::npos);
}

TEST_CASE("extract decompress: empty, xz and bzip2 streams are refused at open") {
  auto empty = DecodeAll("");
  REQUIRE_FALSE(empty.has_value());
  CHECK(empty.error().message == "test: empty layer stream");
  auto xz = DecodeAll(std::string("\xfd" "7zXZ\0rest", 10));
  REQUIRE_FALSE(xz.has_value());
  CHECK(xz.error().code == ErrorCode::kUnsupported);
  auto bz = DecodeAll("BZh91AY&SY");
  REQUIRE_FALSE(bz.has_value());
  CHECK(bz.error().code == ErrorCode::kUnsupported);
}

}  // namespace shoal::extract
