#include "tests/support/blob_get.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>

namespace shoal::testkit {
namespace {

namespace http = boost::beast::http;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Waits until fd is ready for `events`, up to the stall timeout, waking every 200 ms to notice
// a stop. Returns "" or why it gave up.
std::string WaitFd(int fd, short events, Clock::time_point deadline, const BlobGetOptions& o) {
  auto stall_end = Clock::now() + o.stall;
  for (;;) {
    if (o.stop != nullptr && o.stop->load()) return "interrupted";
    auto now = Clock::now();
    if (now > deadline)
      return "request took longer than " + std::to_string(o.timeout.count()) + " s";
    if (now > stall_end) return "no progress for " + std::to_string(o.stall.count()) + " s";
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, 200);
    if (r > 0) return "";
    if (r < 0 && errno != EINTR) return std::string("poll: ") + std::strerror(errno);
  }
}

}  // namespace

BlobGet GetBlob(uint16_t port, const std::string& target, uint64_t expect_size,
                const BlobGetOptions& o) {
  BlobGet f;
  auto deadline = Clock::now() + o.timeout;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    f.error = std::string("socket: ") + std::strerror(errno);
    return f;
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  auto start = Clock::now();
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno != EINPROGRESS) {
      f.error = "connect 127.0.0.1:" + std::to_string(port) + ": " + std::strerror(errno);
      return f;
    }
    if (auto e = WaitFd(fd, POLLOUT, deadline, o); !e.empty()) {
      f.error = "connect: " + e;
      return f;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      f.error = "connect 127.0.0.1:" + std::to_string(port) + ": " + std::strerror(err);
      return f;
    }
  }
  std::string request = "GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                        "\r\nUser-Agent: " + o.user_agent + "\r\nConnection: close\r\n\r\n";
  for (size_t sent = 0; sent < request.size();) {
    ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (auto e = WaitFd(fd, POLLOUT, deadline, o); !e.empty()) {
        f.error = "send: " + e;
        return f;
      }
    } else {
      f.error = std::string("send: ") + std::strerror(errno);
      return f;
    }
  }

  std::vector<char> buf(1 << 20);
  std::string head;  // bytes until the header is complete
  http::response_parser<http::empty_body> parser;
  parser.eager(false);
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  uint64_t length = 0;
  bool have_header = false;
  Clock::time_point penultimate = start;
  for (;;) {
    ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (auto e = WaitFd(fd, POLLIN, deadline, o); !e.empty()) {
        f.error = "after " + std::to_string(f.bytes) + " body bytes: " + e;
        return f;
      }
      continue;
    }
    if (n < 0) {
      f.error = "recv after " + std::to_string(f.bytes) + " body bytes: " + std::strerror(errno);
      return f;
    }
    if (n == 0) {
      f.error = have_header ? "connection closed after " + std::to_string(f.bytes) + " of " +
                                  std::to_string(length) + " body bytes"
                            : "connection closed before a response header";
      return f;
    }
    uint64_t body_now = static_cast<uint64_t>(n);
    if (!have_header) {
      head.append(buf.data(), static_cast<size_t>(n));
      boost::beast::error_code ec;
      size_t used = parser.put(boost::asio::buffer(head), ec);
      if (ec == http::error::need_more) continue;
      if (ec || !parser.is_header_done()) {
        f.error = "bad response header: " + (ec ? ec.message() : std::string("incomplete"));
        return f;
      }
      have_header = true;
      int status = parser.get().result_int();
      if (status != 200) {
        f.error = "HTTP status " + std::to_string(status);
        return f;
      }
      if (!parser.content_length()) {
        f.error = "response has no Content-Length";
        return f;
      }
      length = *parser.content_length();
      if (expect_size != 0 && length != expect_size) {
        f.error = "Content-Length " + std::to_string(length) + ", expected " +
                  std::to_string(expect_size);
        return f;
      }
      body_now = head.size() - used;
    }
    if (body_now == 0) continue;
    auto now = Clock::now();
    if (f.bytes == 0) f.ttfb_s = Seconds(now - start);
    if (f.bytes + body_now > length) {
      f.error = "more body bytes than Content-Length " + std::to_string(length);
      return f;
    }
    if (f.bytes < length - 1 && f.bytes + body_now >= length - 1) penultimate = now;
    f.bytes += body_now;
    if (f.bytes == length) {
      f.seconds = Seconds(now - start);
      f.last_byte_s = Seconds(now - penultimate);
      return f;
    }
  }
}


}  // namespace shoal::testkit
