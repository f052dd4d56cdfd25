#pragma once
// A certificate authority held in memory that signs leaf certificates. Two uses: the node-local
// CA of the HTTPS proxy mode (short-lived leaves for the registry hosts the agent terminates;
// its key stays on the node, read from or created in a file of mode 0600 and never written
// anywhere else or served), and the cluster's peer CA, from which each agent mints its own
// swarm peer certificate at start (lib/tls/peer_tls.h).

#include <utility>

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include <boost/asio/ssl/context.hpp>

#include "lib/core/error.h"

namespace shoal::tls {

// Not thread-safe: use one NodeCa from one thread (the agent's network thread).
class NodeCa {
 public:
  // Leaf certificates are valid this long and minted again when less than a day is left.
  static constexpr std::chrono::hours kLeafValidity{7 * 24};

  // Loads <dir>/ca.crt and <dir>/ca.key, or creates both when neither exists: an ECDSA P-256
  // key (mode 0600, directory 0700) and a self-signed CA certificate valid for 10 years.
  // Errors: kIo naming the path; kInvalidArgument when only one of the files exists, when they
  // do not parse, or when the key does not belong to the certificate.
  // common_name: the CA's subject CN (default "shoal node CA (<hostname>)").
  static Result<std::unique_ptr<NodeCa>> LoadOrCreate(const std::string& dir,
                                                      const std::string& common_name = "");
  // Loads a CA from the given PEM files (e.g. --proxy-ca-cert/--proxy-ca-key). Errors: as
  // LoadOrCreate, plus kInvalidArgument when the certificate is not a CA.
  static Result<std::unique_ptr<NodeCa>> Load(const std::string& cert_file,
                                              const std::string& key_file);
  ~NodeCa();
  NodeCa(const NodeCa&) = delete;
  NodeCa& operator=(const NodeCa&) = delete;

  // The CA certificate (PEM): what clients trust (dockerd's certs.d/<host>/ca.crt).
  const std::string& cert_pem() const { return cert_pem_; }

  // A TLS server context that presents a leaf for host (a DNS name, or an IP literal without
  // brackets) signed by this CA, with the CA in its chain. Leaves are minted in memory on first
  // use (ECDSA P-256, SAN = host) and cached per host. Errors: kInternal when OpenSSL fails.
  Result<std::shared_ptr<boost::asio::ssl::context>> ServerContext(const std::string& host);
  // The PEM certificate of the leaf ServerContext(host) presents (minting it if needed); for
  // tests and diagnostics. Errors: as ServerContext.
  Result<std::string> LeafCertPem(const std::string& host);

  // A new leaf for both TLS roles (serverAuth and clientAuth), CN = common_name, one DNS SAN
  // `dns_name`, valid for `validity`, with a new ECDSA P-256 key; not cached. Errors: kInternal
  // when OpenSSL fails.
  struct IssuedLeaf {
    std::string cert_pem;
    std::string key_pem;
    std::chrono::system_clock::time_point not_after;
  };
  Result<IssuedLeaf> IssueLeaf(const std::string& common_name, const std::string& dns_name,
                               std::chrono::seconds validity);

 private:
  struct Impl;
  struct Leaf;
  explicit NodeCa(std::unique_ptr<Impl> impl);
  Result<const Leaf*> LeafFor(const std::string& host);

  std::unique_ptr<Impl> impl_;
  std::string cert_pem_;
  std::map<std::string, std::unique_ptr<Leaf>> leaves_;  // by host
};

// The first certificate in `file` re-encoded as PEM: the one form in which chunk torrents carry
// the cluster's peer CA (the tracker checks published ones against it). Errors: kIo when the
// file cannot be read, kInvalidArgument when it holds no certificate.
Result<std::string> ReadCertPemFile(const std::string& file);

}  // namespace shoal::tls
