#include "loom/runtime/run_metadata.hpp"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "loom/core/error.hpp"

namespace loom {

std::string run_metadata::chrome_trace() const {
  using nlohmann::json;
  json events = json::array();
  std::map<std::string, int> pid_of;  // one process per device
  for (const auto& n : nodes) {
    auto [it, added] = pid_of.emplace(n.device, static_cast<int>(pid_of.size()) + 1);
    if (added) {
      events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", it->second},
                        {"args", {{"name", n.device}}}});
    }
    events.push_back({{"name", n.node},
                      {"cat", n.op},
                      {"ph", "X"},
                      {"ts", static_cast<double>(n.start_ns) / 1000.0},
                      {"dur", static_cast<double>(n.duration_ns) / 1000.0},
                      {"pid", it->second},
                      {"tid", n.thread},
                      {"args", {{"op", n.op}, {"output_bytes", n.output_bytes}}}});
  }
  json trace = {{"traceEvents", events}, {"displayTimeUnit", "ns"},
                {"otherData", {{"total_ns", total_ns}, {"placement", placement}}}};
  return trace.dump();
}

void run_metadata::write_chrome_trace(const std::string& path) const {
  std::ofstream out(path, std::ios::binary);
  if (!out) throw error("cannot write the trace to '" + path + "'");
  out << chrome_trace();
  if (!out) throw error("writing the trace to '" + path + "' failed");
}

}  // namespace loom
