// The upstream registry client against a real Debian docker-registry (htpasswd and token auth),
// the test kit's fault-injecting proxy, and small hand-written servers for redirects, bodies cut
// short and stalls.

#include <doctest/doctest.h>

#include <utility>

#include <atomic>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "lib/core/sha256.h"
#include "lib/http/range.h"
#include "lib/upstream/registry_client.h"
#include "tests/support/counting_proxy.h"
#include "tests/support/image.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/sync_server.h"
#include "tests/support/token_server.h"
#include "tests/support/why.h"

namespace shoal::upstream {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using std::chrono::milliseconds;
using testkit::SyncHttpServer;

constexpr const char* kAccept =
    "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, "
    "application/vnd.docker.distribution.manifest.v2+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json";

template <class T>
net::awaitable<void> StoreResult(net::awaitable<T> a, std::optional<T>* out) {
  out->emplace(co_await std::move(a));
}

// Runs one client call to completion on `ioc` (the context the client was built on).
template <class T>
T Run(net::io_context& ioc, net::awaitable<T> a) {
  std::optional<T> out;
  net::co_spawn(ioc, StoreResult(std::move(a), &out), net::detached);
  ioc.restart();
  ioc.run();
  REQUIRE(out.has_value());
  return std::move(*out);
}

RegistryEndpoint Endpoint(const std::string& host_port) {
  return RegistryEndpoint{host_port, http::Url::Parse("http://" + host_port).value()};
}

ClientOptions FastRetries() {
  ClientOptions o;
  o.initial_backoff = milliseconds(10);
  o.max_backoff = milliseconds(2000);
  o.idle_timeout = std::chrono::seconds(5);
  o.connect_timeout = std::chrono::seconds(5);
  return o;
}

// A sink collecting bytes into a string.
BodySink Collect(std::string* out) {
  return [out](const char* data, size_t size) -> Status {
    out->append(data, size);
    return Ok();
  };
}

std::string BlobFile(const std::string& layout, const Digest& d) {
  return testkit::ReadFile(layout + "/blobs/sha256/" + d.hex());
}

// A pushed single-layer image (one ~2.5 MiB gzip layer) in a registry.
struct PushedImage {
  std::unique_ptr<testkit::TempDir> dir;
  testkit::BuiltImage image;
  Digest layer = testkit::NullDigest();
  std::string layer_bytes;
};

PushedImage Push(const testkit::Registry& reg, const std::string& name) {
  PushedImage p;
  p.dir = std::make_unique<testkit::TempDir>("shoal-upstream");
  testkit::ImageSpec spec;
  spec.layers = {testkit::LayerSpec{.compression = testkit::Compression::kGzip,
                                    .small_files = 5,
                                    .big_files = {5 << 20},
                                    .seed = 42}};
  auto built = testkit::BuildImage(spec, p.dir->Sub("layout"), "1");
  REQUIRE_MESSAGE(built.has_value(), Why(built));
  p.image = built.value();
  auto pushed = testkit::PushImage(reg, p.dir->Sub("layout"), "1", name);
  REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
  p.layer = p.image.layer_digests.at(0);
  p.layer_bytes = BlobFile(p.dir->Sub("layout"), p.layer);
  REQUIRE(p.layer_bytes.size() == p.image.layer_sizes.at(0));
  return p;
}

// Parses "bytes=a-b" of a test server's request; the whole blob when absent.
http::ByteRange RequestedRange(const SyncHttpServer::Request& req, uint64_t size) {
  auto it = req.find(bhttp::field::range);
  if (it == req.end()) return http::ByteRange{0, size - 1};
  auto r = http::ParseRange(it->value(), size);
  // No REQUIRE here: this runs on server threads. A bad range shows up as wrong bytes.
  return r.has_value() ? r.value() : http::ByteRange{0, size - 1};
}

// Reads one range request from `socket` and sends the 206 head with the range's first `first`
// bytes of `blob`. Returns the range asked for, or nullopt when no request could be read.
std::optional<http::ByteRange> AnswerRangeStart(net::ip::tcp::socket& socket,
                                                const std::string& blob, size_t first) {
  beast::flat_buffer buffer;
  SyncHttpServer::Request req;
  beast::error_code ec;
  bhttp::read(socket, buffer, req, ec);
  if (ec) return std::nullopt;
  http::ByteRange r = RequestedRange(req, blob.size());
  std::string head =
      "HTTP/1.1 206 Partial Content\r\nContent-Length: " + std::to_string(r.length()) +
      "\r\nContent-Range: " + http::ContentRange(r, blob.size()) + "\r\n\r\n" +
      blob.substr(r.first, first);
  net::write(socket, net::buffer(head), ec);
  return r;
}

SyncHttpServer::Response Answer(unsigned status, std::string body = "") {
  SyncHttpServer::Response res{static_cast<bhttp::status>(status), 11};
  res.body() = std::move(body);
  return res;
}

}  // namespace

