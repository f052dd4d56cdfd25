#include <doctest/doctest.h>

#include "registry-shim/link.h"

namespace shoal::shim {

TEST_CASE("shim link: a relative upstream link points at the client's path, query kept") {
  // distribution 3 and Docker Hub send relative links naming the upstream repository.
  auto r = RewriteLink(R"(</v2/library/busybox/tags/list?last=1.36&n=2>; rel="next")",
                       "/v2/docker.io/busybox/tags/list", std::nullopt);
  REQUIRE(r.has_value());
  CHECK(*r == R"(</v2/docker.io/busybox/tags/list?last=1.36&n=2>; rel="next")");
}

TEST_CASE("shim link: the upstream host of an absolute link is rewritten out, ns added back") {
  auto r =
      RewriteLink(R"(<https://mirror.internal:5000/v2/proj/img/tags/list?n=10&last=b>;rel="next")",
                  "/v2/proj/img/tags/list", std::string("gcr.io:443"));
  REQUIRE(r.has_value());
  CHECK(*r == R"(</v2/proj/img/tags/list?n=10&last=b&ns=gcr.io%3A443>;rel="next")");
  CHECK(r->find("mirror.internal") == std::string::npos);
}

TEST_CASE("shim link: several links, quoted commas in parameters, and junk") {
  auto r = RewriteLink(R"(<http://u/v2/a/tags/list?n=1&last=x>; rel="next"; title="a,b" , )"
                       R"(<http://u/v2/a/tags/list?n=1>; rel="first")",
                       "/v2/r/a/tags/list", std::nullopt);
  REQUIRE(r.has_value());
  CHECK(*r == R"(</v2/r/a/tags/list?n=1&last=x>; rel="next"; title="a,b", )"
              R"(</v2/r/a/tags/list?n=1>; rel="first")");
  CHECK_FALSE(RewriteLink("", "/v2/a/tags/list", std::nullopt).has_value());
  CHECK_FALSE(RewriteLink("no link here", "/v2/a/tags/list", std::nullopt).has_value());
  CHECK_FALSE(RewriteLink("<http://u/v2/a/tags/list?n=1", "/v2/a/tags/list", std::nullopt));
  CHECK_FALSE(RewriteLink("<http://u/x?a=\"b>; rel=next", "/v2/a/tags/list", std::nullopt));
  // No query upstream: the client's path alone.
  CHECK(RewriteLink("</v2/a/tags/list>; rel=\"next\"", "/v2/b/tags/list", std::nullopt).value() ==
        "</v2/b/tags/list>; rel=\"next\"");
}

}  // namespace shoal::shim
