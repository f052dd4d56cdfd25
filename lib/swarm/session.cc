#include "lib/swarm/session.h"

#include <utility>

#include <algorithm>
#include <thread>
#include <climits>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>

#include <spdlog/spdlog.h>
#include <boost/asio/error.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <libtorrent/add_torrent_params.hpp>
#include <libtorrent/alert_types.hpp>
#include <libtorrent/ip_filter.hpp>
#include <libtorrent/session.hpp>
#include <libtorrent/session_params.hpp>
#include <libtorrent/session_stats.hpp>
#include <libtorrent/settings_pack.hpp>
#include <libtorrent/socket_type.hpp>
#include <libtorrent/torrent_flags.hpp>
#include <libtorrent/torrent_handle.hpp>
#include <libtorrent/torrent_info.hpp>
#include <libtorrent/torrent_status.hpp>

#include "lib/swarm/range_disk_io.h"

namespace shoal::swarm {
namespace {

// An announce URL for logs: its announce key (auth=...) is a credential.
std::string Redacted(std::string_view url) {
  std::string out(url);
  size_t p = out.find("auth=");
  if (p == std::string::npos) return out;
  size_t end = out.find('&', p);
  out.replace(p + 5, end == std::string::npos ? std::string::npos : end - p - 5, "<key>");
  return out;
}

Sha1 FromLt(const lt::sha1_hash& h) {
  Sha1 out{};
  std::copy(h.begin(), h.end(), out.begin());
  return out;
}

std::string Endpoint(const lt::tcp::endpoint& ep) {
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

// lt::socket_type_name is not exported by libtorrent 2.0.8.
const char* SocketTypeName(lt::socket_type_t t) {
  switch (t) {
    case lt::socket_type_t::tcp:
      return "tcp";
    case lt::socket_type_t::utp:
      return "udp";
    default:
      return "other";
  }
}

// Settings for a private LAN swarm of chunk torrents, from high_performance_seed().
lt::settings_pack MakeSettings(const SwarmOptions& o) {
  lt::settings_pack s = lt::high_performance_seed();
  s.set_str(lt::settings_pack::user_agent, "shoal/0.1 libtorrent/" LIBTORRENT_VERSION);
  // With peer TLS the one listen socket is a TLS one ("IP:port" + "s"): SSL torrents take no
  // plain peer, so a plain socket would only be one more port open to outsiders.
  s.set_str(lt::settings_pack::listen_interfaces, o.listen_interface + (o.tls ? "s" : ""));
  s.set_bool(lt::settings_pack::enable_dht, false);
  s.set_bool(lt::settings_pack::enable_lsd, false);
  s.set_bool(lt::settings_pack::enable_upnp, false);
  s.set_bool(lt::settings_pack::enable_natpmp, false);
  s.set_bool(lt::settings_pack::enable_outgoing_utp, false);
  s.set_bool(lt::settings_pack::enable_incoming_utp, false);
  s.set_bool(lt::settings_pack::enable_outgoing_tcp, true);
  s.set_bool(lt::settings_pack::enable_incoming_tcp, true);
  s.set_bool(lt::settings_pack::allow_multiple_connections_per_ip,
             o.allow_multiple_connections_per_ip);
  s.set_int(lt::settings_pack::alert_mask,
            lt::alert_category::error | lt::alert_category::status |
                lt::alert_category::piece_progress | lt::alert_category::peer |
                lt::alert_category::tracker | lt::alert_category::storage |
                lt::alert_category::connect);
  s.set_int(lt::settings_pack::alert_queue_size, o.alert_queue_size);
  // Trackers: re-announce at least this often. Each chunk lists its blob's owner replica first
  // and the others after it, one tier each (ChunkSpec::tracker_urls): only the first tier that
  // works hears its announces, so a replica carries 1/R of the cluster's announce load, not
  // all of it, and a dead owner's chunks move to the next replica.
  s.set_int(lt::settings_pack::min_announce_interval, o.min_announce_interval_s);
  s.set_bool(lt::settings_pack::announce_to_all_trackers, false);
  s.set_bool(lt::settings_pack::announce_to_all_tiers, false);
  s.set_int(lt::settings_pack::stop_tracker_timeout, 2);
  s.set_int(lt::settings_pack::tracker_completion_timeout, 10);
  s.set_int(lt::settings_pack::tracker_receive_timeout, 5);
  // Connections: fewer than a seed box, but a LAN peer can take many in parallel.
  s.set_int(lt::settings_pack::connections_limit, o.connections_limit);
  if (o.peers_per_chunk > 0)
    s.set_int(lt::settings_pack::num_want, std::max(1, o.peers_per_chunk / 2));
  s.set_int(lt::settings_pack::unchoke_slots_limit, o.unchoke_slots);
  s.set_int(lt::settings_pack::choking_algorithm, lt::settings_pack::fixed_slots_choker);
  // high_performance_seed gives up on a peer after one failure; LAN peers restart and come back.
  s.set_int(lt::settings_pack::max_failcount, 3);
  // Close mutually idle connections sooner (SwarmOptions::idle_peer_timeout_s). libtorrent does
  // so only when the torrent is within 5 of its connection limit, always true for a few peers.
  s.set_int(lt::settings_pack::inactivity_timeout, std::max(1, o.idle_peer_timeout_s));
  // Bounded memory for blocks on their way to the blob file (range_disk_io reads this).
  s.set_int(lt::settings_pack::max_queued_disk_bytes, o.max_queued_disk_bytes);
  // There is no read cache to suggest pieces from.
  s.set_int(lt::settings_pack::suggest_mode, lt::settings_pack::no_piece_suggestions);
  // Prefer pieces next to the ones being downloaded (longer sequential writes).
  s.set_bool(lt::settings_pack::piece_extent_affinity, true);
  // Requests in flight per peer connection. A peer tells the other side its own limit (the
  // extension handshake's reqq, from max_allowed_in_request_queue) and that, not our
  // max_out_request_queue, bounds what the other side asks for; so both are set. Deep queues
  // (high_performance_seed allows 2000 blocks) mean that when a chunk's last pieces arrive from
  // another peer, or a peer chokes us once we lose interest, up to the whole queue still comes
  // in and is thrown away: 25-35 MiB per node in the swarm benchmark, against 7-10 with 16.
  s.set_int(lt::settings_pack::max_out_request_queue, o.request_queue_blocks);
  s.set_int(lt::settings_pack::max_allowed_in_request_queue, o.request_queue_blocks);
  // End game (asking a second peer for blocks already requested) only once every remaining
  // piece is being downloaded; on a LAN no peer is slow enough to need it sooner.
  s.set_bool(lt::settings_pack::strict_end_game_mode, true);
  return s;
}

// Applies "name=value" overrides to s. Errors: kInvalidArgument naming the bad entry.
Status ApplyOverrides(const std::vector<std::string>& overrides, lt::settings_pack& s) {
  for (const std::string& entry : overrides) {
    auto eq = entry.find('=');
    std::string name = entry.substr(0, eq);
    int key = eq == std::string::npos ? -1 : lt::setting_by_name(name);
    if (key < 0) {
      return MakeError(ErrorCode::kInvalidArgument, "libtorrent setting '" + entry +
                                                        "': expected NAME=VALUE with a "
                                                        "settings_pack name");
    }
    std::string value = entry.substr(eq + 1);
    switch (key & lt::settings_pack::type_mask) {
      case lt::settings_pack::string_type_base:
        s.set_str(key, value);
        break;
      case lt::settings_pack::bool_type_base:
        if (value != "true" && value != "false" && value != "1" && value != "0") {
          return MakeError(ErrorCode::kInvalidArgument,
                           "libtorrent setting '" + entry + "': expected true or false");
        }
        s.set_bool(key, value == "true" || value == "1");
        break;
      default: {
        size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(value, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != value.size() || v < INT_MIN || v > INT_MAX) {
          return MakeError(ErrorCode::kInvalidArgument,
                           "libtorrent setting '" + entry + "': expected an integer");
        }
        s.set_int(key, static_cast<int>(v));
      }
    }
  }
  return Ok();
}

// Every address in the global peer class only: by default libtorrent puts 10/8, 172.16/12,
// 192.168/16 and loopback in the "local" class, which ignores unchoke slots and rate limits.
lt::ip_filter GlobalOnlyPeerClassFilter() {
  lt::ip_filter f;
  std::uint32_t global = 1u << static_cast<std::uint32_t>(lt::session::global_peer_class_id);
  f.add_rule(boost::asio::ip::make_address("0.0.0.0"),
             boost::asio::ip::make_address("255.255.255.255"), global);
  f.add_rule(boost::asio::ip::make_address("::"),
             boost::asio::ip::make_address("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"), global);
  return f;
}

}  // namespace

struct Swarm::Impl : std::enable_shared_from_this<Swarm::Impl> {
  struct Chunk {
    lt::torrent_handle handle;
    std::string name;
    uint64_t length = 0;
    uint32_t piece_size = 0;
    uint32_t piece_count = 0;
    std::vector<bool> reported;  // pieces we have: downloaded and reported, or given at add
    uint32_t reported_count = 0;
    bool complete = false;
    bool errored = false;
    bool has_cert = false;  // peer TLS: this agent's certificate given (the torrent resumed)
    ChunkAnnounces announces;
    // Stall re-announces (ReannounceStalled): payload seen at the last check, when to check
    // next, and the wait after the next re-announce.
    int64_t payload_seen = 0;
    std::chrono::steady_clock::time_point stall_check_at;
    std::chrono::milliseconds stall_backoff{0};
    std::vector<std::string> trackers;  // its announce URLs, tier i = trackers[i]
    std::function<void(uint32_t, uint64_t, uint64_t)> on_piece;
    std::function<void()> on_complete;
    std::function<void(const Error&)> on_error;
  };