TEST_CASE("upstream client: pulls manifests and blobs from a registry with htpasswd auth") {
  testkit::RegistryOptions opts;
  opts.auth = testkit::RegistryOptions::Auth::kHtpasswd;
  auto reg = testkit::Registry::Start(opts);
  REQUIRE_MESSAGE(reg.has_value(), Why(reg));
  PushedImage img = Push(*reg.value(), "demo/app");
  RegistryEndpoint ep = Endpoint(reg.value()->HostPort());

  net::io_context ioc;
  Credentials creds;
  creds.Add(reg.value()->HostPort(), BasicAuth{opts.user, opts.password});
  RegistryClient client(ioc.get_executor(), FastRetries(), creds);

  auto m = Run(ioc, client.GetManifest(ep, "demo/app", "1", kAccept));
  REQUIRE_MESSAGE(m.has_value(), Why(m));
  CHECK(m.value().body == img.image.manifest_json);
  CHECK(m.value().digest == img.image.manifest_digest);
  CHECK(m.value().media_type == img.image.media_type);

  auto by_digest =
      Run(ioc, client.GetManifest(ep, "demo/app", img.image.manifest_digest.str(), kAccept));
  REQUIRE_MESSAGE(by_digest.has_value(), Why(by_digest));
  CHECK(by_digest.value().body == img.image.manifest_json);

  auto head = Run(ioc, client.HeadManifest(ep, "demo/app", "1", kAccept));
  REQUIRE_MESSAGE(head.has_value(), Why(head));
  CHECK(head.value().digest == img.image.manifest_digest);
  CHECK(head.value().body.empty());

  auto size = Run(ioc, client.StatBlob(ep, "demo/app", img.layer));
  REQUIRE_MESSAGE(size.has_value(), Why(size));
  CHECK(size.value() == img.layer_bytes.size());

  std::string whole;
  auto st = Run(
      ioc, client.FetchBlob(ep, "demo/app", img.layer, 0, img.layer_bytes.size(), Collect(&whole)));
  REQUIRE_MESSAGE(st.has_value(), Why(st));
  CHECK(whole.size() == img.layer_bytes.size());
  CHECK(Sha256::Of(whole) == img.layer);

  std::string part;
  const uint64_t offset = 1'000'003, length = 777'777;
  st = Run(ioc, client.FetchBlob(ep, "demo/app", img.layer, offset, length, Collect(&part)));
  REQUIRE_MESSAGE(st.has_value(), Why(st));
  CHECK(part == img.layer_bytes.substr(offset, length));

  std::string tail;
  st = Run(ioc, client.FetchBlob(ep, "demo/app", img.layer, img.layer_bytes.size() - 1, 1,
                                 Collect(&tail)));
  REQUIRE(st.has_value());
  CHECK(tail == img.layer_bytes.substr(img.layer_bytes.size() - 1));

  auto stats = client.stats();
  CHECK(stats.bytes == whole.size() + part.size() + 1);
  CHECK(stats.requests >= 6);
  CHECK(stats.retries == 0);

  {  // Many concurrent range fetches on an io_context run by two threads.
    net::io_context mt;
    RegistryClient shared(mt.get_executor(), FastRetries(), creds);
    constexpr int kParts = 24;
    const uint64_t part_size = (img.layer_bytes.size() + kParts - 1) / kParts;
    std::vector<std::string> parts(kParts);
    std::vector<std::optional<Status>> done(kParts);
    const std::string repo = "demo/app";
    for (int i = 0; i < kParts; ++i) {
      uint64_t off = i * part_size;
      uint64_t len = std::min<uint64_t>(part_size, img.layer_bytes.size() - off);
      net::co_spawn(mt,
                    StoreResult(shared.FetchBlob(ep, repo, img.layer, off, len, Collect(&parts[i])),
                                &done[i]),
                    net::detached);
    }
    std::thread second([&] { mt.run(); });
    mt.run();
    second.join();
    std::string joined;
    for (int i = 0; i < kParts; ++i) {
      REQUIRE(done[i].has_value());
      REQUIRE_MESSAGE(done[i]->has_value(), done[i]->error().ToString());
      joined += parts[i];
    }
    CHECK(joined == img.layer_bytes);
    CHECK(shared.stats().retries == 0);
  }

  {  // A missing tag is not_found and names repository and tag.
    auto missing = Run(ioc, client.GetManifest(ep, "demo/app", "nope", kAccept));
    REQUIRE_FALSE(missing.has_value());
    CHECK(missing.error().code == ErrorCode::kNotFound);
    CHECK(missing.error().message.find("demo/app:nope") != std::string::npos);
    CHECK(missing.error().message.find("MANIFEST_UNKNOWN") != std::string::npos);
    auto no_blob = Run(ioc, client.StatBlob(ep, "demo/app", Sha256::Of("absent")));
    REQUIRE_FALSE(no_blob.has_value());
    CHECK(no_blob.error().code == ErrorCode::kNotFound);
  }
  {  // A range beyond the blob is range_not_satisfiable.
    std::string none;
    auto r = Run(ioc, client.FetchBlob(ep, "demo/app", img.layer, img.layer_bytes.size() + 10, 5,
                                       Collect(&none)));
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == ErrorCode::kRangeNotSatisfiable);
  }
  {  // A sink error aborts the fetch and is returned as is.
    size_t calls = 0;
    auto r = Run(ioc, client.FetchBlob(ep, "demo/app", img.layer, 0, img.layer_bytes.size(),
                                       [&](const char*, size_t) -> Status {
                                         ++calls;
                                         return MakeError(ErrorCode::kIo, "disk full (test)");
                                       }));
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == ErrorCode::kIo);
    CHECK(r.error().message == "disk full (test)");
    CHECK(calls == 1);
  }
  {  // Wrong or missing credentials are unauthorized.
    Credentials wrong;
    wrong.Add(reg.value()->HostPort(), BasicAuth{opts.user, "wrong"});
    RegistryClient bad(ioc.get_executor(), FastRetries(), wrong);
    auto r = Run(ioc, bad.GetManifest(ep, "demo/app", "1", kAccept));
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == ErrorCode::kUnauthorized);
    CHECK(r.error().message.find("wrong") == std::string::npos);
    RegistryClient anonymous(ioc.get_executor(), FastRetries(), Credentials());
    r = Run(ioc, anonymous.GetManifest(ep, "demo/app", "1", kAccept));
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == ErrorCode::kUnauthorized);
    CHECK(anonymous.stats().retries == 0);
  }
}

