// Swarm's own checks, without peers or trackers: start/stop, argument errors, adding and
// removing chunks. (Transfers are in tests/integration/swarm_session_test.cc.)

#include <doctest/doctest.h>

#include <utility>

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/error.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <libtorrent/error_code.hpp>

#include "lib/swarm/chunk_torrent.h"
#include "lib/swarm/file_range.h"
#include "lib/swarm/session.h"

#include "tests/support/why.h"

namespace shoal::swarm {
namespace {

SwarmOptions Loopback() {
  SwarmOptions o;
  o.listen_interface = "127.0.0.1:0";
  o.allow_multiple_connections_per_ip = true;
  return o;
}

// A one-piece chunk torrent of `size` zero bytes, and a temp file holding them at offset 100.
struct Fixture {
  ChunkTorrent torrent;
  std::shared_ptr<BlobFile> file;

  explicit Fixture(uint32_t size = 20000) {
    std::string data(size, '\0');
    PieceHasher h(size, 16384);
    REQUIRE(h.Update(data.data(), data.size()).has_value());
    auto t = BuildChunkTorrent("zeros.0", size, 16384, h.Finish().value());
    REQUIRE(t.has_value());
    torrent = t.value();
    char path[] = "/tmp/shoal-swarm-unit-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    unlink(path);
    REQUIRE(ftruncate(fd, 100 + size) == 0);
    file = BlobFile::Adopt(fd).value();
  }