  Impl(boost::asio::io_context& context, SwarmOptions o) : ioc(context), options(std::move(o)) {}

  boost::asio::io_context& ioc;
  SwarmOptions options;
  std::shared_ptr<FileRangeRegistry> registry = std::make_shared<FileRangeRegistry>();
  std::shared_ptr<RangeDiskIoStats> disk_stats = std::make_shared<RangeDiskIoStats>();
  std::unique_ptr<lt::session> session;
  uint16_t port = 0;
  int configured_download_limit = 0;  // download_rate_limit after the overrides (0: none)
  std::map<Sha1, Chunk> chunks;
  std::map<lt::torrent_handle, Sha1> by_handle;
  // Totals of removed chunks, so Stats() keeps counting them.
  uint64_t removed_downloaded = 0;
  uint64_t removed_uploaded = 0;
  uint64_t removed_redundant = 0;
  uint64_t hash_failures = 0;
  uint64_t peers_banned = 0;
  uint64_t announce_replies = 0;
  uint64_t announce_errors = 0;
  uint64_t stall_reannounces = 0;
  // UDP announces that timed out, by tracker URL without its query (UdpAnnounceTimeouts).
  std::map<std::string, uint64_t> udp_timeouts;
  uint64_t peer_tls_refused = 0;
  bool announces_failing = false;  // the last announce of this session failed
  std::mt19937 rng{std::random_device{}()};  // ReannounceVia's spread
  std::vector<lt::alert*> alerts;
  // Session counters sampled every second (post_session_stats): ses.waste_piece_* by reason.
  boost::asio::steady_timer stats_timer{ioc};
  std::array<int, kWasteReasons.size()> waste_index{};
  std::array<uint64_t, kWasteReasons.size()> wasted{};
  int peers_index = -1;  // peer.num_peers_connected
  uint64_t peers_connected = 0;
  std::vector<int64_t> last_counters;  // the latest sample of every session counter

