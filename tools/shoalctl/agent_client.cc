#include "tools/shoalctl/agent_client.h"

#include "lib/core/content_hash.h"
#include "lib/core/sha256.h"
#include "lib/oci/media_types.h"

namespace shoal::ctl {
namespace asio = boost::asio;
using asio::awaitable;

namespace {
constexpr size_t kMaxManifest = 4 << 20;

// The shim learns the registry from ?ns= (as from containerd), so names need no prefix.
std::string ShimName(const oci::ImageRef& image) { return image.repository; }
std::string Query(const oci::ImageRef& image) { return "?ns=" + image.registry; }

}  // namespace

Error HttpFailure(unsigned status, const std::string& what, const std::string& body) {
  ErrorCode code = status == 404   ? ErrorCode::kNotFound
                   : status == 401 ? ErrorCode::kUnauthorized
                   : status == 403 ? ErrorCode::kDenied
                   : status == 429 ? ErrorCode::kTooManyRequests
                   : status >= 500 ? ErrorCode::kUnavailable
                                   : ErrorCode::kInvalidArgument;
  return MakeError(code, what + ": HTTP " + std::to_string(status) + " " + body.substr(0, 300));
}

AgentClient::AgentClient(asio::io_context& ioc, http::Url agent)
    : agent_(std::move(agent)), client_(ioc.get_executor(), http::ClientConfig{}) {}

awaitable<Result<std::unique_ptr<http::Response>>> AgentClient::Get(const std::string& target,
                                                                     const std::string& accept) {
  http::Request req;
  req.url = agent_;
  req.url.target = target;
  if (!accept.empty()) req.headers.set(boost::beast::http::field::accept, accept);
  co_return co_await client_.Open(req);
}

awaitable<Result<std::pair<std::string, std::string>>> AgentClient::GetManifest(
    const oci::ImageRef& image, const std::string& reference) {
  const std::string target =
      "/v2/" + ShimName(image) + "/manifests/" + reference + Query(image);
  const std::string accept = oci::UpstreamManifestAccept();
  auto res = co_await Get(target, accept);
  if (!res) co_return res.error();
  auto body = co_await res.value()->ReadAll(kMaxManifest);
  if (!body) co_return body.error();
  if (res.value()->status() != 200) {
    co_return HttpFailure(res.value()->status(), "manifest " + image.str(), body.value());
  }
  std::string media_type(res.value()->header(boost::beast::http::field::content_type));
  co_return std::make_pair(std::move(body.value()), media_type);
}

awaitable<Result<uint64_t>> AgentClient::StreamBlob(const oci::ImageRef& image,
                                                    const oci::Descriptor& blob,
                                                    const BlobSink& sink, bool verify_digest) {
  const std::string target = "/v2/" + ShimName(image) + "/blobs/" + blob.digest.str() + Query(image);
  auto res = co_await Get(target, "");
  if (!res) co_return res.error();
  if (res.value()->status() != 200) {
    auto body = co_await res.value()->ReadAll(64 << 10);
    co_return HttpFailure(res.value()->status(), "blob " + blob.digest.str(),
                          body ? body.value() : "");
  }
  ContentHash sha(blob.digest.algorithm());
  uint64_t total = 0;
  for (;;) {
    auto piece = co_await res.value()->ReadSome();
    if (!piece) co_return piece.error();
    if (piece.value().empty()) break;
    if (verify_digest) sha.Update(piece.value().data(), piece.value().size());
    total += piece.value().size();
    if (Status st = sink(piece.value()); !st) co_return st.error();
  }
  if (blob.size >= 0 && total != static_cast<uint64_t>(blob.size)) {
    co_return MakeError(ErrorCode::kProtocol, "blob " + blob.digest.str() + ": got " +
                                                  std::to_string(total) + " of " +
                                                  std::to_string(blob.size) + " bytes");
  }
  if (verify_digest) {
    if (Digest got = sha.Final(); got != blob.digest) {
      co_return MakeError(ErrorCode::kDigestMismatch,
                          "blob " + blob.digest.str() + " arrived as " + got.str());
    }
  }
  co_return total;
}

awaitable<Result<ResolvedImage>> AgentClient::Resolve(const oci::ImageRef& image,
                                                      const std::string& platform) {
  auto top = co_await GetManifest(image, image.RefString());
  if (!top) co_return top.error();
  auto parsed = oci::ParseManifest(top.value().first, top.value().second);
  if (!parsed) co_return parsed.error();
  ResolvedImage resolved;
  resolved.digest = Sha256::Of(top.value().first);
  resolved.media_type = parsed.value().media_type;
  resolved.manifest = parsed.value();
  if (!resolved.manifest.is_index) co_return resolved;
  const oci::Descriptor* chosen = nullptr;
  for (const auto& d : resolved.manifest.manifests) {
    if (d.platform && d.platform->os + "/" + d.platform->architecture == platform) {
      chosen = &d;
      break;
    }
  }
  if (!chosen) {
    co_return MakeError(ErrorCode::kNotFound,
                        image.str() + " has no manifest for platform " + platform);
  }
  const std::string child_ref = chosen->digest.str();
  auto child = co_await GetManifest(image, child_ref);
  if (!child) co_return child.error();
  auto child_parsed = oci::ParseManifest(child.value().first, child.value().second);
  if (!child_parsed) co_return child_parsed.error();
  resolved.manifest = child_parsed.value();
  co_return resolved;
}

awaitable<Result<PullReport>> AgentClient::Pull(const oci::ImageRef& image,
                                                 const std::string& platform,
                                                 const ProgressFn& progress) {
  PullReport report;
  auto resolved = co_await Resolve(image, platform);
  if (!resolved) co_return resolved.error();
  report.manifest_digest = resolved.value().digest;
  report.media_type = resolved.value().media_type;
  const oci::Manifest& manifest = resolved.value().manifest;
  std::vector<oci::Descriptor> blobs;
  if (manifest.config) blobs.push_back(*manifest.config);
  blobs.insert(blobs.end(), manifest.layers.begin(), manifest.layers.end());
  for (const auto& blob : blobs) {
    uint64_t got = 0;
    const uint64_t size = static_cast<uint64_t>(blob.size);
    const BlobSink sink = [&](std::string_view piece) -> Status {
      got += piece.size();
      if (progress) progress(blob.digest, got, size);
      return Ok();
    };
    auto n = co_await StreamBlob(image, blob, sink);
    if (!n) co_return n.error();
    report.bytes += n.value();
    ++report.blobs;
  }
  co_return report;
}

awaitable<Result<std::string>> AgentClient::Metrics() {
  auto res = co_await Get("/metrics", "");
  if (!res) co_return res.error();
  co_return co_await res.value()->ReadAll(16 << 20);
}

}  // namespace shoal::ctl