  ChunkSpec Spec(bool seed) const {
    ChunkSpec s;
    s.torrent = torrent;
    s.range = FileRange{file, 100, torrent.length};
    s.seed = seed;
    return s;
  }
};

}  // namespace

TEST_CASE("swarm: start, add and remove chunks, stop") {
  boost::asio::io_context ioc;
  Swarm swarm(ioc, Loopback());
  Fixture fx;
  auto early = swarm.AddChunk(fx.Spec(true));
  REQUIRE_FALSE(early.has_value());
  CHECK(early.error().code == ErrorCode::kUnavailable);
  CHECK(swarm.listen_port() == 0);

  REQUIRE(swarm.Start().has_value());
  CHECK(swarm.listen_port() != 0);
  CHECK_FALSE(swarm.Start().has_value());  // already started

  auto added = swarm.AddChunk(fx.Spec(true));
  REQUIRE_MESSAGE(added.has_value(), Why(added));
  CHECK(added.value().info_hash == fx.torrent.info_hash);
  CHECK(swarm.HasChunk(fx.torrent.info_hash));
  auto again = swarm.AddChunk(fx.Spec(true));
  REQUIRE_FALSE(again.has_value());
  CHECK(again.error().code == ErrorCode::kInvalidArgument);

  SwarmStats st = swarm.Stats();
  CHECK(st.torrents == 1);
  REQUIRE(st.chunks.size() == 1);
  CHECK(st.chunks[0].name == "zeros.0");
  CHECK(st.chunks[0].pieces_total == 2);
  CHECK(st.downloaded == 0);

  swarm.RemoveChunk(fx.torrent.info_hash);
  swarm.RemoveChunk(fx.torrent.info_hash);  // no-op
  CHECK_FALSE(swarm.HasChunk(fx.torrent.info_hash));
  CHECK(swarm.Stats().torrents == 0);
  // Right away again, as a download this time.
  REQUIRE(swarm.AddChunk(fx.Spec(false)).has_value());
  CHECK(swarm.Stats().torrents == 1);

  swarm.Stop();
  swarm.Stop();  // idempotent
  CHECK(swarm.listen_port() == 0);
  CHECK(swarm.Stats().torrents == 0);
  CHECK_FALSE(swarm.AddChunk(fx.Spec(true)).has_value());
}

TEST_CASE("swarm: bad chunk specs and listen addresses are errors") {
  boost::asio::io_context ioc;
  Swarm swarm(ioc, Loopback());
  REQUIRE(swarm.Start().has_value());
  Fixture fx;

  ChunkSpec no_file = fx.Spec(false);
  no_file.range.file = nullptr;
  CHECK(swarm.AddChunk(std::move(no_file)).error().code == ErrorCode::kInvalidArgument);

  ChunkSpec short_range = fx.Spec(false);
  short_range.range.length -= 1;
  CHECK(swarm.AddChunk(std::move(short_range)).error().code == ErrorCode::kInvalidArgument);

  ChunkSpec bad_have = fx.Spec(false);
  bad_have.have_pieces = {true};  // the chunk has two pieces
  CHECK(swarm.AddChunk(std::move(bad_have)).error().code == ErrorCode::kInvalidArgument);

  ChunkSpec junk = fx.Spec(false);
  junk.torrent.metainfo = "not bencode";
  CHECK(swarm.AddChunk(std::move(junk)).error().code == ErrorCode::kProtocol);
  CHECK(swarm.Stats().torrents == 0);

  // An address that is not on this host cannot be bound.
  SwarmOptions elsewhere = Loopback();
  elsewhere.listen_interface = "192.0.2.1:0";
  Swarm other(ioc, elsewhere);
  auto started = other.Start();
  REQUIRE_FALSE(started.has_value());
  CHECK(started.error().code == ErrorCode::kUnavailable);
  MESSAGE(started.error().message);
  CHECK(other.listen_port() == 0);
}

TEST_CASE("swarm: libtorrent setting overrides are checked at start") {
  boost::asio::io_context ioc;
  struct Case {
    std::string entry;
    const char* says;  // empty: accepted
  };
  for (const Case& c :
       {Case{"strict_end_game_mode=false", ""}, Case{"max_out_request_queue=64", ""},
        Case{"user_agent=test", ""}, Case{"no_such_setting=1", "settings_pack name"},
        Case{"max_out_request_queue", "settings_pack name"},
        Case{"max_out_request_queue=lots", "integer"},
        Case{"max_out_request_queue=99999999999", "integer"},
        Case{"strict_end_game_mode=maybe", "true or false"}}) {
    CAPTURE(c.entry);
    SwarmOptions o = Loopback();
    o.libtorrent_settings = {c.entry};
    Swarm swarm(ioc, o);
    auto started = swarm.Start();
    if (std::string(c.says).empty()) {
      CHECK(started.has_value());
      CHECK(swarm.listen_port() != 0);
    } else {
      REQUIRE_FALSE(started.has_value());
      CHECK(started.error().code == ErrorCode::kInvalidArgument);
      CHECK(started.error().message.find(c.entry) != std::string::npos);
      CHECK(started.error().message.find(c.says) != std::string::npos);
      CHECK(swarm.listen_port() == 0);
    }
  }
}

TEST_CASE("swarm: the counter sampler runs every second and stops with the session") {
  boost::asio::io_context ioc;
  Swarm swarm(ioc, Loopback());
  REQUIRE(swarm.Start().has_value());
  // The sampling timer posts session stats every second; nothing was downloaded, so all zero.
  ioc.run_for(std::chrono::milliseconds(1500));
  SwarmStats s = swarm.Stats();
  for (uint64_t w : s.wasted) CHECK(w == 0);
  CHECK(kWasteReasons.size() == s.wasted.size());
  swarm.Stop();
}

TEST_CASE("swarm: a peer close counts as the remote's only for socket ends, not for libtorrent's "
          "own reasons") {
  namespace ae = boost::asio::error;
  CHECK(ClosedByRemote(ae::eof));
  CHECK(ClosedByRemote(ae::connection_reset));
  CHECK(ClosedByRemote(ae::broken_pipe));
  CHECK(ClosedByRemote(boost::asio::ssl::error::stream_truncated));
  // This session's own decisions: idle, redundant, over the connection limit, shutting down.
  CHECK_FALSE(ClosedByRemote(lt::errors::timed_out_inactivity));
  CHECK_FALSE(ClosedByRemote(lt::errors::timed_out_no_interest));
  CHECK_FALSE(ClosedByRemote(lt::errors::upload_upload_connection));
  CHECK_FALSE(ClosedByRemote(lt::errors::too_many_connections));
  CHECK_FALSE(ClosedByRemote(lt::errors::torrent_removed));
  // Never connected: a dead or unreachable peer says nothing about a busy swarm.
  CHECK_FALSE(ClosedByRemote(ae::connection_refused));
  CHECK_FALSE(ClosedByRemote(ae::timed_out));
  CHECK_FALSE(ClosedByRemote(boost::system::error_code{}));
}

}  // namespace shoal::swarm