  const std::string& root_cert() const {
    static const std::string kNone;
    return options.tls ? options.tls->ca_pem : kNone;
  }

  Chunk* Find(const lt::torrent_handle& h) {
    auto it = by_handle.find(h);
    if (it == by_handle.end()) return nullptr;
    auto c = chunks.find(it->second);
    return c == chunks.end() ? nullptr : &c->second;
  }

  void InstallNotify() {
    std::weak_ptr<Impl> weak = weak_from_this();
    boost::asio::io_context* ctx = &ioc;
    // Runs on libtorrent's thread when its alert queue becomes non-empty: only post.
    session->set_alert_notify([weak, ctx] {
      boost::asio::post(*ctx, [weak] {
        if (auto self = weak.lock()) self->Pump();
      });
    });
  }

  void Pump() {
    if (!session) return;
    session->pop_alerts(&alerts);
    // `alerts` points into the session's alert storage, valid until the next pop_alerts: a
    // callback that stops the session ends the loop.
    for (lt::alert* a : alerts) {
      if (!session) break;
      Dispatch(a);
    }
    alerts.clear();
  }

  void Dispatch(lt::alert* a) {
    if (auto* p = lt::alert_cast<lt::piece_finished_alert>(a)) {
      OnPiece(p->handle, static_cast<int>(p->piece_index));
    } else if (auto* f = lt::alert_cast<lt::hash_failed_alert>(a)) {
      ++hash_failures;
      Chunk* c = Find(f->handle);
      spdlog::warn("swarm: piece {} of chunk {} failed its hash check; re-downloading it",
                   static_cast<int>(f->piece_index), c ? c->name : f->torrent_name());
    } else if (auto* b = lt::alert_cast<lt::peer_ban_alert>(a)) {
      ++peers_banned;
      Chunk* c = Find(b->handle);
      spdlog::warn("swarm: banned peer {} of chunk {} for sending data that failed hash checks",
                   Endpoint(b->endpoint), c ? c->name : b->torrent_name());
    } else if (auto* fe = lt::alert_cast<lt::file_error_alert>(a)) {
      Fail(fe->handle, ErrorCode::kIo,
           std::string("disk error (") + lt::operation_name(fe->op) + "): " + fe->error.message());
    } else if (auto* te = lt::alert_cast<lt::torrent_error_alert>(a)) {
      Fail(te->handle, ErrorCode::kIo, "torrent error: " + te->error.message());
    } else if (auto* tr = lt::alert_cast<lt::tracker_error_alert>(a)) {
      Chunk* c = Find(tr->handle);
      std::string reason = tr->failure_reason();
      std::string msg = reason.empty() ? tr->error.message() : reason;
      ++announce_errors;
      if (const std::string url = tr->tracker_url();
          (tr->error == lt::errors::timed_out || tr->error == boost::asio::error::timed_out) &&
          url.rfind("udp://", 0) == 0) {
        ++udp_timeouts[url.substr(0, url.find('?'))];
      }
      if (c) {
        ++c->announces.errors;
        c->announces.last_error = msg;
        // Our side cannot route to the tracker (as opposed to a tracker that refuses or is
        // restarting, which every agent sees at once).
        const auto& e = tr->error;
        c->announces.unroutable = e == boost::system::errc::host_unreachable ||
                                  e == boost::system::errc::network_unreachable ||
                                  e == boost::system::errc::address_not_available;
      }
      if (!announces_failing) {
        // Said once at error level until an announce works again: without announces no peer
        // can find this agent and it finds none (e.g. --swarm-listen on an address from which
        // the tracker cannot be reached).
        announces_failing = true;
        spdlog::error(
            "swarm: announces fail (tracker {}: {}); peers cannot find this agent while "
            "this lasts",
            Redacted(tr->tracker_url()), msg);
      }
      if (tr->times_in_row <= 1) {
        spdlog::warn("swarm: tracker {} failed for chunk {}: {}", Redacted(tr->tracker_url()),
                     c ? c->name : tr->torrent_name(), msg);
      } else {
        spdlog::debug("swarm: tracker {} failed for chunk {} ({} times in a row): {}",
                      Redacted(tr->tracker_url()), c ? c->name : tr->torrent_name(),
                      tr->times_in_row, msg);
      }
    } else if (auto* ta = lt::alert_cast<lt::tracker_announce_alert>(a)) {
      if (Chunk* c = Find(ta->handle)) ++c->announces.sent;
    } else if (auto* tw = lt::alert_cast<lt::tracker_warning_alert>(a)) {
      spdlog::warn("swarm: tracker {} warns about chunk {}: {}", Redacted(tw->tracker_url()),
                   tw->torrent_name(), tw->warning_message());
    } else if (auto* rep = lt::alert_cast<lt::tracker_reply_alert>(a)) {
      ++announce_replies;
      if (announces_failing) {
        announces_failing = false;
        spdlog::info("swarm: announces work again (tracker {})", Redacted(rep->tracker_url()));
      }
      if (Chunk* c = Find(rep->handle)) {
        ++c->announces.replies;
        c->announces.peers_offered = rep->num_peers;
      }
      spdlog::debug("swarm: tracker {} returned {} peers for chunk {}",
                    Redacted(rep->tracker_url()), rep->num_peers, rep->torrent_name());
    } else if (auto* ls = lt::alert_cast<lt::listen_succeeded_alert>(a)) {
      // libtorrent also opens a UDP socket (uTP and UDP trackers) even with uTP off.
      spdlog::log(
          ls->socket_type == lt::socket_type_t::tcp ? spdlog::level::info : spdlog::level::debug,
          "swarm: listening on {}:{} ({})", ls->address.to_string(), ls->port,
          SocketTypeName(ls->socket_type));
    } else if (auto* lf = lt::alert_cast<lt::listen_failed_alert>(a)) {
      spdlog::error("swarm: cannot listen on {}:{} ({}): {}", lf->address.to_string(), lf->port,
                    SocketTypeName(lf->socket_type), lf->error.message());
    } else if (lt::alert_cast<lt::alerts_dropped_alert>(a)) {
      spdlog::warn("swarm: libtorrent dropped alerts (queue full); resyncing piece state");
      Resync();
    } else if (auto* ss = lt::alert_cast<lt::session_stats_alert>(a)) {
      auto counters = ss->counters();
      last_counters.assign(counters.begin(), counters.end());
      for (size_t i = 0; i < waste_index.size(); ++i) {
        int idx = waste_index[i];
        if (idx >= 0 && idx < static_cast<int>(counters.size())) {
          wasted[i] = static_cast<uint64_t>(std::max<int64_t>(0, counters[idx]));
        }
      }
      if (peers_index >= 0 && peers_index < static_cast<int>(counters.size())) {
        peers_connected = static_cast<uint64_t>(std::max<int64_t>(0, counters[peers_index]));
      }
    } else if (auto* nc = lt::alert_cast<lt::torrent_need_cert_alert>(a)) {
      OnNeedCert(nc->handle);
    } else if (auto* pd = lt::alert_cast<lt::peer_disconnected_alert>(a)) {
      OnPeerDisconnected(*pd);
    } else if (auto* pe = lt::alert_cast<lt::peer_error_alert>(a)) {
      OnPeerError(*pe);
    } else if (auto* perf = lt::alert_cast<lt::performance_alert>(a)) {
      spdlog::debug("swarm: {}", perf->message());
    }
  }

