// The dashboard's files (web/), compiled into the binary by
// cmake/embed_web.cmake so that a server needs nothing on disk to serve
// them and `launch` can inline them into report.html.
#pragma once

#include <span>
#include <string_view>

namespace hetps {

struct WebAsset {
  std::string_view path;  // relative to web/, e.g. "dashboard.js"
  std::string_view content_type;
  std::string_view body;
};

std::span<const WebAsset> WebAssets();

}  // namespace hetps
