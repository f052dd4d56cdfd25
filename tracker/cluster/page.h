#pragma once
// The tracker's live cluster page (GET /ui): one self-contained HTML document (inline CSS and
// script, no external assets) that asks for an operator token, then polls GET /v1/cluster every
// 2 s and redraws: upstream leases against the cap, blobs by repository with their spread over
// the nodes, prefetch jobs with their slowest nodes, agents that stopped polling.

#include <string_view>

namespace shoal::tracker {

// The page, a static string.
std::string_view ClusterPageHtml();

}  // namespace shoal::tracker