  // An SSL torrent asks for this agent's certificate before it connects to any peer.
  void OnNeedCert(const lt::torrent_handle& h) {
    Chunk* c = Find(h);
    if (!c || !options.tls || c->has_cert) return;
    c->has_cert = true;
    const tls::PeerTls& t = *options.tls;
    lt::torrent_handle handle = h;  // set_ssl_certificate_buffer is not const
    handle.set_ssl_certificate_buffer(t.cert_pem, t.key_pem, t.dh_pem);
    handle.resume();
    handle.force_reannounce(0, -1, lt::torrent_handle::ignore_min_interval);
    spdlog::debug("swarm: gave chunk {} this agent's peer certificate", c->name);
  }

  // A connection that had got past connecting and closed (see ChunkAnnounces::last_peer_closed).
  void OnPeerDisconnected(const lt::peer_disconnected_alert& a) {
    const bool never_connected =
        a.op == lt::operation_t::connect || a.op == lt::operation_t::sock_open ||
        a.op == lt::operation_t::sock_bind || a.op == lt::operation_t::getpeername ||
        a.op == lt::operation_t::ssl_handshake;
    // Our own closes (the idle timeout, redundant or surplus connections) are not the swarm
    // telling us it is busy; counting them would let a chunk wait --peer-stall-ms for nothing.
    const bool remote = !never_connected && ClosedByRemote(a.error);
    spdlog::debug("swarm: peer {} {} the connection ({}: {})", Endpoint(a.endpoint),
                  remote ? "closed" : never_connected ? "never completed" : "lost",
                  lt::operation_name(a.op), a.error.message());
    if (!remote) return;
    if (Chunk* c = Find(a.handle)) c->announces.last_peer_closed = std::chrono::steady_clock::now();
  }

  void OnPeerError(const lt::peer_error_alert& a) {
    if (a.op != lt::operation_t::ssl_handshake) return;
    ++peer_tls_refused;
    // At debug: an outsider probing the port would otherwise fill the log.
    spdlog::debug("swarm: peer {}: TLS handshake failed: {}", Endpoint(a.endpoint),
                  a.error.message());
  }

  void OnPiece(const lt::torrent_handle& h, int piece) {
    Chunk* c = Find(h);
    if (!c || piece < 0 || static_cast<uint32_t>(piece) >= c->piece_count) return;
    if (c->reported[static_cast<size_t>(piece)]) return;
    c->reported[static_cast<size_t>(piece)] = true;
    ++c->reported_count;
    Sha1 key = by_handle[h];
    uint64_t begin = uint64_t{static_cast<uint32_t>(piece)} * c->piece_size;
    uint64_t end = std::min<uint64_t>(begin + c->piece_size, c->length);
    // Copy the callback: it may remove the chunk (and so destroy the stored one).
    if (c->on_piece) {
      auto cb = c->on_piece;
      cb(static_cast<uint32_t>(piece), begin, end);
    }
    MaybeComplete(key);
  }

