// Fuzzes what the tracker does with the first read of a new connection (tracker/router.h,
// Router::AnswerFirstRead): the bytes are parsed by Beast, and a request that arrived whole,
// alone, closing its connection and needing no waiting is answered at once from the accept
// loop; anything else goes to a session. In the input, "@KEY@" stands for a valid announce key,
// "@AGENT@" for a valid agent token and "@OP@" for a valid operator token, so that seeds can
// reach the routes behind the access check.
//
// Properties: nothing crashes. An answer is one complete HTTP response (as Beast parses it)
// that closes the connection, with a status the server gives (200, 401, 403, 404, 405), never a
// 5xx; a 401 carries a WWW-Authenticate challenge. A request that keeps the connection open,
// comes with more bytes than one request or lacks some, or is for the blob, manifest or
// prefetch API once admitted, is never answered here. The same bytes on a fresh router get the
// same status.

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <prometheus/registry.h>
#include <spdlog/spdlog.h>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "lib/auth/tokens.h"
#include "tests/fuzz/fuzz_check.h"
#include "tracker/access.h"
#include "tracker/blobs/blob_api.h"
#include "tracker/manifests/manifest_api.h"
#include "tracker/prefetch/prefetch_api.h"
#include "tracker/router.h"
#include "tracker/swarms/service.h"

using namespace shoal;
using namespace shoal::tracker;
namespace http = boost::beast::http;

namespace {

constexpr std::string_view kAgentToken = "fuzz-agent-token-0123456789";
constexpr std::string_view kOperatorToken = "fuzz-operator-token-0123456789";
std::string g_dir;  // the token files

// A router over real services with small limits, as tracker/run.cc builds it.
struct World {
  prometheus::Registry registry;
  TrackerService service;
  BlobApi blobs;
  ManifestApi manifests;
  PrefetchApi prefetch;
  std::optional<Access> access;
  std::unique_ptr<Router> router;

  static ServiceOptions Options() {
    ServiceOptions o;
    o.table.limits.max_peers = 64;
    o.table.limits.max_swarms = 16;
    return o;
  }

  World()
      : service(Options(), registry, 7),
        blobs(BlobApiOptions{}, registry, "0123456789abcdef", 1),
        manifests(ManifestApiOptions{}, registry, "0123456789abcdef", 3),
        prefetch(PrefetchApiOptions{}, registry, "0123456789abcdef", 2) {
    auto a = Access::Create({g_dir + "/agent", g_dir + "/operator", false}, registry);
    FUZZ_CHECK(a.has_value());
    access.emplace(std::move(a.value()));
    router = std::make_unique<Router>(service, blobs, manifests, prefetch, *access);
    router->SetMetricsHandler([] { return std::string("# metrics\n"); });
    router->SetClusterViewHandler([] { return std::string("{}"); });
  }
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  g_dir = fuzz::MakeTempDir("shoal-fuzz-first-read");
  std::ofstream(g_dir + "/agent") << kAgentToken << "\n";
  std::ofstream(g_dir + "/operator") << kOperatorToken << "\n";
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World* first = new World();  // tables grow across inputs, as in a running tracker
  std::string input(reinterpret_cast<const char*>(data), size);
  fuzz::ReplaceAll(input, "@KEY@", auth::AnnounceKey(kAgentToken));
  fuzz::ReplaceAll(input, "@OP@", kOperatorToken);
  fuzz::ReplaceAll(input, "@AGENT@", kAgentToken);
  const auto remote = boost::asio::ip::make_address("198.18.0.7");

  std::optional<std::string> out = first->router->AnswerFirstRead(input, remote);
  if (!out) return 0;

  // The request was one whole request that closes the connection.
  std::optional<HttpRequest> parsed = ParseWholeRequest(input);
  FUZZ_CHECK(parsed.has_value());
  const HttpRequest& req = *parsed;
  FUZZ_CHECK(!req.keep_alive());
  std::string_view path = req.target().substr(0, req.target().find('?'));
  const bool api = BlobApi::Owns(path) || ManifestApi::Owns(path) || PrefetchApi::Owns(path);

  // The answer: one complete response, closing.
  http::response_parser<http::string_body> res_parser;
  res_parser.eager(true);
  res_parser.body_limit(64u << 20);
  res_parser.skip(req.method() == http::verb::head);
  boost::beast::error_code ec;
  size_t used = 0;
  while (!ec && !res_parser.is_done() && used < out->size()) {
    size_t n = res_parser.put(boost::asio::buffer(out->data() + used, out->size() - used), ec);
    if (n == 0) break;
    used += n;
  }
  if (!ec && !res_parser.is_done()) res_parser.put_eof(ec);  // a body delimited by the close
  FUZZ_CHECK(!ec && res_parser.is_done() && used == out->size());
  const auto& res = res_parser.get();
  const unsigned status = res.result_int();
  FUZZ_CHECK(status == 200 || status == 401 || status == 403 || status == 404 || status == 405);
  FUZZ_CHECK(!res.keep_alive());
  if (status == 401) FUZZ_CHECK(!res[http::field::www_authenticate].empty());
  if (api) FUZZ_CHECK(status == 401 || status == 403);  // admitted API calls go to a session
  if (req.method() == http::verb::head) FUZZ_CHECK(res.body().empty());

  World fresh;
  std::optional<std::string> again = fresh.router->AnswerFirstRead(input, remote);
  FUZZ_CHECK(again.has_value());
  FUZZ_CHECK(again->substr(0, again->find("\r\n")) == out->substr(0, out->find("\r\n")));
  return 0;
}
