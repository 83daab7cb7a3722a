// replay_report's text and JSON forms (the report itself is in replay.hpp).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "loom/memory/replay.hpp"

namespace loom::memory {
namespace {

// The text form shows at most this many samples (the JSON form has them all).
constexpr std::size_t text_sample_rows = 12;

nlohmann::json stats_json(const std::optional<memory_stats>& s) {
  if (!s) return nullptr;
  return {{"bytes_in_use", s->bytes_in_use},
          {"peak_bytes_in_use", s->peak_bytes_in_use},
          {"total_bytes_allocated", s->total_bytes_allocated},
          {"bytes_reserved", s->bytes_reserved},
          {"peak_bytes_reserved", s->peak_bytes_reserved},
          {"allocations_in_use", s->allocations_in_use},
          {"num_allocs", s->num_allocs},
          {"num_deallocs", s->num_deallocs},
          {"num_failed_allocs", s->num_failed_allocs},
          {"free_bytes", s->free_bytes},
          {"largest_free_block", s->largest_free_block},
          {"unusable_bytes", s->unusable_bytes},
          {"num_regions", s->num_regions},
          {"fragmentation", s->fragmentation()}};
}

nlohmann::json failure_json(const std::optional<replay_failure>& f) {
  if (!f) return nullptr;
  return {{"event", f->event},
          {"seq", f->seq},
          {"line", f->line},
          {"bytes", f->bytes},
          {"alignment", f->alignment},
          {"thread", f->thread},
          {"tag", f->tag},
          {"error", f->error},
          {"refused_by", f->refused_by},
          {"stats", stats_json(f->stats)},
          {"description", f->describe()}};
}

std::string outcome_text(const replay_report& r) {
  std::string text =
      r.ok() ? std::string("ok: every allocate that succeeded in the log succeeded in replay")
             : fmt::format(
                   "FAILED: {} allocate{} that succeeded in the log failed in replay; "
                   "the first:\n            {}",
                   r.failures, r.failures == 1 ? "" : "s", r.first_failure->describe());
  if (r.expected_failures + r.unexpected_successes > 0) {
    text += fmt::format(
        "\n            of the allocates that failed in the log, {} failed again and {} "
        "succeeded",
        r.expected_failures, r.unexpected_successes);
  }
  return text;
}

std::string reserved_text(const replay_report& r) {
  if (r.peak_bytes_reserved == 0) return "the resource reports no reservation";
  return fmt::format("reserved {}, {}", format_bytes(r.peak_bytes_reserved),
                     r.peak_reserved_event
                         ? fmt::format("first seen at event {}", *r.peak_reserved_event)
                         : std::string("held before the first event"));
}

std::string timing_text(const replay_timing& t) {
  std::string text = fmt::format("{:.3f} ms, {:.1f} ns per event",
                                 static_cast<double>(t.total_ns) / 1e6, t.ns_per_event);
  const auto mean = [](double ns, std::size_t timed) {
    return timed == 0 ? std::string("not timed") : fmt::format("~{:.1f} ns", ns);
  };
  if (t.timed_allocates + t.timed_deallocates > 0) {
    text += fmt::format(
        "; allocate {}, deallocate {} (estimated from {} and {} events timed "
        "alone)",
        mean(t.allocate_mean_ns, t.timed_allocates),
        mean(t.deallocate_mean_ns, t.timed_deallocates), t.timed_allocates, t.timed_deallocates);
  }
  return text;
}

std::string samples_text(const std::vector<replay_sample>& samples) {
  std::string text =
      fmt::format("{:>12} {:>12} {:>12} {:>14}", "event", "in use", "reserved", "fragmentation");
  const std::size_t stride = (samples.size() + text_sample_rows - 1) / text_sample_rows;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    if (i % stride != 0 && i + 1 != samples.size()) continue;
    const replay_sample& s = samples[i];
    text += fmt::format("\n            {:>12} {:>12} {:>12} {:>13.1f}%", s.event,
                        format_bytes(s.bytes_in_use), format_bytes(s.bytes_reserved),
                        100.0 * s.fragmentation);
  }
  return text;
}

}  // namespace

std::string replay_report::to_text() const {
  std::string text = fmt::format(
      "events      {} of {} replayed: {} allocations, {} deallocations\n"
      "outcome     {}\n"
      "peak        in use {} at event {}; {}\n"
      "time        {}\n",
      events_replayed, events_total, allocations, deallocations, outcome_text(*this),
      format_bytes(peak_bytes_in_use), peak_in_use_event, reserved_text(*this),
      timing_text(timing));
  if (final_stats) text += fmt::format("final       {}\n", to_string(*final_stats));
  if (!samples.empty()) text += fmt::format("samples     {}\n", samples_text(samples));
  return text;
}

std::string replay_report::to_json() const {
  nlohmann::json samples_array = nlohmann::json::array();
  for (const replay_sample& s : samples) {
    samples_array.push_back({{"event", s.event},
                             {"bytes_in_use", s.bytes_in_use},
                             {"bytes_reserved", s.bytes_reserved},
                             {"largest_free_block", s.largest_free_block},
                             {"fragmentation", s.fragmentation}});
  }
  const nlohmann::json j = {
      {"ok", ok()},
      {"events_total", events_total},
      {"events_replayed", events_replayed},
      {"allocations", allocations},
      {"deallocations", deallocations},
      {"failures", failures},
      {"expected_failures", expected_failures},
      {"unexpected_successes", unexpected_successes},
      {"first_failure", failure_json(first_failure)},
      {"peak_bytes_in_use", peak_bytes_in_use},
      {"peak_in_use_event", peak_in_use_event},
      {"peak_bytes_reserved", peak_bytes_reserved},
      {"peak_reserved_event",
       peak_reserved_event ? nlohmann::json(*peak_reserved_event) : nlohmann::json(nullptr)},
      {"samples", std::move(samples_array)},
      {"final_stats", stats_json(final_stats)},
      {"timing",
       {{"total_ns", timing.total_ns},
        {"ns_per_event", timing.ns_per_event},
        {"allocate_mean_ns", timing.allocate_mean_ns},
        {"deallocate_mean_ns", timing.deallocate_mean_ns},
        {"timed_allocates", timing.timed_allocates},
        {"timed_deallocates", timing.timed_deallocates}}}};
  return j.dump(2);
}

}  // namespace loom::memory