  void MaybeComplete(const Sha1& key) {
    auto it = chunks.find(key);
    if (it == chunks.end()) return;
    Chunk& c = it->second;
    if (c.complete || c.reported_count != c.piece_count) return;
    c.complete = true;
    spdlog::debug("swarm: chunk {} complete", c.name);
    if (c.on_complete) {
      auto cb = c.on_complete;
      cb();
    }
  }

  void Fail(const lt::torrent_handle& h, ErrorCode code, std::string message) {
    Chunk* c = Find(h);
    if (!c) return;
    std::string full = "chunk " + c->name + ": " + message;
    if (c->errored) {
      spdlog::debug("swarm: {}", full);
      return;
    }
    spdlog::error("swarm: {}", full);
    c->errored = true;
    if (c->on_error) {
      auto cb = c->on_error;
      cb(MakeError(code, full));
    }
  }

  // After lost alerts: report pieces libtorrent has that we did not report yet, and give the
  // certificate to SSL torrents whose torrent_need_cert_alert was lost (they stay paused).
  void Resync() {
    std::vector<lt::torrent_handle> need_cert;
    for (auto& [k, c] : chunks) {
      if (options.tls && !c.has_cert) need_cert.push_back(c.handle);
    }
    for (const lt::torrent_handle& h : need_cert) OnNeedCert(h);
    std::vector<Sha1> keys;
    for (auto& [k, c] : chunks) {
      if (!c.complete) keys.push_back(k);
    }
    for (const Sha1& k : keys) {
      auto it = chunks.find(k);
      if (it == chunks.end() || !session) continue;
      lt::torrent_handle h = it->second.handle;
      lt::torrent_status st = h.status(lt::torrent_handle::query_pieces);
      if (st.errc) Fail(h, ErrorCode::kIo, "torrent error: " + st.errc.message());
      for (int i = 0; i < st.pieces.size(); ++i) {
        if (st.pieces.get_bit(lt::piece_index_t(i))) OnPiece(h, i);
      }
    }
  }

  Status Start() {
    if (session) return MakeError(ErrorCode::kInternal, "swarm already started");
    lt::settings_pack settings = MakeSettings(options);
    if (auto st = ApplyOverrides(options.libtorrent_settings, settings); !st) return st;
    for (const std::string& entry : options.libtorrent_settings) {
      spdlog::info("swarm: libtorrent setting {} (override)", entry);
    }
    configured_download_limit = settings.get_int(lt::settings_pack::download_rate_limit);
    lt::session_params params(std::move(settings));
    params.disk_io_constructor =
        RangeDiskIoConstructor(RangeDiskIoOptions{registry, options.disk_threads, nullptr,
                                                  int64_t{64} << 20, disk_stats,
                                                  options.disk_write_delay});
    try {
      session = std::make_unique<lt::session>(std::move(params));
    } catch (const std::exception& e) {
      return MakeError(ErrorCode::kInvalidArgument,
                       std::string("cannot start libtorrent: ") + e.what());
    }
    session->set_peer_class_filter(GlobalOnlyPeerClassFilter());
    InstallNotify();
    for (size_t i = 0; i < waste_index.size(); ++i) {
      waste_index[i] = lt::find_metric_idx(std::string("ses.waste_piece_") + kWasteReasons[i]);
    }
    peers_index = lt::find_metric_idx("peer.num_peers_connected");
    SampleStats();
    port = options.tls ? session->ssl_listen_port() : session->listen_port();
    if (port == 0) {
      // Collect libtorrent's reason before giving up.
      std::string why = "no listen socket";
      std::vector<lt::alert*> pending;
      session->pop_alerts(&pending);
      for (lt::alert* a : pending) {
        if (auto* lf = lt::alert_cast<lt::listen_failed_alert>(a)) why = lf->message();
      }
      StopSession();
      return MakeError(ErrorCode::kUnavailable,
                       "swarm cannot listen on " + options.listen_interface + ": " + why);
    }
    spdlog::info("swarm: started, peers port {} ({})", port,
                 options.tls ? "TLS, cluster CA" : "plain TCP");
    return Ok();
  }

  // Asks libtorrent for its counters now and every second while the session runs.
  void SampleStats() {
    if (!session) return;
    session->post_session_stats();
    SampleDownloading();
    stats_timer.expires_after(std::chrono::seconds(1));
    std::weak_ptr<Impl> weak = weak_from_this();
    stats_timer.async_wait([weak](const boost::system::error_code& ec) {
      if (ec) return;
      if (auto self = weak.lock()) self->SampleStats();
    });
  }

  // Every downloading chunk's status in one call into libtorrent's thread (not one per chunk):
  // its connected peers for Announces(), then the stall check. No call while none downloads.
  void SampleDownloading() {
    if (!session) return;
    if (std::all_of(chunks.begin(), chunks.end(),
                    [](const auto& kv) { return kv.second.complete || kv.second.errored; })) {
      return;
    }
    std::vector<lt::torrent_status> statuses = session->get_torrent_status(
        [](const lt::torrent_status& st) { return !st.is_seeding && !st.is_finished; }, {});
    const auto now = std::chrono::steady_clock::now();
    for (const lt::torrent_status& st : statuses) {
      Chunk* c = Find(st.handle);
      if (c == nullptr) continue;
      c->announces.connected = st.num_peers;
      ReannounceIfStalled(*c, st, now);
    }
  }