TEST_CASE("upstream client: gets, caches and shares bearer tokens from a token server") {
  auto tokens = testkit::TokenServer::Start();
  REQUIRE_MESSAGE(tokens.has_value(), Why(tokens));
  auto reg = testkit::Registry::Start(tokens.value()->ForRegistry());
  REQUIRE_MESSAGE(reg.has_value(), Why(reg));
  PushedImage img = Push(*reg.value(), "team/tool");
  RegistryEndpoint ep = Endpoint(reg.value()->HostPort());
  const uint64_t before = tokens.value()->TokenRequests();

  net::io_context ioc;
  Credentials creds;
  creds.Add(reg.value()->HostPort(),
            BasicAuth{reg.value()->options().user, reg.value()->options().password});
  RegistryClient client(ioc.get_executor(), FastRetries(), creds);

  // Five concurrent pulls of the same repository need one token between them.
  // The calls take their arguments by reference and start later: keep them alive.
  const std::string repo = "team/tool", tag = "1", accept = kAccept;
  std::vector<std::optional<Result<ManifestResponse>>> results(5);
  for (auto& r : results) {
    net::co_spawn(ioc, StoreResult(client.GetManifest(ep, repo, tag, accept), &r), net::detached);
  }
  ioc.restart();
  ioc.run();
  for (auto& r : results) {
    REQUIRE(r.has_value());
    REQUIRE_MESSAGE(r->has_value(), r->error().ToString());
    CHECK(r->value().digest == img.image.manifest_digest);
  }
  CHECK(tokens.value()->TokenRequests() - before == 1);

  // The cached token serves later calls too.
  std::string blob;
  auto st = Run(
      ioc, client.FetchBlob(ep, "team/tool", img.layer, 0, img.layer_bytes.size(), Collect(&blob)));
  REQUIRE_MESSAGE(st.has_value(), Why(st));
  CHECK(Sha256::Of(blob) == img.layer);
  CHECK(tokens.value()->TokenRequests() - before == 1);

  // Wrong credentials: the token server refuses, and the call fails as unauthorized.
  Credentials wrong;
  wrong.Add(reg.value()->HostPort(), BasicAuth{reg.value()->options().user, "nope"});
  RegistryClient bad(ioc.get_executor(), FastRetries(), wrong);
  auto r = Run(ioc, bad.GetManifest(ep, "team/tool", "1", kAccept));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == ErrorCode::kUnauthorized);
}

