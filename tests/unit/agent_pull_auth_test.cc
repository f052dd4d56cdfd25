// The pull_auth verdict cache: lifetimes, bounds, stale lookups and repository contents.
#include <doctest/doctest.h>

#include "agent/pull_auth.h"
#include "lib/core/sha256.h"

namespace shoal::agent {
TEST_SUITE_BEGIN("agent");

namespace {
using Clock = PullAuthCache::Clock;
using std::chrono::seconds;
}  // namespace

TEST_CASE("pull auth cache: public and private verdicts last their own TTLs") {
  PullAuthOptions o;
  o.public_ttl = seconds(600);
  o.private_ttl = seconds(60);
  PullAuthCache cache(o);
  const Clock::time_point t0 = Clock::now();
  CHECK_FALSE(cache.Public("r.io/pub", t0).has_value());
  cache.NotePublic("r.io/pub", true, t0);
  cache.NotePublic("r.io/priv", false, t0);
  CHECK(cache.Public("r.io/pub", t0 + seconds(599)) == true);
  CHECK(cache.Public("r.io/priv", t0 + seconds(59)) == false);
  CHECK_FALSE(cache.Public("r.io/priv", t0 + seconds(60)).has_value());
  CHECK_FALSE(cache.Public("r.io/pub", t0 + seconds(600)).has_value());
  // Expired verdicts are still there for an upstream outage.
  CHECK(cache.LastPublic("r.io/pub") == true);
  CHECK(cache.LastPublic("r.io/priv") == false);
  CHECK_FALSE(cache.LastPublic("r.io/other").has_value());
}

TEST_CASE("pull auth cache: credential verdicts are per credentials and repository") {
  PullAuthCache cache;  // granted 60 s, refused 10 s
  const Clock::time_point t0 = Clock::now();
  const std::string alice = PullAuthCache::CredentialKey({"alice", "s3cret"});
  const std::string wrong = PullAuthCache::CredentialKey({"alice", "wrong"});
  cache.NoteGranted(alice, "r.io/a", true, t0);
  cache.NoteGranted(wrong, "r.io/a", false, t0);
  CHECK(cache.Granted(alice, "r.io/a", t0 + seconds(59)) == true);
  CHECK_FALSE(cache.Granted(alice, "r.io/a", t0 + seconds(60)).has_value());
  CHECK_FALSE(cache.Granted(alice, "r.io/b", t0).has_value());  // another repository
  CHECK(cache.Granted(wrong, "r.io/a", t0 + seconds(9)) == false);
  CHECK_FALSE(cache.Granted(wrong, "r.io/a", t0 + seconds(10)).has_value());
  CHECK(cache.LastGranted(alice, "r.io/a") == true);
}

TEST_CASE("pull auth cache: the credential key is a hash, never the credentials") {
  const std::string key = PullAuthCache::CredentialKey({"alice", "s3cret"});
  CHECK(key.size() == 64);
  CHECK(key.find("alice") == std::string::npos);
  CHECK(key.find("s3cret") == std::string::npos);
  const std::string joined = std::string("alice") + '\0' + "s3cret";
  CHECK(key == Sha256::Of(joined).hex());
  // "a:b" + "c" and "a" + "b:c" are different credentials.
  CHECK(PullAuthCache::CredentialKey({"a", "bc"}) != PullAuthCache::CredentialKey({"ab", "c"}));
}

TEST_CASE("pull auth cache: a full cache drops expired verdicts first, then the soonest to expire") {
  PullAuthOptions o;
  o.max_verdicts = 3;
  o.granted_ttl = seconds(60);
  o.refused_ttl = seconds(10);
  PullAuthCache cache(o);
  const Clock::time_point t0 = Clock::now();
  cache.NoteGranted("k1", "r/a", false, t0);               // expires t0+10
  cache.NoteGranted("k2", "r/a", true, t0);                // t0+60
  cache.NoteGranted("k3", "r/a", true, t0 + seconds(5));   // t0+65
  CHECK(cache.credential_verdicts() == 3);
  cache.NoteGranted("k4", "r/a", true, t0 + seconds(20));  // k1 has expired: it goes
  CHECK(cache.credential_verdicts() == 3);
  CHECK_FALSE(cache.LastGranted("k1", "r/a").has_value());
  cache.NoteGranted("k5", "r/a", true, t0 + seconds(21));  // none expired: k2 (soonest) goes
  CHECK(cache.credential_verdicts() == 3);
  CHECK_FALSE(cache.LastGranted("k2", "r/a").has_value());
  CHECK(cache.Granted("k3", "r/a", t0 + seconds(21)) == true);
  CHECK(cache.Granted("k5", "r/a", t0 + seconds(21)) == true);
  // Updating a held key needs no room.
  cache.NoteGranted("k3", "r/a", false, t0 + seconds(22));
  CHECK(cache.credential_verdicts() == 3);
  CHECK(cache.Granted("k3", "r/a", t0 + seconds(22)) == false);
}

TEST_CASE("pull auth cache: repository contents are per repository and bounded oldest first") {
  PullAuthOptions o;
  o.max_digests = 4;
  PullAuthCache cache(o);
  const Digest d1 = Sha256::Of(std::string("1")), d2 = Sha256::Of(std::string("2")),
               d3 = Sha256::Of(std::string("3")), d4 = Sha256::Of(std::string("4"));
  cache.NoteContents("r/a", {d1, d2});
  cache.NoteContents("r/b", {d3});
  CHECK(cache.Contains("r/a", d1));
  CHECK_FALSE(cache.Contains("r/b", d1));  // a blob of a is not b's
  CHECK(cache.digests() == 3);
  cache.NoteContents("r/a", {d1, d2});  // again: counted once
  CHECK(cache.digests() == 3);
  // Over the bound: r/a (recorded first) goes; the repository just recorded stays.
  cache.NoteContents("r/c", {d3, d4});
  CHECK_FALSE(cache.Contains("r/a", d1));
  CHECK(cache.Contains("r/b", d3));
  CHECK(cache.Contains("r/c", d4));
  CHECK(cache.digests() == 3);
  // One repository bigger than the bound is kept whole rather than forgotten while recorded.
  cache.NoteContents("r/b", {d1, d2, d4});
  CHECK(cache.Contains("r/b", d4));
  CHECK_FALSE(cache.Contains("r/c", d4));
}

TEST_SUITE_END();
}  // namespace shoal::agent
