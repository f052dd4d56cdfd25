#pragma once
// Streaming inputs for the extractor: a layer's bytes arrive through a ByteSource, from a whole
// file, from a file that is still being written (a blob being downloaded), or from memory.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "lib/core/error.h"

namespace shoal::extract {

// A forward-only stream of bytes. One reader at a time: not thread-safe.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to out.size() bytes into out; returns how many (0 only at the end of the stream,
  // and only when out is non-empty). May block. Errors: kIo (naming the file), or the decoder's.
  virtual Result<size_t> Read(std::span<std::byte> out) = 0;
  // What this stream is, for error messages ("file /x/y", "gzip of file /x/y").
  virtual std::string Describe() const = 0;
};

// Reads a complete regular file from the start. Errors: kIo naming the path if it cannot be opened.
Result<std::unique_ptr<ByteSource>> OpenFileSource(const std::string& path);

// Blocks until at least `want` bytes of a growing file are final (written and not going to
// change) and returns how many are final now (>= want), or an error (the download failed or was
// cancelled; it is returned by Read as is). Called from the reading thread; the callee owns the
// synchronisation with the writer.
using WaitForPrefix = std::function<Result<uint64_t>(uint64_t want)>;

// Reads a file that another party is still writing, `total_size` bytes in the end: each Read
// first waits (through `wait`) until the bytes it returns are final. The file must exist when
// this is called. Errors: kIo naming the path.
Result<std::unique_ptr<ByteSource>> OpenGrowingFileSource(const std::string& path,
                                                          uint64_t total_size,
                                                          WaitForPrefix wait);

// Reads bytes held in memory; the caller keeps `data` alive while the source is used.
std::unique_ptr<ByteSource> MemorySource(std::span<const std::byte> data,
                                         std::string name = "memory");

}  // namespace shoal::extract
