#include "lib/extract/image.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "lib/core/sha256.h"

namespace shoal::extract {
namespace {

namespace fs = std::filesystem;

constexpr size_t kShortIdLength = 26;  // as docker's overlay2 link names

std::string ShortId(const std::string& id) {
  std::string s = id.substr(0, kShortIdLength);
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

Status WriteSmallFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) return MakeError(ErrorCode::kIo, "write " + path + ": " + std::strerror(errno));
  return Ok();
}

// Extracts layer `i` into <root>/<id> through a temporary sibling directory.
Result<LayerResult> ExtractOne(const std::string& root, const LayerInput& in,
                               const std::vector<std::string>& ids, size_t i,
                               const ImageExtractOptions& options) {
  LayerResult out;
  out.id = ids[i];
  out.short_id = ShortId(out.id);
  const std::string final_dir = root + "/" + out.id;
  out.diff_dir = final_dir + "/diff";
  std::error_code ec;
  if (fs::is_directory(final_dir, ec)) {
    out.reused = true;
    return out;
  }
  std::string tmp = root + "/." + out.id + ".tmp-XXXXXX";
  if (::mkdtemp(tmp.data()) == nullptr) {
    return MakeError(ErrorCode::kIo, "mkdtemp " + tmp + ": " + std::strerror(errno));
  }
  struct Cleanup {
    std::string path;
    bool armed = true;
    ~Cleanup() {
      std::error_code ec;
      if (armed) fs::remove_all(path, ec);
    }
  } cleanup{tmp};
  ::chmod(tmp.c_str(), 0700);

  auto source = in.open();
  if (!source) return source.error();
  ExtractOptions opts = options.layer;
  if (in.verify) opts.expected_digest = in.digest;
  auto stats = ExtractLayer(*source.value(), tmp + "/diff", opts);
  if (!stats) return stats.error();
  out.stats = stats.value();

  if (auto st = WriteSmallFile(tmp + "/link", out.short_id); !st) return st.error();
  if (i > 0) {
    std::string lower;
    for (size_t j = i; j-- > 0;) {
      if (!lower.empty()) lower += ":";
      lower += "l/" + ShortId(ids[j]);
    }
    if (auto st = WriteSmallFile(tmp + "/lower", lower); !st) return st.error();
    if (::mkdir((tmp + "/work").c_str(), 0700) != 0) {
      return MakeError(ErrorCode::kIo, "mkdir " + tmp + "/work: " + std::strerror(errno));
    }
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_NOREPLACE) != 0) {
    if (errno == EEXIST || errno == ENOTEMPTY) {  // another extraction of the same chain won
      out.reused = true;
      return out;
    }
    return MakeError(ErrorCode::kIo,
                     "rename " + tmp + " to " + final_dir + ": " + std::strerror(errno));
  }
  cleanup.armed = false;
  const std::string link = root + "/l/" + out.short_id;
  ::unlink(link.c_str());
  if (::symlink(("../" + out.id + "/diff").c_str(), link.c_str()) != 0 && errno != EEXIST) {
    return MakeError(ErrorCode::kIo, "symlink " + link + ": " + std::strerror(errno));
  }
  return out;
}

}  // namespace

std::vector<std::string> LayerChainIds(const std::vector<Digest>& digests) {
  std::vector<std::string> ids;
  for (size_t i = 0; i < digests.size(); ++i) {
    ids.push_back(i == 0 ? digests[0].hex()
                         : Sha256::Of(ids.back() + " " + digests[i].str()).hex());
  }
  return ids;
}

Result<std::vector<LayerResult>> ExtractImage(const std::string& root,
                                              std::vector<LayerInput> layers,
                                              const ImageExtractOptions& options) {
  std::error_code ec;
  fs::create_directories(root + "/l", ec);
  if (ec) return MakeError(ErrorCode::kIo, "mkdir " + root + "/l: " + ec.message());
  std::vector<Digest> digests;
  for (const auto& l : layers) digests.push_back(l.digest);
  const std::vector<std::string> ids = LayerChainIds(digests);

  // Largest first, so that the longest layer does not start last.
  std::vector<size_t> order(layers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return layers[a].size_hint > layers[b].size_hint; });

  std::vector<Result<LayerResult>> results(layers.size(),
                                           MakeError(ErrorCode::kInternal, "not extracted"));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (;;) {
      size_t k = next.fetch_add(1);
      if (k >= order.size()) return;
      size_t i = order[k];
      results[i] = ExtractOne(root, layers[i], ids, i, options);
      if (options.on_layer_done) {
        Result<LayerStats> s = results[i] ? Result<LayerStats>(results[i].value().stats)
                                          : Result<LayerStats>(results[i].error());
        options.on_layer_done(i, s);
      }
    }
  };
  unsigned threads = options.parallelism ? options.parallelism
                                         : std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<size_t>(threads, layers.size()));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();

  std::vector<LayerResult> out;
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i]) {
      Error e = results[i].error();
      e.message = "layer " + std::to_string(i) + " (" + layers[i].digest.str() + "): " + e.message;
      return e;
    }
    out.push_back(std::move(results[i].value()));
  }
  return out;
}

std::string LowerDirOption(const std::vector<LayerResult>& layers) {
  std::string out;
  for (size_t i = layers.size(); i-- > 0;) {
    if (!out.empty()) out += ":";
    out += fs::absolute(layers[i].diff_dir).string();
  }
  return out;
}

}  // namespace shoal::extract