  // A downloading chunk with no payload since its last check and a free connection slot
  // announces again (SwarmOptions::stall_reannounce_ms). A chunk whose slots are all taken
  // waits: idle connections close after idle_peer_timeout_s, and the next check finds room.
  void ReannounceIfStalled(Chunk& c, const lt::torrent_status& st,
                           std::chrono::steady_clock::time_point now) {
    using std::chrono::milliseconds;
    if (options.stall_reannounce_ms <= 0) return;
    if (c.complete || c.errored || c.trackers.empty() || now < c.stall_check_at) return;
    if (options.tls && !c.has_cert) return;  // without the certificate it is paused
    const milliseconds base(options.stall_reannounce_ms);
    const milliseconds most = std::max(base, milliseconds(options.min_announce_interval_s * 1000));
    if (st.total_payload_download != c.payload_seen) {
      c.payload_seen = st.total_payload_download;
      c.stall_backoff = base;
      c.stall_check_at = now + base;
      return;
    }
    if (options.peers_per_chunk > 0 && st.num_peers >= options.peers_per_chunk) {
      c.stall_check_at = now + milliseconds(1000);
      return;
    }
    c.handle.force_reannounce(0, -1, lt::torrent_handle::ignore_min_interval);
    ++stall_reannounces;
    spdlog::debug("swarm: chunk {} got no payload since its last check, {} peers: "
                  "re-announcing (next check in {} ms)",
                  c.name, st.num_peers, c.stall_backoff.count());
    c.stall_check_at = now + c.stall_backoff;
    c.stall_backoff = std::min(most, c.stall_backoff * 2);
  }

  void StopSession() {
    if (!session) return;
    stats_timer.cancel();
    if (spdlog::should_log(spdlog::level::debug) && !last_counters.empty()) {
      // libtorrent's own counters, for tuning: every non-zero one from the last sample.
      std::string all;
      for (const lt::stats_metric& m : lt::session_stats_metrics()) {
        if (m.value_index < 0 || m.value_index >= static_cast<int>(last_counters.size())) continue;
        int64_t v = last_counters[static_cast<size_t>(m.value_index)];
        if (v != 0) all += std::string(all.empty() ? "" : " ") + m.name + "=" + std::to_string(v);
      }
      spdlog::debug("swarm: libtorrent counters at stop: {}", all);
    }
    session->pause();
    WaitForUdpStoppedAnnounces();
    lt::session_proxy proxy = session->abort();  // also clears the alert notify function
    session.reset();
    // proxy's destructor waits for libtorrent's threads (network and disk) to finish.
  }

  // Whether an announce of some chunk torrent is on its way to a tracker.
  bool AnnouncesInFlight() const {
    if (!session) return false;
    for (const auto& [key, c] : chunks) {
      if (Announcing(c.handle, [](const std::string&) { return true; })) return true;
    }
    return false;
  }

  // Whether an announce of h to a tracker whose URL `pick` accepts is on its way.
  template <typename Pick>
  static bool Announcing(const lt::torrent_handle& h, Pick&& pick) {
    for (const lt::announce_entry& ae : h.trackers()) {
      if (!pick(ae.url)) continue;
      for (const lt::announce_endpoint& ep : ae.endpoints) {
        for (const lt::announce_infohash& ih : ep.info_hashes) {
          if (ih.updating) return true;
        }
      }
    }
    return false;
  }

