#include "lib/extract/decompress.h"

#include <isa-l/igzip_lib.h>
#include <zstd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

namespace shoal::extract {
namespace {

constexpr size_t kInBuffer = 256 * 1024;

// Feeds the decoders: the peeked head first, then the raw source, counting raw bytes.
class Input {
 public:
  Input(ByteSource& raw, std::vector<std::byte> head) : raw_(raw), buf_(kInBuffer) {
    std::copy(head.begin(), head.end(), buf_.begin());
    end_ = head.size();
    raw_bytes_ = head.size();
  }
  // Bytes not yet consumed.
  std::span<std::byte> Pending() { return {buf_.data() + pos_, end_ - pos_}; }
  void Consume(size_t n) { pos_ += n; }
  // Refills when empty; returns false at the end of the raw stream.
  Result<bool> Fill() {
    if (pos_ < end_) return true;
    if (eof_) return false;
    auto n = raw_.Read(buf_);
    if (!n) return n.error();
    pos_ = 0;
    end_ = n.value();
    raw_bytes_ += end_;
    if (end_ == 0) eof_ = true;
    return end_ > 0;
  }
  // Offset in the raw stream of the next unconsumed byte.
  uint64_t Offset() const { return raw_bytes_ - (end_ - pos_); }
  uint64_t raw_bytes() const { return raw_bytes_; }
  std::string Describe() const { return raw_.Describe(); }

 private:
  ByteSource& raw_;
  std::vector<std::byte> buf_;
  size_t pos_ = 0, end_ = 0;
  bool eof_ = false;
  uint64_t raw_bytes_ = 0;
};

class DecoderBase : public Decoder {
 public:
  DecoderBase(ByteSource& raw, std::vector<std::byte> head) : in_(raw, std::move(head)) {}
  uint64_t raw_bytes() const override { return in_.raw_bytes(); }
  uint64_t decoded_bytes() const override { return decoded_; }
  std::string Describe() const override {
    return std::string(CompressionName(compression())) + " of " + in_.Describe();
  }

 protected:
  Error Corrupt(const std::string& what) const {
    return MakeError(ErrorCode::kInvalidArgument,
                     std::string(CompressionName(compression())) + " stream of " +
                         in_.Describe() + ": " + what + " at compressed offset " +
                         std::to_string(in_.Offset()));
  }
  Input in_;
  uint64_t decoded_ = 0;
};

class PlainDecoder : public DecoderBase {
 public:
  using DecoderBase::DecoderBase;
  Compression compression() const override { return Compression::kNone; }
  std::string Describe() const override { return in_.Describe(); }
  Result<size_t> Read(std::span<std::byte> out) override {
    if (out.empty()) return size_t{0};
    auto more = in_.Fill();
    if (!more) return more.error();
    if (!more.value()) return size_t{0};
    auto p = in_.Pending();
    size_t n = std::min(p.size(), out.size());
    std::memcpy(out.data(), p.data(), n);
    in_.Consume(n);
    decoded_ += n;
    return n;
  }
};

const char* IsalErrorText(int rc) {
  switch (rc) {
    case ISAL_INVALID_BLOCK: return "invalid deflate block";
    case ISAL_INVALID_SYMBOL: return "invalid deflate symbol";
    case ISAL_INVALID_LOOKBACK: return "invalid deflate distance";
    case ISAL_INVALID_WRAPPER: return "invalid gzip header";
    case ISAL_UNSUPPORTED_METHOD: return "unsupported gzip method";
    case ISAL_INCORRECT_CHECKSUM: return "CRC-32 or length mismatch";
    default: return "inflate error";
  }
}

class GzipDecoder : public DecoderBase {
 public:
  GzipDecoder(ByteSource& raw, std::vector<std::byte> head) : DecoderBase(raw, std::move(head)) {
    Reset();
  }
  Compression compression() const override { return Compression::kGzip; }

  Result<size_t> Read(std::span<std::byte> out) override {
    if (out.empty() || done_) return size_t{0};
    for (;;) {
      if (st_.block_state == ISAL_BLOCK_FINISH) {
        // One gzip member ended. Another may follow (multi-member gzip, e.g. pigz or cat of
        // .gz files); the stream ends only at the end of the raw bytes.
        auto more = in_.Fill();
        if (!more) return more.error();
        if (!more.value()) {
          done_ = true;
          return size_t{0};
        }
        Reset();
      }
      auto more = in_.Fill();
      if (!more) return more.error();
      auto pending = in_.Pending();
      if (pending.empty()) {
        return Corrupt("truncated (ends inside a gzip member)");
      }
      st_.next_in = reinterpret_cast<uint8_t*>(pending.data());
      st_.avail_in = static_cast<uint32_t>(pending.size());
      st_.next_out = reinterpret_cast<uint8_t*>(out.data());
      st_.avail_out = static_cast<uint32_t>(std::min<size_t>(out.size(), UINT32_MAX));
      uint32_t out_before = st_.avail_out;
      int rc = isal_inflate(&st_);
      in_.Consume(pending.size() - st_.avail_in);
      if (rc < 0) return Corrupt(IsalErrorText(rc));
      size_t produced = out_before - st_.avail_out;
      if (produced > 0) {
        decoded_ += produced;
        return produced;
      }
    }
  }

