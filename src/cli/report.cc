#include "cli/report.h"

#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "metrics/web_assets.h"

namespace hetps {
namespace {

using nlohmann::json;

// Appends `value` to the column `path`, first padding it with nulls up to
// `index` (a series that appears late, or was missing at some samples).
void Put(json& column, size_t index, json value) {
  if (!column.is_array()) column = json::array();
  while (column.size() < index) column.push_back(nullptr);
  column.push_back(std::move(value));
}

std::string Asset(std::string_view path) {
  for (const WebAsset& asset : WebAssets()) {
    if (asset.path == path) return std::string(asset.body);
  }
  return {};
}

// Text safe inside <script>: no "</" that could close it.
std::string ScriptSafe(const std::string& text) {
  return absl::StrReplaceAll(text, {{"</", "<\\/"}});
}

}  // namespace

void JobTimeline::Add(double t_s, const rpc::StatusResponse& status) {
  const size_t i = samples_++;
  columns_["t"].push_back(t_s);
  columns_["window"].push_back(status.window());
  json& workers = columns_["workers"];
  for (const rpc::WorkerStatus& w : status.workers()) {
    json& c = workers[std::to_string(w.rank())];
    const rpc::WorkerProgress& p = w.progress();
    Put(c["samples_per_s"], i, p.samples_per_s());
    Put(c["busy"], i, p.busy_fraction());
    Put(c["batch"], i, p.batch_size());
    if (sent_bytes_.size() <= w.rank()) sent_bytes_.resize(w.rank() + 1, 0);
    if (p.sent_bytes() > sent_bytes_[w.rank()] && !p.codec().empty()) {
      codec_total_[p.codec()] += p.sent_bytes() - sent_bytes_[w.rank()];
      sent_bytes_[w.rank()] = p.sent_bytes();
    }
  }
  for (const rpc::ServerStatus& s : status.servers()) {
    if (!s.reachable()) continue;
    Put(columns_["servers"][std::to_string(s.rank())]["queue"], i,
        s.stats().queue_length());
  }
  for (const auto& [codec, bytes] : codec_total_) {
    Put(columns_["codec_bytes"][codec], i, bytes);
  }
}

json JobTimeline::ToJson() const { return columns_; }

absl::Status WriteReport(const std::string& path, const JobTimeline& timeline,
                         const json& summary, const std::string& config_text) {
  const json data = {{"timeline", timeline.ToJson()},
                     {"summary", summary},
                     {"config", config_text}};
  std::string html = Asset("report.html");
  html = absl::StrReplaceAll(
      html,
      {{"/*UPLOT_CSS*/", Asset("vendor/uplot/uPlot.min.css")},
       {"/*UPLOT_JS*/", ScriptSafe(Asset("vendor/uplot/uPlot.iife.min.js"))},
       {"/*REPORT_JS*/", ScriptSafe(Asset("report.js"))},
       {"/*DATA*/", ScriptSafe(data.dump())}});
  std::ofstream out(path);
  out << html;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace hetps
