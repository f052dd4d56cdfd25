#pragma once
// TLS between swarm peers (libtorrent SSL torrents). Every chunk torrent carries the cluster's
// peer CA certificate in its info dict (so the CA is part of its info-hash); libtorrent then
// accepts only peers that present a certificate issued by that CA whose DNS SAN is the torrent's
// name or "*", and refuses plain connections to it. Each agent mints its own certificate from
// the cluster CA at start (CN = its agent id, SAN "*").

#include <chrono>
#include <string>

#include "lib/core/error.h"

namespace shoal::tls {

// What an agent's libtorrent session needs for SSL torrents, all PEM.
struct PeerTls {
  std::string ca_pem;    // the cluster CA certificate, canonical PEM (what chunk torrents carry)
  std::string cert_pem;  // this agent's certificate, issued by the CA
  std::string key_pem;   // its private key
  std::string dh_pem;    // DH parameters (libtorrent requires them): RFC 7919 ffdhe2048
  std::chrono::system_clock::time_point not_after;  // when cert_pem expires
};

// A peer certificate is valid this long; an agent mints a new one at every start.
inline constexpr std::chrono::hours kPeerCertValidity{24 * 365};

// Loads the cluster CA from PEM files and mints this agent's peer certificate (CN =
// common_name) with a new key. Errors: kIo naming an unreadable file; kInvalidArgument when a
// file does not parse, the key is not the certificate's or the certificate is not a CA;
// kInternal when OpenSSL fails.
Result<PeerTls> MintPeerTls(const std::string& ca_cert_file, const std::string& ca_key_file,
                            const std::string& common_name);

// RFC 7919's ffdhe2048 group as PEM "DH PARAMETERS", from OpenSSL (no generation: a named,
// well-known group). Errors: kInternal when OpenSSL fails.
Result<std::string> DhParamsPem();

}  // namespace shoal::tls
