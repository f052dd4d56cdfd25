#include "tests/support/counting_proxy.h"

#include <sys/socket.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <thread>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace shoal::testkit {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

constexpr size_t kRelayBuffer = 256 * 1024;
// Not boost::none: Boost 1.74's parser compares `len > optional` and rejects every body then.
constexpr uint64_t kNoBodyLimit = std::numeric_limits<uint64_t>::max();

// "sha256:..." from ".../blobs/sha256:...[?query]", or "" if the target is not a blob URL.
std::string BlobDigestOf(const std::string& target) {
  std::string path = target.substr(0, target.find('?'));
  size_t pos = path.rfind("/blobs/");
  if (pos == std::string::npos) return "";
  std::string rest = path.substr(pos + 7);
  if (rest.rfind("uploads", 0) == 0) return "";
  return rest;
}

bool IsManifestPath(const std::string& target) {
  return target.substr(0, target.find('?')).find("/manifests/") != std::string::npos;
}

// True if the peer closed the (idle) connection: a non-blocking peek sees EOF or an error.
bool PeerClosed(tcp::socket& s) {
  char c;
  ssize_t n = ::recv(s.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;
  if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
  return false;
}

}  // namespace

CountingProxy::CountingProxy() = default;

CountingProxy::~CountingProxy() { Stop(); }

Result<std::unique_ptr<CountingProxy>> CountingProxy::Start(std::string upstream_host_port) {
  std::unique_ptr<CountingProxy> p(new CountingProxy());
  p->upstream_ = std::move(upstream_host_port);
  auto server = SyncHttpServer::StartRaw([raw = p.get()](tcp::socket& s) { raw->Serve(s); });
  if (!server) return server.error();
  p->server_ = std::move(server.value());
  return p;
}

std::string CountingProxy::HostPort() const { return server_->HostPort(); }
std::string CountingProxy::Url() const { return "http://" + HostPort(); }

uint64_t CountingProxy::BlobBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return blob_bytes_;
}

uint64_t CountingProxy::BlobGets(const Digest& digest) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blob_gets_.find(digest.str());
  return it == blob_gets_.end() ? 0 : it->second;
}

uint64_t CountingProxy::ManifestGets() const {
  std::lock_guard<std::mutex> lock(mu_);
  return manifest_gets_;
}

uint64_t CountingProxy::Requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

std::vector<std::string> CountingProxy::RequestLog() const {
  std::lock_guard<std::mutex> lock(mu_);
  return log_;
}

void CountingProxy::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  blob_bytes_ = 0;
  manifest_gets_ = 0;
  requests_ = 0;
  blob_gets_.clear();
  log_.clear();
}

void CountingProxy::FailNext(int n, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_next_ = n;
  fail_status_ = status;
}

void CountingProxy::StallNextBlobGets(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  stall_next_ = n;
}

void CountingProxy::SetDelayPerMiB(std::chrono::milliseconds delay) {
  std::lock_guard<std::mutex> lock(mu_);
  delay_per_mib_ = delay;
}

void CountingProxy::SetRateLimit(uint64_t bytes_per_second) {
  std::lock_guard<std::mutex> lock(mu_);
  rate_limit_ = bytes_per_second;
  link_free_ = {};
}