TEST_CASE("upstream client: retries 503 and 429 through a proxy and gives up on other 4xx") {
  auto reg = testkit::Registry::Start();
  REQUIRE_MESSAGE(reg.has_value(), Why(reg));
  PushedImage img = Push(*reg.value(), "demo/retry");
  auto proxy = testkit::CountingProxy::Start(reg.value()->HostPort());
  REQUIRE_MESSAGE(proxy.has_value(), Why(proxy));
  RegistryEndpoint ep = Endpoint(proxy.value()->HostPort());

  net::io_context ioc;
  ClientOptions options = FastRetries();
  options.max_attempts = 3;
  RegistryClient client(ioc.get_executor(), options, Credentials());

  proxy.value()->FailNext(2, 503);
  std::string blob;
  auto st = Run(ioc, client.FetchBlob(ep, "demo/retry", img.layer, 0, img.layer_bytes.size(),
                                      Collect(&blob)));
  REQUIRE_MESSAGE(st.has_value(), Why(st));
  CHECK(blob == img.layer_bytes);
  CHECK(proxy.value()->BlobGets(img.layer) == 3);
  CHECK(client.stats().retries == 2);

  // 429 with Retry-After: 1 waits about a second, not the 10 ms backoff.
  proxy.value()->Reset();
  proxy.value()->FailNext(1, 429);
  auto start = std::chrono::steady_clock::now();
  auto m = Run(ioc, client.GetManifest(ep, "demo/retry", "1", kAccept));
  REQUIRE_MESSAGE(m.has_value(), Why(m));
  CHECK(std::chrono::steady_clock::now() - start >= milliseconds(900));
  CHECK(proxy.value()->ManifestGets() == 2);

  // Out of attempts: the last error comes back, with the upstream's Retry-After.
  proxy.value()->Reset();
  proxy.value()->FailNext(10, 503);
  std::string none;
  st = Run(ioc, client.FetchBlob(ep, "demo/retry", img.layer, 0, 100, Collect(&none)));
  REQUIRE_FALSE(st.has_value());
  CHECK(st.error().code == ErrorCode::kUnavailable);
  CHECK(proxy.value()->BlobGets(img.layer) == 3);
  CHECK(none.empty());

  // A 404 is final.
  proxy.value()->Reset();
  proxy.value()->FailNext(1, 404);
  st = Run(ioc, client.FetchBlob(ep, "demo/retry", img.layer, 0, 100, Collect(&none)));
  REQUIRE_FALSE(st.has_value());
  CHECK(st.error().code == ErrorCode::kNotFound);
  CHECK(proxy.value()->BlobGets(img.layer) == 1);
}

TEST_CASE("upstream client: resumes a body cut short from the first undelivered byte") {
  std::string blob(3 << 20, '\0');
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>((i * 7919) >> 8);
  const Digest digest = Sha256::Of(blob);
  std::mutex mu;
  std::vector<std::string> ranges;  // GUARDED_BY(mu)
  int requests = 0;                 // GUARDED_BY(mu)

  // Serves the blob by Range; the first answer promises the whole range but closes the
  // connection after 1 MiB.
  auto server = SyncHttpServer::StartRaw([&](net::ip::tcp::socket& socket) {
    beast::flat_buffer buffer;
    while (true) {
      SyncHttpServer::Request req;
      beast::error_code ec;
      bhttp::read(socket, buffer, req, ec);
      if (ec) return;
      http::ByteRange r = RequestedRange(req, blob.size());
      bool cut;
      {
        std::lock_guard lock(mu);
        ranges.push_back(std::string(req[bhttp::field::range]));
        cut = ++requests == 1;
      }
      std::string head =
          "HTTP/1.1 206 Partial Content\r\nContent-Length: " + std::to_string(r.length()) +
          "\r\nContent-Range: " + http::ContentRange(r, blob.size()) + "\r\n\r\n";
      net::write(socket, net::buffer(head), ec);
      size_t n = cut ? (1 << 20) : r.length();
      net::write(socket, net::buffer(blob.data() + r.first, n), ec);
      if (cut || ec) return;
    }
  });
  REQUIRE_MESSAGE(server.has_value(), Why(server));
  RegistryEndpoint ep = Endpoint(server.value()->HostPort());

  net::io_context ioc;
  RegistryClient client(ioc.get_executor(), FastRetries(), Credentials());
  std::string got;
  const uint64_t offset = 100;
  const uint64_t length = blob.size() - 200;
  auto st = Run(ioc, client.FetchBlob(ep, "demo/cut", digest, offset, length, Collect(&got)));
  REQUIRE_MESSAGE(st.has_value(), Why(st));
  CHECK(got == blob.substr(offset, length));
  std::lock_guard lock(mu);
  REQUIRE(ranges.size() == 2);
  CHECK(ranges[0] == "bytes=100-" + std::to_string(blob.size() - 101));
  CHECK(ranges[1] ==
        "bytes=" + std::to_string(100 + (1 << 20)) + "-" + std::to_string(blob.size() - 101));
  CHECK(client.stats().retries == 1);
  CHECK(client.stats().bytes == length);
}

