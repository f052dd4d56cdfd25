#pragma once
// Every verified blob this agent seeds, with its chunk torrents. Persisted beside the cache (one
// JSON file per blob) so that a restarted agent seeds again, and re-published to the tracker
// when it restarts: the tracker keeps no database, the agents are its memory.

#include <utility>

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "agent/tracker_client.h"
#include "lib/core/digest.h"
#include "lib/store/blob_store.h"
#include "lib/swarm/chunk_torrent.h"
#include "lib/swarm/session.h"

namespace shoal::agent {

struct SeedEntry {
  Digest digest;
  BlobSource source;
  swarm::ChunkLayout layout;
  std::vector<std::string> metainfo;  // per chunk, bencoded
};

// Network thread only.
class SeedBook {
 public:
  // dir is created if missing. tracker may be null.
  SeedBook(std::string dir, store::BlobStore& store, swarm::Swarm& swarm, TrackerClient* tracker);

  // Records a verified blob whose chunk torrents are already in the swarm, and persists it.
  void Add(SeedEntry entry);
  // Re-adds every persisted blob still in the store to the swarm as a seed; drops records of
  // blobs no longer cached. Returns how many blobs are seeded.
  size_t Restore();
  // Records chunk k of a blob still being fetched, which this agent now holds and seeds, so that
  // RepublishAll publishes it too. In memory only: a restarted agent deletes unfinished blobs.
  void AddPartial(const Digest& digest, const BlobSource& source, uint32_t k,
                  std::string metainfo);
  // Forgets a fetch's partial chunks once it ended (a committed blob is recorded by Add).
  void DropPartial(const Digest& digest);
  // Publishes (no lease) the chunks of seeded blobs, and those recorded by AddPartial, that the
  // tracker's table lacks: at start, after a replica restart and when a replica stops
  // answering, so the tracker re-learns chunks (of blobs still downloading too) instead of
  // leasing them to upstream again. Only blobs `which` selects (every one when empty), after a
  // random pause in [0, spread). It reads each blob's table first (one call) and publishes only
  // the chunks missing there: 2,500 agents holding the same blob send one read each, not one
  // publish per chunk each.
  boost::asio::awaitable<void> RepublishAll(std::function<bool(const Digest&)> which = {},
                                            std::chrono::milliseconds spread = {});
  // Stops seeding a blob before it leaves the cache: removes its chunk torrents from the swarm,
  // its record and its file. No-op for a blob not in the book.
  void Forget(const Digest& digest);
  bool Has(const Digest& digest) const { return entries_.count(digest.hex()) > 0; }
  size_t size() const { return entries_.size(); }

 private:
  std::string PathOf(const std::string& hex) const;
  Status Seed(const SeedEntry& entry);

  std::string dir_;
  store::BlobStore& store_;
  swarm::Swarm& swarm_;
  TrackerClient* tracker_;
  std::map<std::string, SeedEntry> entries_;  // by digest hex
  struct Partial {
    Digest digest;
    BlobSource source;
    std::map<uint32_t, std::string> metainfo;  // by chunk index
  };
  std::map<std::string, Partial> partials_;  // by digest hex
  bool republishing_ = false;
  bool republish_again_ = false;
};

}  // namespace shoal::agent