 private:
  void Reset() {
    isal_inflate_init(&st_);
    st_.crc_flag = ISAL_GZIP;
  }
  inflate_state st_{};
  bool done_ = false;
};

class ZstdDecoder : public DecoderBase {
 public:
  ZstdDecoder(ByteSource& raw, std::vector<std::byte> head)
      : DecoderBase(raw, std::move(head)), dctx_(ZSTD_createDCtx()) {}
  ~ZstdDecoder() override { ZSTD_freeDCtx(dctx_); }
  Compression compression() const override { return Compression::kZstd; }

  Result<size_t> Read(std::span<std::byte> out) override {
    if (out.empty()) return size_t{0};
    if (!dctx_) return MakeError(ErrorCode::kInternal, "ZSTD_createDCtx failed");
    for (;;) {
      auto more = in_.Fill();
      if (!more) return more.error();
      auto pending = in_.Pending();
      if (pending.empty()) {
        if (frame_open_) return Corrupt("truncated (ends inside a zstd frame)");
        return size_t{0};
      }
      ZSTD_inBuffer in{pending.data(), pending.size(), 0};
      ZSTD_outBuffer o{out.data(), out.size(), 0};
      size_t rc = ZSTD_decompressStream(dctx_, &o, &in);
      in_.Consume(in.pos);
      if (ZSTD_isError(rc)) return Corrupt(ZSTD_getErrorName(rc));
      // rc == 0: a frame ended and its output is flushed; the next bytes start a new frame.
      frame_open_ = rc != 0;
      if (o.pos > 0) {
        decoded_ += o.pos;
        return o.pos;
      }
    }
  }

 private:
  ZSTD_DCtx* dctx_;
  bool frame_open_ = false;
};

}  // namespace

std::string_view CompressionName(Compression c) {
  switch (c) {
    case Compression::kNone: return "tar";
    case Compression::kGzip: return "gzip";
    case Compression::kZstd: return "zstd";
  }
  return "?";
}

Compression DetectCompression(std::span<const std::byte> head) {
  auto at = [&](size_t i) { return i < head.size() ? static_cast<uint8_t>(head[i]) : -1; };
  if (at(0) == 0x1f && at(1) == 0x8b) return Compression::kGzip;
  if (at(0) == 0x28 && at(1) == 0xb5 && at(2) == 0x2f && at(3) == 0xfd) return Compression::kZstd;
  return Compression::kNone;
}

Result<std::unique_ptr<Decoder>> OpenDecoder(ByteSource& raw) {
  std::vector<std::byte> head(6);
  size_t got = 0;
  while (got < head.size()) {
    auto n = raw.Read(std::span(head).subspan(got));
    if (!n) return n.error();
    if (n.value() == 0) break;
    got += n.value();
  }
  head.resize(got);
  if (got == 0) {
    return MakeError(ErrorCode::kInvalidArgument, raw.Describe() + ": empty layer stream");
  }
  auto b = [&](size_t i) { return i < got ? static_cast<uint8_t>(head[i]) : -1; };
  if (b(0) == 0xfd && b(1) == '7' && b(2) == 'z' && b(3) == 'X' && b(4) == 'Z') {
    return MakeError(ErrorCode::kUnsupported, raw.Describe() + ": xz-compressed layers are not supported");
  }
  if (b(0) == 'B' && b(1) == 'Z' && b(2) == 'h') {
    return MakeError(ErrorCode::kUnsupported,
                     raw.Describe() + ": bzip2-compressed layers are not supported");
  }
  switch (DetectCompression(head)) {
    case Compression::kGzip:
      return std::unique_ptr<Decoder>(new GzipDecoder(raw, std::move(head)));
    case Compression::kZstd:
      return std::unique_ptr<Decoder>(new ZstdDecoder(raw, std::move(head)));
    case Compression::kNone:
      break;
  }
  return std::unique_ptr<Decoder>(new PlainDecoder(raw, std::move(head)));
}

}  // namespace shoal::extract