void CountingProxy::Pace(uint64_t n) {
  using namespace std::chrono;
  steady_clock::time_point until;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (rate_limit_ == 0 || n == 0) return;
    // An idle link banks at most the burst (tbf's bucket); beyond it time does not count.
    const auto now = steady_clock::now();
    const uint64_t burst_bytes = std::max<uint64_t>(256 * 1024, rate_limit_ / 50);
    const auto burst = nanoseconds(burst_bytes * 1'000'000'000 / rate_limit_);
    if (link_free_ < now - burst) link_free_ = now - burst;
    link_free_ += nanoseconds(static_cast<int64_t>(n * 1'000'000'000 / rate_limit_));
    until = link_free_;
  }
  std::this_thread::sleep_until(until);
}

void CountingProxy::AddResponseHeader(std::string target_part, std::string name,
                                      std::string value) {
  std::lock_guard<std::mutex> lock(mu_);
  extra_headers_.push_back({std::move(target_part), std::move(name), std::move(value)});
}

void CountingProxy::SetUpstream(std::string upstream_host_port) {
  std::lock_guard<std::mutex> lock(mu_);
  upstream_ = std::move(upstream_host_port);
}

void CountingProxy::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (int fd : upstream_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  if (server_) server_->Stop();
}

int CountingProxy::Count(const std::string& method, const std::string& target) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_;
  if ((method == "GET" || method == "HEAD") && IsManifestPath(target)) ++manifest_gets_;
  if (method == "GET") {
    std::string digest = BlobDigestOf(target);
    if (!digest.empty()) ++blob_gets_[digest];
    if (!digest.empty() && stall_next_ > 0) {
      --stall_next_;
      return kStall;
    }
  }
  if (fail_next_ > 0) {
    --fail_next_;
    return fail_status_;
  }
  return 0;
}

void CountingProxy::CountBlobBytes(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  blob_bytes_ += n;
}

void CountingProxy::Log(const std::string& method, const std::string& target, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  log_.push_back(method + " " + target + " -> " + std::to_string(status));
}

void CountingProxy::Serve(tcp::socket& client) {
  beast::error_code ec;
  beast::flat_buffer client_buf;
  beast::flat_buffer upstream_buf;
  std::optional<tcp::socket> upstream;
  std::vector<char> chunk(kRelayBuffer);

  // Closes the upstream connection (if any), unregistering it first so Stop() never shuts down
  // a reused descriptor.
  auto drop_upstream = [&] {
    if (!upstream) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      upstream_fds_.erase(upstream->native_handle());
    }
    upstream.reset();
  };
  struct DropOnExit {
    std::function<void()> f;
    ~DropOnExit() { f(); }
  } drop_on_exit{drop_upstream};

  auto connect_upstream = [&]() -> bool {
    std::string hp;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return false;
      hp = upstream_;
    }
    size_t colon = hp.rfind(':');
    upstream.emplace(client.get_executor());
    upstream_buf.clear();
    tcp::resolver resolver(client.get_executor());
    auto results = resolver.resolve(hp.substr(0, colon), hp.substr(colon + 1), ec);
    if (!ec) net::connect(*upstream, results, ec);
    if (ec) {
      upstream.reset();
      return false;
    }
    upstream->set_option(tcp::no_delay(true), ec);
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      upstream.reset();
      return false;
    }
    upstream_fds_.insert(upstream->native_handle());
    return true;
  };

  // Sends a small response of our own to the client.
  auto answer = [&](int status, bool keep_alive, const std::string& body, bool retry_after) {
    http::response<http::string_body> res(static_cast<http::status>(status), 11);
    res.set(http::field::content_type, "application/json");
    if (retry_after) res.set(http::field::retry_after, "1");
    res.keep_alive(keep_alive);
    res.body() = body;
    res.prepare_payload();
    http::write(client, res, ec);
  };

  for (;;) {
    http::request_parser<http::buffer_body> req_p;
    req_p.body_limit(kNoBodyLimit);
    http::read_header(client, client_buf, req_p, ec);
    if (ec) return;
    auto& req = req_p.get();
    const std::string method(req.method_string());
    const std::string target(req.target());
    const bool keep_alive = req.keep_alive();
    const bool has_body = !req_p.is_done();

    int inject = Count(method, target);
    if (inject == kStall) {
      Log(method, target, 0);
      for (;;) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (stopping_) return;
        }
        if (PeerClosed(client)) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    if (inject != 0) {
      // Drain the request body so the connection stays usable.
      while (!req_p.is_done()) {
        req.body().data = chunk.data();
        req.body().size = chunk.size();
        http::read(client, client_buf, req_p, ec);
        if (ec == http::error::need_buffer) ec = {};
        if (ec) return;
      }
      std::string code = inject == 429   ? "TOOMANYREQUESTS"
                         : inject == 404 ? "NOT_FOUND"
                                         : "UNAVAILABLE";
      answer(inject, keep_alive,
             R"({"errors":[{"code":")" + code + R"(","message":"injected by CountingProxy"}]})",
             inject == 429);
      Log(method, target, inject);
      if (ec || !keep_alive) return;
      continue;
    }

    // Forward the request; a bodyless request is retried once on a fresh connection if a
    // reused one turns out dead.
    std::optional<http::response_parser<http::buffer_body>> parser;
    bool forwarded = false;
    for (int attempt = 0; attempt < 2 && !forwarded; ++attempt) {
      bool reused = upstream.has_value();
      if (upstream && PeerClosed(*upstream)) {
        drop_upstream();
        reused = false;
      }
      if (!upstream && !connect_upstream()) break;
      parser.emplace();
      parser->body_limit(kNoBodyLimit);
      if (req.method() == http::verb::head) parser->skip(true);
      http::request_serializer<http::buffer_body> req_sr{req};
      http::write_header(*upstream, req_sr, ec);
      if (!ec && has_body) {
        // Relay the request body (blob uploads when pushing through the proxy).
        do {
          if (!req_p.is_done()) {
            req.body().data = chunk.data();
            req.body().size = chunk.size();
            http::read(client, client_buf, req_p, ec);
            if (ec == http::error::need_buffer) ec = {};
            if (ec) return;
            req.body().size = chunk.size() - req.body().size;
            req.body().data = chunk.data();
            req.body().more = !req_p.is_done();
          } else {
            req.body().data = nullptr;
            req.body().size = 0;
          }
          http::write(*upstream, req_sr, ec);
          if (ec == http::error::need_buffer) ec = {};
          if (ec) break;
        } while (!req_p.is_done() && !req_sr.is_done());
      } else if (!ec) {
        req.body().data = nullptr;
        req.body().size = 0;
        req.body().more = false;
        http::write(*upstream, req_sr, ec);
        if (ec == http::error::need_buffer) ec = {};
      }
      if (!ec) http::read_header(*upstream, upstream_buf, *parser, ec);
      if (!ec) {
        forwarded = true;
        break;
      }
      drop_upstream();
      if (has_body || !reused) break;
    }
    if (!forwarded) {
      answer(
          502, false,
          R"({"errors":[{"code":"UNAVAILABLE","message":"CountingProxy: upstream unreachable"}]})",
          false);
      Log(method, target, 502);
      return;
    }

    auto& res_p = *parser;
    auto& res = res_p.get();
    const int status = static_cast<int>(res.result_int());
    const bool count_bytes = method == "GET" && status / 100 == 2 && !BlobDigestOf(target).empty();
    const bool upstream_keep_alive = res.keep_alive();
    std::chrono::milliseconds delay_per_mib;
    {
      std::lock_guard<std::mutex> lock(mu_);
      delay_per_mib = delay_per_mib_;
      for (const auto& extra : extra_headers_) {
        if (target.find(extra.target_part) == std::string::npos) continue;
        std::string value = extra.value;
        if (auto at = value.find("{upstream}"); at != std::string::npos) {
          value.replace(at, std::string("{upstream}").size(), upstream_);
        }
        res.set(extra.name, value);
      }
    }
    http::response_serializer<http::buffer_body> res_sr{res};
    http::write_header(client, res_sr, ec);
    if (ec) return;
    if (req.method() != http::verb::head) {
      do {
        if (!res_p.is_done()) {
          res.body().data = chunk.data();
          res.body().size = chunk.size();
          http::read(*upstream, upstream_buf, res_p, ec);
          if (ec == http::error::need_buffer) ec = {};
          if (ec) return;  // upstream died mid-body: drop the client too, as a real proxy would
          res.body().size = chunk.size() - res.body().size;
          res.body().data = chunk.data();
          res.body().more = !res_p.is_done();
          if (count_bytes) CountBlobBytes(res.body().size);
          if (delay_per_mib.count() > 0) {
            std::this_thread::sleep_for(std::chrono::microseconds(
                delay_per_mib.count() * 1000 * static_cast<int64_t>(res.body().size) >> 20));
          }
          Pace(res.body().size);
        } else {
          res.body().data = nullptr;
          res.body().size = 0;
          res.body().more = false;
        }
        http::write(client, res_sr, ec);
        if (ec == http::error::need_buffer) ec = {};
        if (ec) return;
      } while (!res_p.is_done() && !res_sr.is_done());
    }
    Log(method, target, status);
    if (!upstream_keep_alive) drop_upstream();
    if (!keep_alive || !upstream_keep_alive) return;
  }
}

}  // namespace shoal::testkit
