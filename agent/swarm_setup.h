#pragma once
// The agent's swarm options from its flags: the listen address (resolving "auto" to the node's
// own address) and peer TLS (minting this agent's peer certificate from the cluster CA).

#include <string>

#include "agent/config.h"
#include "lib/core/error.h"
#include "lib/http/url.h"
#include "lib/swarm/session.h"

namespace shoal::agent {

// "auto:PORT" becomes "<the local address the kernel picks to reach tracker>:PORT" (no packet
// is sent: a connected UDP socket's own address); any other listen address is returned as is.
// Errors: kUnavailable when the tracker's host does not resolve or is unreachable (no route),
// kInvalidArgument for a listen address that is not IP:PORT.
Result<std::string> ResolveSwarmListen(const std::string& listen, const http::Url& tracker);

// SwarmOptions for this agent (agent_id names its peer certificate). Peer TLS needs both
// --peer-ca-cert and --peer-ca-key; without them the swarm only starts with --insecure-peers.
// Errors: kInvalidArgument for a missing or half-given peer CA, ResolveSwarmListen's and
// tls::MintPeerTls's errors.
Result<swarm::SwarmOptions> MakeSwarmOptions(const AgentConfig& config, const http::Url& tracker,
                                             const std::string& agent_id);

}  // namespace shoal::agent
