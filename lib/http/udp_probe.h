#pragma once
// Whether a tracker replica's UDP announce port answers (a BEP 15 connect). The agent checks once
// at its start, before any chunk torrent announces: where a firewall or NetworkPolicy lets TCP
// through but not UDP, it announces to that replica over HTTP from the start instead of waiting
// out UDP timeouts (during which its chunk fetches would find no peers). `shoalctl doctor` checks
// the same from a node.

#include <chrono>

#include "lib/http/url.h"

namespace shoal::http {

enum class UdpReach {
  kAnswers,  // the BEP 15 connect was answered
  kTcpOnly,  // no UDP answer, but a TCP connection to the same host and port opens
  kNeither,  // nothing answers (the replica is down or unresolvable): no verdict on UDP
};

// Sends up to `tries` BEP 15 connects to tracker's host and port, waiting `wait` for an answer
// after each, then (without one) opens a TCP connection there within `wait`. Blocking.
UdpReach ProbeUdpAnnounce(const Url& tracker, int tries, std::chrono::milliseconds wait);

}  // namespace shoal::http
