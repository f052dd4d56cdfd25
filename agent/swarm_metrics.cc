#include "agent/swarm_metrics.h"

namespace shoal::agent {
namespace {

prometheus::Counter& MakeCounter(prometheus::Registry& r, const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

void AddDelta(prometheus::Counter& c, uint64_t now, uint64_t before) {
  if (now > before) c.Increment(static_cast<double>(now - before));
}

}  // namespace

SwarmMetrics::SwarmMetrics(prometheus::Registry& registry)
    : downloaded_(MakeCounter(registry, "shoal_swarm_payload_downloaded_bytes_total",
                              "Payload bytes received from peers (including failed pieces)")),
      redundant_(MakeCounter(registry, "shoal_swarm_redundant_bytes_total",
                             "Of the payload bytes from peers, those this node already had "
                             "(end-game duplicates, timed-out requests served late)")),
      uploaded_(MakeCounter(registry, "shoal_swarm_payload_uploaded_bytes_total",
                            "Payload bytes sent to peers")),
      hash_failures_(MakeCounter(registry, "shoal_swarm_hash_failures_total",
                                 "Pieces from peers that failed their hash check")),
      banned_(MakeCounter(registry, "shoal_swarm_peers_banned_total",
                          "Peers banned for sending corrupt data")),
      tls_refused_(MakeCounter(registry, "shoal_swarm_peer_tls_refused_total",
                               "Peer connections that ended in their TLS handshake: no "
                               "certificate or one not from the cluster's peer CA, or a plain "
                               "client on the TLS port")),
      stall_reannounces_(MakeCounter(registry, "shoal_swarm_stall_reannounces_total",
                                     "Re-announces of downloading chunks that got no payload "
                                     "from their peers for a while (asking for more peers)")),
      announces_(prometheus::BuildCounter()
                     .Name("shoal_swarm_announces_total")
                     .Help("Tracker announces of chunk torrents, by result (ok, error)")
                     .Register(registry)),
      announces_ok_(announces_.Add({{"result", "ok"}})),
      announces_error_(announces_.Add({{"result", "error"}})),
      hashed_(prometheus::BuildCounter()
                  .Name("shoal_swarm_piece_hashed_bytes_total")
                  .Help("Piece bytes hashed (SHA-1) before a piece is accepted, by source: memory "
                        "(followed as the blocks were written) or file (read back from the blob "
                        "file; should stay near 0)")
                  .Register(registry)),
      hashed_memory_(hashed_.Add({{"source", "memory"}})),
      hashed_file_(hashed_.Add({{"source", "file"}})),
      torrents_(prometheus::BuildGauge()
                    .Name("shoal_swarm_torrents")
                    .Help("Chunk torrents in the session (seeding or downloading)")
                    .Register(registry)
                    .Add({})),
      peers_(prometheus::BuildGauge()
                 .Name("shoal_swarm_peers_connected")
                 .Help("Peer connections open now, over all chunk torrents")
                 .Register(registry)
                 .Add({})) {
  auto& wasted = prometheus::BuildCounter()
                     .Name("shoal_swarm_wasted_bytes_total")
                     .Help(
                         "Payload bytes from peers that libtorrent discarded, by reason "
                         "(end_game: duplicate blocks; timed_out: requests re-sent after a "
                         "timeout; cancelled, unknown, seed, closing)")
                     .Register(registry);
  for (const char* reason : swarm::kWasteReasons)
    wasted_.push_back(&wasted.Add({{"reason", reason}}));
}

void SwarmMetrics::Update(const swarm::SwarmStats& s) {
  AddDelta(downloaded_, s.downloaded, last_.downloaded);
  AddDelta(redundant_, s.redundant, last_.redundant);
  AddDelta(uploaded_, s.uploaded, last_.uploaded);
  AddDelta(hash_failures_, s.hash_failures, last_.hash_failures);
  AddDelta(banned_, s.peers_banned, last_.peers_banned);
  AddDelta(tls_refused_, s.peer_tls_refused, last_.peer_tls_refused);
  AddDelta(announces_ok_, s.announce_replies, last_.announce_replies);
  AddDelta(announces_error_, s.announce_errors, last_.announce_errors);
  AddDelta(stall_reannounces_, s.stall_reannounces, last_.stall_reannounces);
  AddDelta(hashed_memory_, s.piece_bytes_hashed_from_memory, last_.piece_bytes_hashed_from_memory);
  AddDelta(hashed_file_, s.piece_bytes_read_back, last_.piece_bytes_read_back);
  torrents_.Set(static_cast<double>(s.torrents));
  peers_.Set(static_cast<double>(s.peers_connected));
  for (size_t i = 0; i < wasted_.size(); ++i) AddDelta(*wasted_[i], s.wasted[i], last_.wasted[i]);
  last_.wasted = s.wasted;
  last_.downloaded = s.downloaded;
  last_.redundant = s.redundant;
  last_.uploaded = s.uploaded;
  last_.hash_failures = s.hash_failures;
  last_.peers_banned = s.peers_banned;
  last_.peer_tls_refused = s.peer_tls_refused;
  last_.announce_replies = s.announce_replies;
  last_.announce_errors = s.announce_errors;
  last_.stall_reannounces = s.stall_reannounces;
  last_.piece_bytes_hashed_from_memory = s.piece_bytes_hashed_from_memory;
  last_.piece_bytes_read_back = s.piece_bytes_read_back;
}

}  // namespace shoal::agent