  // Torrents announce `stopped` as they pause. A UDP announce goes out through the session's
  // UDP socket, which abort() closes at once (an HTTP one has a socket of its own), so wait until
  // no UDP announce is in flight, at most stop_tracker_timeout (2 s).
  void WaitForUdpStoppedAnnounces() {
    auto udp = [](const std::string& url) { return url.rfind("udp://", 0) == 0; };
    std::vector<lt::torrent_handle> handles;
    for (const auto& [key, c] : chunks) {
      if (std::any_of(c.trackers.begin(), c.trackers.end(), udp)) handles.push_back(c.handle);
    }
    if (handles.empty()) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (;;) {
      const bool in_flight = std::any_of(handles.begin(), handles.end(),
                                         [&](const auto& h) { return Announcing(h, udp); });
      if (!in_flight || std::chrono::steady_clock::now() >= until) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  void Stop() {
    if (!session) return;
    StopSession();
    chunks.clear();
    by_handle.clear();
    registry->Clear();
    port = 0;
    spdlog::info("swarm: stopped");
  }

  Result<ChunkHandle> AddChunk(ChunkSpec spec) {
    if (!session) return MakeError(ErrorCode::kUnavailable, "swarm is not started");
    const ChunkTorrent& t = spec.torrent;
    const Sha1 key = t.info_hash;
    if (chunks.count(key)) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "chunk " + t.name + " (" + Sha1Hex(key) + ") is already added");
    }
    auto valid = ValidateFileRange(spec.range);
    if (!valid) return valid.error();
    if (spec.range.length != t.length) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "chunk " + t.name + " is " + std::to_string(t.length) +
                           " bytes, its file range " + std::to_string(spec.range.length));
    }
    uint32_t pieces = static_cast<uint32_t>(t.piece_hashes.size());
    if (!spec.have_pieces.empty() && spec.have_pieces.size() != pieces) {
      return MakeError(ErrorCode::kInvalidArgument, "have_pieces has " +
                                                        std::to_string(spec.have_pieces.size()) +
                                                        " entries, chunk " + t.name + " has " +
                                                        std::to_string(pieces) + " pieces");
    }
    lt::error_code ec;
    auto ti = std::make_shared<lt::torrent_info>(
        lt::span<const char>(t.metainfo.data(), static_cast<long>(t.metainfo.size())), ec,
        lt::from_span);
    if (ec) return MakeError(ErrorCode::kProtocol, "chunk " + t.name + ": " + ec.message());
    if (FromLt(ti->info_hashes().v1) != key || static_cast<uint32_t>(ti->num_pieces()) != pieces) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "chunk " + t.name + ": metainfo does not match its parsed fields");
    }
    lt::string_view carried = ti->ssl_cert();
    if (std::string_view(carried.data(), carried.size()) != root_cert()) {
      // A plain torrent in a TLS swarm would take any peer; an SSL one without TLS never runs.
      return MakeError(ErrorCode::kInvalidArgument,
                       "chunk " + t.name + (options.tls ? " is not an SSL torrent of this "
                                                          "swarm's peer CA"
                                                        : " is an SSL torrent; this swarm has "
                                                          "plain peers"));
    }

    Chunk c;
    c.name = t.name;
    c.length = t.length;
    c.piece_size = t.piece_size;
    c.piece_count = pieces;
    c.reported.assign(pieces, spec.seed);
    if (!spec.seed && !spec.have_pieces.empty()) c.reported = spec.have_pieces;
    c.reported_count =
        static_cast<uint32_t>(std::count(c.reported.begin(), c.reported.end(), true));
    c.complete = c.reported_count == pieces;
    c.on_piece = std::move(spec.on_piece);
    c.on_complete = std::move(spec.on_complete);
    c.on_error = std::move(spec.on_error);

    lt::add_torrent_params atp;
    atp.ti = std::move(ti);
    atp.save_path = ".";  // unused: range_disk_io maps the torrent onto spec.range
    atp.flags &= ~(lt::torrent_flags::auto_managed | lt::torrent_flags::paused);
    // An SSL torrent starts paused: connecting before it has this agent's certificate makes the
    // peer refuse the handshake, and libtorrent then waits min_reconnect_time to try that peer
    // again. OnNeedCert gives the certificate, resumes it and announces.
    if (options.tls) atp.flags |= lt::torrent_flags::paused;
    atp.flags |= lt::torrent_flags::duplicate_is_error;
    if (spec.sequential) atp.flags |= lt::torrent_flags::sequential_download;
    if (options.peers_per_chunk > 0) atp.max_connections = options.peers_per_chunk;
    if (c.reported_count > 0) {
      // The embedder verified these bytes (the whole blob's sha256 for a seed): no hashing.
      atp.have_pieces.resize(static_cast<int>(pieces), false);
      for (uint32_t i = 0; i < pieces; ++i) {
        if (c.reported[i]) atp.have_pieces.set_bit(lt::piece_index_t(static_cast<int>(i)));
      }
      atp.flags |= lt::torrent_flags::no_verify_files;
    }
    atp.trackers = spec.tracker_urls;
    atp.tracker_tiers.resize(spec.tracker_urls.size());
    std::iota(atp.tracker_tiers.begin(), atp.tracker_tiers.end(), 0);
    c.trackers = spec.tracker_urls;

    if (auto reg = registry->Register(key, spec.range); !reg) return reg.error();
    lt::torrent_handle h = session->add_torrent(std::move(atp), ec);
    if (ec) {
      registry->Unregister(key);
      return MakeError(ErrorCode::kInternal,
                       "libtorrent refused chunk " + t.name + ": " + ec.message());
    }
    if (!spec.tracker_urls.empty() && !options.tls) {
      h.force_reannounce(0, -1, lt::torrent_handle::ignore_min_interval);
    }
    c.handle = h;
    c.stall_backoff = std::chrono::milliseconds(std::max(0, options.stall_reannounce_ms));
    c.stall_check_at = std::chrono::steady_clock::now() + c.stall_backoff;
    spdlog::debug("swarm: added chunk {} ({}, {} pieces, {})", c.name, Sha1Hex(key), pieces,
                  spec.seed ? "seeding" : "downloading");
    by_handle[h] = key;
    chunks.emplace(key, std::move(c));
    return ChunkHandle{key};
  }

  void RemoveChunk(const Sha1& key) {
    auto it = chunks.find(key);
    if (it == chunks.end() || !session) return;
    lt::torrent_handle h = it->second.handle;
    lt::torrent_status st = h.status({});
    removed_downloaded += static_cast<uint64_t>(std::max<int64_t>(0, st.total_payload_download));
    removed_uploaded += static_cast<uint64_t>(std::max<int64_t>(0, st.total_payload_upload));
    removed_redundant += static_cast<uint64_t>(std::max<int64_t>(0, st.total_redundant_bytes));
    session->remove_torrent(h);
    by_handle.erase(h);
    chunks.erase(it);
    registry->Unregister(key);
  }

  SwarmStats Stats() {
    SwarmStats out;
    out.downloaded = removed_downloaded;
    out.uploaded = removed_uploaded;
    out.redundant = removed_redundant;
    out.hash_failures = hash_failures;
    out.peers_banned = peers_banned;
    out.announce_replies = announce_replies;
    out.announce_errors = announce_errors;
    out.stall_reannounces = stall_reannounces;
    out.peer_tls_refused = peer_tls_refused;
    out.piece_bytes_hashed_from_memory = disk_stats->bytes_hashed_from_memory.load();
    out.piece_bytes_read_back = disk_stats->bytes_read_back.load();
    out.wasted = wasted;
    out.peers_connected = peers_connected;
    out.torrents = chunks.size();
    if (!session) return out;
    std::vector<lt::torrent_status> all =
        session->get_torrent_status([](const lt::torrent_status&) { return true; }, {});
    for (const lt::torrent_status& st : all) {
      auto key = by_handle.find(st.handle);
      if (key == by_handle.end()) continue;  // removed, counted above
      const Chunk& c = chunks.at(key->second);
      ChunkStats cs;
      cs.info_hash = key->second;
      cs.name = c.name;
      cs.downloaded = static_cast<uint64_t>(std::max<int64_t>(0, st.total_payload_download));
      cs.uploaded = static_cast<uint64_t>(std::max<int64_t>(0, st.total_payload_upload));
      cs.redundant = static_cast<uint64_t>(std::max<int64_t>(0, st.total_redundant_bytes));
      cs.pieces_have = static_cast<uint32_t>(std::max(0, st.num_pieces));
      cs.pieces_total = c.piece_count;
      cs.peers = st.num_peers;
      cs.seeding = st.is_seeding;
      out.downloaded += cs.downloaded;
      out.uploaded += cs.uploaded;
      out.redundant += cs.redundant;
      out.chunks.push_back(std::move(cs));
    }
    return out;
  }
};

