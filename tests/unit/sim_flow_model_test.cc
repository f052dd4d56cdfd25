// shoal-sim's flow model (tests/sim/flow_model.h): max-min fair rates in cases small enough to
// solve by hand, and the spare-capacity rule between two solves.

#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "tests/sim/flow_model.h"

namespace shoal::sim {
namespace {

TEST_CASE("sim flow model: two flows on one link share it equally") {
  FlowModel m;
  LinkId l = m.AddLink(10);
  FlowId a = m.AddFlow({l});
  FlowId b = m.AddFlow({l});
  m.Recompute();
  CHECK(m.rate(a) == doctest::Approx(5));
  CHECK(m.rate(b) == doctest::Approx(5));
  CHECK(m.used(l) == doctest::Approx(10));
}

TEST_CASE("sim flow model: a link's capacity lowered and raised again moves its flows' rates") {
  // The upstream reserve: a node's peer flows also cross a link held at half its downlink while
  // the node fetches upstream. Down = 10; peers P1, P2 cross down and the peer link; U only down.
  FlowModel m;
  LinkId down = m.AddLink(10), peer = m.AddLink(10);
  FlowId p1 = m.AddFlow({down, peer});
  FlowId p2 = m.AddFlow({down, peer});
  FlowId u = m.AddFlow({down});
  m.Recompute();
  CHECK(m.rate(u) == doctest::Approx(10.0 / 3));
  m.SetCapacity(peer, 5);
  CHECK(m.dirty());
  m.Recompute();
  CHECK(m.rate(p1) == doctest::Approx(2.5));
  CHECK(m.rate(p2) == doctest::Approx(2.5));
  CHECK(m.rate(u) == doctest::Approx(5));
  m.SetCapacity(peer, 10);
  m.Recompute();
  CHECK(m.rate(u) == doctest::Approx(10.0 / 3));
}

TEST_CASE("sim flow model: a flow held back elsewhere leaves the rest to the others") {
  // L1 = 10, L2 = 4. A crosses both, B only L1, C only L2. L2 is the bottleneck: A = C = 2;
  // then B takes what A leaves on L1: 8.
  FlowModel m;
  LinkId l1 = m.AddLink(10), l2 = m.AddLink(4);
  FlowId a = m.AddFlow({l1, l2});
  FlowId b = m.AddFlow({l1});
  FlowId c = m.AddFlow({l2});
  m.Recompute();
  CHECK(m.rate(a) == doctest::Approx(2));
  CHECK(m.rate(c) == doctest::Approx(2));
  CHECK(m.rate(b) == doctest::Approx(8));
}

TEST_CASE("sim flow model: one uplink serving a slow and a fast downlink") {
  // A seed's uplink of 10 sends to a node whose downlink is 3 and to one whose downlink is 100:
  // 3 and 7 (max-min, not 5 and 5).
  FlowModel m;
  LinkId up = m.AddLink(10), slow = m.AddLink(3), fast = m.AddLink(100);
  FlowId a = m.AddFlow({up, slow});
  FlowId b = m.AddFlow({up, fast});
  m.Recompute();
  CHECK(m.rate(a) == doctest::Approx(3));
  CHECK(m.rate(b) == doctest::Approx(7));
}

TEST_CASE("sim flow model: a flow's own cap (window / RTT) counts like a link") {
  FlowModel m;
  LinkId l = m.AddLink(10);
  FlowId capped = m.AddFlow({l}, 1);
  FlowId free = m.AddFlow({l});
  m.Recompute();
  CHECK(m.rate(capped) == doctest::Approx(1));
  CHECK(m.rate(free) == doctest::Approx(9));
}

TEST_CASE("sim flow model: the textbook parking lot") {
  // Three links of 1 in a row; a long flow crosses all three, one short flow on each: every
  // flow gets 1/2.
  FlowModel m;
  LinkId l1 = m.AddLink(1), l2 = m.AddLink(1), l3 = m.AddLink(1);
  FlowId lng = m.AddFlow({l1, l2, l3});
  std::vector<FlowId> shorts = {m.AddFlow({l1}), m.AddFlow({l2}), m.AddFlow({l3})};
  m.Recompute();
  CHECK(m.rate(lng) == doctest::Approx(0.5));
  for (FlowId f : shorts) CHECK(m.rate(f) == doctest::Approx(0.5));
}

TEST_CASE("sim flow model: between solves a new flow gets the spare capacity, never more") {
  FlowModel m;
  LinkId l = m.AddLink(10);
  FlowId a = m.AddFlow({l});
  CHECK(m.rate(a) == doctest::Approx(10));  // the link was empty
  CHECK(m.dirty());
  FlowId b = m.AddFlow({l});
  CHECK(m.rate(b) == doctest::Approx(0));  // nothing left until the next solve
  std::vector<FlowId> changed;
  m.Recompute(&changed);
  CHECK_FALSE(m.dirty());
  std::sort(changed.begin(), changed.end());
  CHECK(changed == std::vector<FlowId>{a, b});
  CHECK(m.rate(a) == doctest::Approx(5));
  m.RemoveFlow(a);
  CHECK(m.rate(b) == doctest::Approx(5));  // the freed half waits for the solve
  CHECK(m.used(l) == doctest::Approx(5));
  m.Recompute();
  CHECK(m.rate(b) == doctest::Approx(10));
  CHECK(m.flow_count() == 1);
  FlowId c = m.AddFlow({l});  // reuses a's id
  CHECK(c == a);
  CHECK(m.alive(c));
}

}  // namespace
}  // namespace shoal::sim