TEST_CASE("upstream client: detects a stalled upstream with the idle timeout") {
  std::string blob(1000, '\0');
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>('0' + i % 10);
  std::atomic<int> requests{0};
  // Answers the requested range, sends its first 10 bytes, then stalls.
  auto server = SyncHttpServer::StartRaw([&](net::ip::tcp::socket& socket) {
    if (!AnswerRangeStart(socket, blob, 10)) return;
    ++requests;
    beast::error_code ec;
    // Stall: wait until the client gives up (or the server stops).
    char c;
    socket.read_some(net::buffer(&c, 1), ec);
  });
  REQUIRE_MESSAGE(server.has_value(), Why(server));
  RegistryEndpoint ep = Endpoint(server.value()->HostPort());

  net::io_context ioc;
  ClientOptions options = FastRetries();
  options.idle_timeout = std::chrono::seconds(1);
  options.max_attempts = 2;
  RegistryClient client(ioc.get_executor(), options, Credentials());
  std::string got;
  auto start = std::chrono::steady_clock::now();
  auto st = Run(ioc, client.FetchBlob(ep, "demo/stall", Sha256::Of("x"), 0, 1000, Collect(&got)));
  auto elapsed = std::chrono::steady_clock::now() - start;
  REQUIRE_FALSE(st.has_value());
  CHECK(st.error().code == ErrorCode::kUnavailable);
  CHECK(st.error().message.find("timed out") != std::string::npos);
  CHECK(requests.load() == 2);
  CHECK(elapsed < std::chrono::seconds(20));
  // Bytes that arrived before each stall were delivered, and the second attempt resumed after
  // the first one's.
  CHECK(got == blob.substr(0, 20));
  CHECK(client.stats().bytes == 20);
}