Swarm::Swarm(boost::asio::io_context& ioc, SwarmOptions options)
    : impl_(std::make_shared<Impl>(ioc, std::move(options))) {}

Swarm::~Swarm() { Stop(); }

Status Swarm::Start() { return impl_->Start(); }
uint16_t Swarm::listen_port() const { return impl_->port; }
const std::string& Swarm::root_cert() const { return impl_->root_cert(); }
void Swarm::Stop() { impl_->Stop(); }
void Swarm::Pause() {
  if (impl_->session) impl_->session->pause();
}
bool Swarm::AnnouncesInFlight() const { return impl_->AnnouncesInFlight(); }
Result<ChunkHandle> Swarm::AddChunk(ChunkSpec spec) { return impl_->AddChunk(std::move(spec)); }
void Swarm::RemoveChunk(const Sha1& info_hash) { impl_->RemoveChunk(info_hash); }
bool Swarm::HasChunk(const Sha1& info_hash) const { return impl_->chunks.count(info_hash) > 0; }
uint64_t Swarm::AnnounceReplies() const { return impl_->announce_replies; }
SwarmStats Swarm::Stats() { return impl_->Stats(); }
std::optional<ChunkAnnounces> Swarm::Announces(const Sha1& info_hash) const {
  auto it = impl_->chunks.find(info_hash);
  if (it == impl_->chunks.end()) return std::nullopt;
  return it->second.announces;
}

int Swarm::PeersNow(const Sha1& info_hash) const {
  auto it = impl_->chunks.find(info_hash);
  if (it == impl_->chunks.end() || !it->second.handle.is_valid()) return -1;
  return it->second.handle.status({}).num_peers;
}

void Swarm::Reannounce(const Sha1& info_hash) {
  auto it = impl_->chunks.find(info_hash);
  if (it == impl_->chunks.end()) return;
  it->second.handle.force_reannounce(0, -1, lt::torrent_handle::ignore_min_interval);
}

bool ClosedByRemote(const boost::system::error_code& ec) {
  namespace ae = boost::asio::error;
  return ec == ae::eof || ec == ae::connection_reset || ec == ae::broken_pipe ||
         ec == ae::connection_aborted || ec == boost::asio::ssl::error::stream_truncated;
}

std::string_view AnnounceUrlBase(std::string_view url) {
  url = url.substr(0, url.find('?'));
  size_t scheme = url.find("://");
  return scheme == std::string_view::npos ? url : url.substr(scheme + 3);
}

std::map<std::string, uint64_t> Swarm::UdpAnnounceTimeouts() const { return impl_->udp_timeouts; }

void Swarm::ReplaceTrackers(const std::vector<std::string>& urls) {
  // The URL without its scheme and query: a replica's announce URL moves from udp:// to http://
  // when UDP does not reach it, and its key (the query) changes when the token rotates.
  auto base = [](const std::string& url) { return AnnounceUrlBase(url); };
  for (auto& [key, chunk] : impl_->chunks) {
    std::vector<lt::announce_entry> entries;
    for (std::string& url : chunk.trackers) {
      auto it = std::find_if(urls.begin(), urls.end(),
                             [&](const std::string& u) { return base(u) == base(url); });
      if (it != urls.end()) url = *it;
      entries.emplace_back(url);
      entries.back().tier = static_cast<std::uint8_t>(entries.size() - 1);
    }
    chunk.handle.replace_trackers(entries);
    chunk.handle.force_reannounce(0, -1, lt::torrent_handle::ignore_min_interval);
  }
}

void Swarm::CapDownloadRate(int64_t bytes_per_s) {
  if (!impl_->session) return;
  const int configured = impl_->configured_download_limit;
  int64_t limit = configured;
  if (bytes_per_s > 0)
    limit = configured > 0 ? std::min<int64_t>(configured, bytes_per_s) : bytes_per_s;
  lt::settings_pack p;
  p.set_int(lt::settings_pack::download_rate_limit,
            static_cast<int>(std::min<int64_t>(limit, std::numeric_limits<int>::max())));
  impl_->session->apply_settings(std::move(p));
}

size_t Swarm::ReannounceWhere(const std::function<bool(const std::vector<std::string>& urls)>& pick,
                              std::chrono::seconds spread) {
  std::uniform_int_distribution<int> delay(0,
                                           static_cast<int>(std::max<int64_t>(0, spread.count())));
  size_t n = 0;
  for (auto& [key, chunk] : impl_->chunks) {
    if (chunk.trackers.empty() || !pick(chunk.trackers)) continue;
    chunk.handle.force_reannounce(delay(impl_->rng), -1, lt::torrent_handle::ignore_min_interval);
    ++n;
  }
  return n;
}

void Swarm::ReannounceAll() {
  for (auto& [key, chunk] : impl_->chunks)
    chunk.handle.force_reannounce(0, -1, lt::torrent_handle::ignore_min_interval);
}

}  // namespace shoal::swarm
