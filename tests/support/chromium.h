#pragma once
// Headless chromium (Debian's `chromium`) for tests and programs that check a web page as a
// browser shows it: the DOM after the page's scripts ran, and screenshots.

#include <string>

#include "lib/core/error.h"

namespace shoal::testkit {

// Renders `url` in headless chromium in a window of width x height, with a profile in
// profile_dir (created if missing; pass one per caller), giving the page's scripts 6 s of virtual
// time, and returns the DOM they left (--dump-dom; chromium's stderr lines come with it). With
// `png`, the same rendering is also saved there as a screenshot (one chromium run does both).
// Errors: as RunCommand (chromium missing, exit status, a timeout of 90 s).
Result<std::string> RenderPage(const std::string& profile_dir, const std::string& url, int width,
                               int height, const std::string& png = "");

// The data-value attribute of the element with this id in a dumped DOM ("" when absent).
std::string PageValue(const std::string& dom, const std::string& id);

}  // namespace shoal::testkit
