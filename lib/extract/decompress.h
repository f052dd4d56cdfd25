#pragma once
// Layer decompression detected from the first bytes (not from the media type): gzip through
// ISA-L's igzip (multi-member streams included), zstd through libzstd's streaming API, and
// plain tar passed through.

#include <cstdint>
#include <memory>
#include <string_view>

#include "lib/core/error.h"
#include "lib/extract/byte_source.h"

namespace shoal::extract {

// How a layer's bytes are compressed.
enum class Compression { kNone, kGzip, kZstd };

// "tar", "gzip" or "zstd".
std::string_view CompressionName(Compression c);

// The compression announced by a stream's first bytes: gzip (1f 8b), zstd (28 b5 2f fd),
// else kNone. Fewer than 4 bytes are fine.
Compression DetectCompression(std::span<const std::byte> head);

// A ByteSource of decompressed bytes over a raw one, plus what was detected and counted.
class Decoder : public ByteSource {
 public:
  // The compression found in the stream's first bytes.
  virtual Compression compression() const = 0;
  // Raw (compressed) bytes consumed from the inner source so far.
  virtual uint64_t raw_bytes() const = 0;
  // Decoded bytes returned so far.
  virtual uint64_t decoded_bytes() const = 0;
};

// Peeks at `raw` to detect its compression and returns a decoder that reads through it. `raw`
// must outlive the decoder. Errors: kInvalidArgument for an empty stream; kUnsupported for xz
// or bzip2 (named); the raw source's errors. Reads then fail with kInvalidArgument naming the
// compression, the problem and the compressed offset (corrupt data, bad checksum, truncation).
Result<std::unique_ptr<Decoder>> OpenDecoder(ByteSource& raw);

}  // namespace shoal::extract