TEST_CASE("upstream client: hands on body bytes as they arrive, without waiting for more") {
  std::string blob(100'000, '\0');
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>('a' + i % 26);
  std::atomic<bool> first_delivered{false};
  std::atomic<bool> server_waited_out{false};
  // Sends the head and 10 body bytes, then holds the rest back until the client has handed
  // those 10 on to its sink (or 5 s passed).
  auto server = SyncHttpServer::StartRaw([&](net::ip::tcp::socket& socket) {
    auto r = AnswerRangeStart(socket, blob, 10);
    if (!r) return;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!first_delivered && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(milliseconds(5));
    if (!first_delivered) server_waited_out = true;
    beast::error_code ec;
    net::write(socket, net::buffer(blob.substr(r->first + 10, r->length() - 10)), ec);
  });
  REQUIRE_MESSAGE(server.has_value(), Why(server));
  RegistryEndpoint ep = Endpoint(server.value()->HostPort());

  net::io_context ioc;
  ClientOptions options = FastRetries();
  options.idle_timeout = std::chrono::seconds(10);
  options.max_attempts = 1;
  RegistryClient client(ioc.get_executor(), options, Credentials());
  std::string got;
  BodySink sink = [&](const char* data, size_t size) -> Status {
    got.append(data, size);
    first_delivered = true;
    return Ok();
  };
  auto st = Run(ioc, client.FetchBlob(ep, "demo/trickle", Sha256::Of("x"), 0, blob.size(), sink));
  REQUIRE_MESSAGE(st.has_value(), Why(st));
  // The first 10 bytes reached the sink while the server still held the rest back.
  CHECK_FALSE(server_waited_out.load());
  CHECK(got == blob);
}

TEST_CASE("upstream client: follows a 307 to another host without forwarding Authorization") {
  std::string blob(300'000, 'b');
  for (size_t i = 0; i < blob.size(); i += 7) blob[i] = static_cast<char>('a' + i % 26);
  const Digest digest = Sha256::Of(blob);
  std::mutex mu;
  std::vector<std::string> cdn_auth;       // GUARDED_BY(mu): Authorization values seen
  std::vector<std::string> registry_auth;  // GUARDED_BY(mu)

  auto cdn = SyncHttpServer::Start([&](const SyncHttpServer::Request& req) {
    {
      std::lock_guard lock(mu);
      auto it = req.find(bhttp::field::authorization);
      cdn_auth.push_back(it == req.end() ? "" : std::string(it->value()));
    }
    if (req.target().find("sig=s3cr3t") == std::string_view::npos) return Answer(403);
    http::ByteRange r = RequestedRange(req, blob.size());
    if (req.method() == bhttp::verb::head) {
      auto res = Answer(200);
      res.content_length(blob.size());
      return res;
    }
    auto res = Answer(206, blob.substr(r.first, r.length()));
    res.set(bhttp::field::content_range, http::ContentRange(r, blob.size()));
    return res;
  });
  REQUIRE_MESSAGE(cdn.has_value(), Why(cdn));
  const std::string cdn_url = "http://" + cdn.value()->HostPort() + "/data/blob?sig=s3cr3t";

  auto registry = SyncHttpServer::Start([&](const SyncHttpServer::Request& req) {
    std::string auth;
    if (auto it = req.find(bhttp::field::authorization); it != req.end()) auth = it->value();
    {
      std::lock_guard lock(mu);
      registry_auth.push_back(auth);
    }
    if (auth != BasicAuthHeader(BasicAuth{"u", "p"})) {
      auto res = Answer(401, R"({"errors":[{"code":"UNAUTHORIZED","message":"login"}]})");
      res.set(bhttp::field::www_authenticate, R"(Basic realm="test")");
      return res;
    }
    auto res = Answer(307);
    res.set(bhttp::field::location, cdn_url);
    return res;
  });
  REQUIRE_MESSAGE(registry.has_value(), Why(registry));
  RegistryEndpoint ep = Endpoint(registry.value()->HostPort());

  net::io_context ioc;
  Credentials creds;
  creds.Add(registry.value()->HostPort(), BasicAuth{"u", "p"});
  RegistryClient client(ioc.get_executor(), FastRetries(), creds);

  auto size = Run(ioc, client.StatBlob(ep, "demo/redirect", digest));
  REQUIRE_MESSAGE(size.has_value(), Why(size));
  CHECK(size.value() == blob.size());

  std::string got;
  auto st = Run(ioc, client.FetchBlob(ep, "demo/redirect", digest, 1000, 200'000, Collect(&got)));
  REQUIRE_MESSAGE(st.has_value(), Why(st));
  CHECK(got == blob.substr(1000, 200'000));

  std::lock_guard lock(mu);
  REQUIRE(cdn_auth.size() == 2);
  for (const auto& a : cdn_auth) CHECK(a.empty());
  // The registry saw one anonymous request, then Basic from the start of the next call.
  REQUIRE(registry_auth.size() == 3);
  CHECK(registry_auth[0].empty());
  CHECK(registry_auth[1] == BasicAuthHeader(BasicAuth{"u", "p"}));
  CHECK(registry_auth[2] == BasicAuthHeader(BasicAuth{"u", "p"}));
}

TEST_CASE("upstream client: rejects manifests whose bytes do not match their digest") {
  const std::string body =
      R"({"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"})";
  const Digest real = Sha256::Of(body);
  const Digest other = Sha256::Of("something else");
  std::atomic<int> connections{0};
  auto server = SyncHttpServer::Start([&](const SyncHttpServer::Request& req) {
    std::string target(req.target());
    auto res = Answer(200, req.method() == bhttp::verb::head ? "" : body);
    res.set(bhttp::field::content_type, "application/vnd.oci.image.manifest.v1+json; charset=x");
    if (target.ends_with("/lying"))
      res.set("Docker-Content-Digest", other.str());
    else
      res.set("Docker-Content-Digest", real.str());
    if (req.method() == bhttp::verb::head) res.content_length(body.size());
    return res;
  });
  REQUIRE_MESSAGE(server.has_value(), Why(server));
  RegistryEndpoint ep = Endpoint(server.value()->HostPort());
  net::io_context ioc;
  RegistryClient client(ioc.get_executor(), FastRetries(), Credentials());

  auto ok = Run(ioc, client.GetManifest(ep, "demo/m", "good", kAccept));
  REQUIRE_MESSAGE(ok.has_value(), Why(ok));
  CHECK(ok.value().digest == real);
  CHECK(ok.value().media_type == "application/vnd.oci.image.manifest.v1+json");

  auto lying = Run(ioc, client.GetManifest(ep, "demo/m", "lying", kAccept));
  REQUIRE_FALSE(lying.has_value());
  CHECK(lying.error().code == ErrorCode::kDigestMismatch);

  auto wrong_ref = Run(ioc, client.GetManifest(ep, "demo/m", other.str(), kAccept));
  REQUIRE_FALSE(wrong_ref.has_value());
  CHECK(wrong_ref.error().code == ErrorCode::kDigestMismatch);

  auto head = Run(ioc, client.HeadManifest(ep, "demo/m", "good", kAccept));
  REQUIRE_MESSAGE(head.has_value(), Why(head));
  CHECK(head.value().digest == real);

  auto bad_name = Run(ioc, client.GetManifest(ep, "../etc", "good", kAccept));
  REQUIRE_FALSE(bad_name.has_value());
  CHECK(bad_name.error().code == ErrorCode::kInvalidArgument);
  (void)connections;
}

namespace {

// A keep-alive HTTPS server on 127.0.0.1 serving one blob by Range, counting handshakes and
// recording the SNI names it receives.
struct TlsBlobServer {
  TlsBlobServer(const std::string& cert, const std::string& key, std::string blob_bytes)
      : ctx(net::ssl::context::tls_server), blob(std::move(blob_bytes)) {
    ctx.use_certificate_chain_file(cert);
    ctx.use_private_key_file(key, net::ssl::context::pem);
    auto started = SyncHttpServer::StartRaw([this](net::ip::tcp::socket& s) { Serve(s); });
    REQUIRE_MESSAGE(started.has_value(), Why(started));
    server = std::move(started).value();
  }

  void Serve(net::ip::tcp::socket& socket) {
    net::ssl::stream<net::ip::tcp::socket&> tls(socket, ctx);
    beast::error_code ec;
    tls.handshake(net::ssl::stream_base::server, ec);
    if (ec) return;
    {
      std::lock_guard lock(mu);
      ++connections;
      const char* name = SSL_get_servername(tls.native_handle(), TLSEXT_NAMETYPE_host_name);
      sni.push_back(name ? name : "");
    }
    beast::flat_buffer buffer;
    while (true) {
      SyncHttpServer::Request req;
      bhttp::read(tls, buffer, req, ec);
      if (ec) return;
      {
        std::lock_guard lock(mu);
        ++requests;
      }
      SyncHttpServer::Response res{bhttp::status::ok, 11};
      res.keep_alive(true);
      if (req.method() == bhttp::verb::head) {
        res.content_length(blob.size());
      } else {
        http::ByteRange r = RequestedRange(req, blob.size());
        res.result(bhttp::status::partial_content);
        res.set(bhttp::field::content_range, http::ContentRange(r, blob.size()));
        res.body() = blob.substr(r.first, r.length());
        res.prepare_payload();
      }
      bhttp::write(tls, res, ec);
      if (ec) return;
    }
  }

  net::ssl::context ctx;
  const std::string blob;
  std::unique_ptr<SyncHttpServer> server;
  std::mutex mu;
  int connections = 0;           // GUARDED_BY(mu): TLS handshakes completed
  int requests = 0;              // GUARDED_BY(mu)
  std::vector<std::string> sni;  // GUARDED_BY(mu): server names clients sent
};

// Makes a self-signed certificate (its own CA) with the given subjectAltName.
void MakeCert(const testkit::TempDir& dir, const std::string& name, const std::string& san) {
  auto made =
      testkit::RunCommand({"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                           dir.Sub(name + ".key"), "-out", dir.Sub(name + ".pem"), "-days", "2",
                           "-subj", "/CN=shoal-test", "-addext", "subjectAltName=" + san},
                          std::chrono::seconds(60));
  REQUIRE_MESSAGE(made.has_value(), Why(made));
}

RegistryEndpoint HttpsEndpoint(const std::string& host, uint16_t port) {
  std::string host_port = host + ":" + std::to_string(port);
  return RegistryEndpoint{host_port, http::Url::Parse("https://" + host_port).value()};
}

}  // namespace

TEST_CASE("upstream client: speaks TLS with verification, SNI and connection reuse") {
  testkit::TempDir dir("shoal-tls");
  MakeCert(dir, "good", "DNS:localhost,IP:127.0.0.1");
  MakeCert(dir, "wrong", "DNS:wrong.example");
  const std::string blob = "tls blob bytes";
  const Digest digest = Sha256::Of(blob);
  TlsBlobServer good(dir.Sub("good.pem"), dir.Sub("good.key"), blob);
  TlsBlobServer wrong(dir.Sub("wrong.pem"), dir.Sub("wrong.key"), blob);

  net::io_context ioc;
  ClientOptions trusting = FastRetries();
  trusting.ca_file = dir.Sub("good.pem");
  RegistryClient client(ioc.get_executor(), trusting, Credentials());
  for (const std::string host : {"localhost", "127.0.0.1"}) {
    RegistryEndpoint ep = HttpsEndpoint(host, good.server->port());
    for (int i = 0; i < 3; ++i) {
      std::string got;
      auto st = Run(ioc, client.FetchBlob(ep, "demo/tls", digest, 4, 5, Collect(&got)));
      REQUIRE_MESSAGE(st.has_value(), Why(st));
      CHECK(got == blob.substr(4, 5));
    }
    auto size = Run(ioc, client.StatBlob(ep, "demo/tls", digest));
    REQUIRE_MESSAGE(size.has_value(), Why(size));
    CHECK(size.value() == blob.size());
  }
  {
    std::lock_guard lock(good.mu);
    CHECK(good.requests == 8);
    CHECK(good.connections == 2);  // one per host name, reused for the other three requests
    REQUIRE(good.sni.size() == 2);
    CHECK(good.sni[0] == "localhost");
    CHECK(good.sni[1] == "");  // no SNI for IP literals
  }

  // Without the CA the certificate is refused, and that is not retried.
  RegistryClient untrusting(ioc.get_executor(), FastRetries(), Credentials());
  RegistryEndpoint ep = HttpsEndpoint("localhost", good.server->port());
  std::string none;
  auto st = Run(ioc, untrusting.FetchBlob(ep, "demo/tls", digest, 0, 1, Collect(&none)));
  REQUIRE_FALSE(st.has_value());
  CHECK(st.error().code == ErrorCode::kProtocol);
  CHECK(st.error().message.find("certificate verify failed") != std::string::npos);
  CHECK(untrusting.stats().retries == 0);

  // A trusted certificate for another name fails hostname verification.
  ClientOptions trusts_wrong = FastRetries();
  trusts_wrong.ca_file = dir.Sub("wrong.pem");
  RegistryClient strict(ioc.get_executor(), trusts_wrong, Credentials());
  st = Run(ioc, strict.FetchBlob(HttpsEndpoint("127.0.0.1", wrong.server->port()), "demo/tls",
                                 digest, 0, 1, Collect(&none)));
  REQUIRE_FALSE(st.has_value());
  CHECK(st.error().code == ErrorCode::kProtocol);
  CHECK(st.error().message.find("certificate verify failed") != std::string::npos);

  // A CA file that does not exist makes https calls fail clearly.
  ClientOptions broken = FastRetries();
  broken.ca_file = dir.Sub("missing.pem");
  RegistryClient no_ca(ioc.get_executor(), broken, Credentials());
  st = Run(ioc, no_ca.FetchBlob(ep, "demo/tls", digest, 0, 1, Collect(&none)));
  REQUIRE_FALSE(st.has_value());
  CHECK(st.error().code == ErrorCode::kInvalidArgument);
  CHECK(st.error().message.find("missing.pem") != std::string::npos);
  CHECK(none.empty());
}

TEST_CASE(
    "upstream client: a global-only endpoint is refused on loopback, and never reuses a mapped "
    "endpoint's connection") {
  std::atomic<int> requests{0};
  auto server = SyncHttpServer::Start([&](const SyncHttpServer::Request&) {
    ++requests;
    auto res = Answer(200);
    res.content_length(42);
    return res;
  });
  REQUIRE_MESSAGE(server.has_value(), Why(server));
  const std::string host_port = server.value()->HostPort();
  const Digest digest = Sha256::Of("x");
  net::io_context ioc;
  RegistryClient client(ioc.get_executor(), FastRetries(), Credentials());

  // The operator's entry (kAny) reaches loopback; its connection goes back to the pool.
  RegistryEndpoint mapped = Endpoint(host_port);
  auto size = Run(ioc, client.StatBlob(mapped, "demo/app", digest));
  REQUIRE_MESSAGE(size.has_value(), Why(size));
  CHECK(size.value() == 42);
  CHECK(requests.load() == 1);

  // The same host:port for a registry a client named: refused at once, not retried, and the
  // pooled connection is not used either.
  RegistryEndpoint unmapped = mapped;
  unmapped.addresses = http::AddressPolicy::kGlobalOnly;
  auto refused = Run(ioc, client.StatBlob(unmapped, "demo/app", digest));
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code == ErrorCode::kRefused);
  CHECK(refused.error().message.find("127.0.0.1 is not a global address") != std::string::npos);
  // A name is resolved once and every address checked: localhost is loopback.
  RegistryEndpoint by_name = unmapped;
  by_name.base =
      http::Url::Parse("http://localhost:" + std::to_string(server.value()->port())).value();
  auto named = Run(ioc, client.StatBlob(by_name, "demo/app", digest));
  REQUIRE_FALSE(named.has_value());
  CHECK(named.error().code == ErrorCode::kRefused);
  // A name that does not resolve cannot be checked: refused too (not kUnavailable, not retried).
  by_name.base = http::Url::Parse("http://no-such-registry.invalid").value();
  auto unresolved = Run(ioc, client.StatBlob(by_name, "demo/app", digest));
  REQUIRE_FALSE(unresolved.has_value());
  CHECK(unresolved.error().code == ErrorCode::kRefused);
  CHECK(client.stats().retries == 0);
  CHECK(requests.load() == 1);
}

}  // namespace shoal::upstream
