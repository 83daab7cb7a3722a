#include "loom/passes/pass_manager.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace loom::passes {
namespace {

using factory = std::unique_ptr<graph_pass> (*)();

// The standard pipeline, in order. Cheap clean-ups first, so the pattern passes see
// canonical graphs; pattern fusions before element-wise fusion, which would otherwise
// swallow their element-wise parts; AMP after the pattern fusions (it lowers their fused
// nodes whole) and before conv_layout; dead nodes last.
const std::vector<factory>& standard_factories() {
  static const std::vector<factory> all{
      make_remove_identities,  make_constant_folding,    make_common_subexpressions,
      make_layer_norm_fusion,  make_softmax_xent_fusion, make_epilogue_fusion,
      make_amp,                make_conv_layout,         make_elementwise_fusion,
      make_optimizer_fusion,   make_prune_dead,
  };
  return all;
}

}  // namespace

bool pass_options::runs(std::string_view pass) const {
  return enabled && std::find(disabled.begin(), disabled.end(), pass) == disabled.end();
}

std::string to_string(const pass_record& r) {
  if (r.what == pass_record::kind::rewrite) {
    return fmt::format("{}: rewrote {} -> {}", r.pass, fmt::join(r.nodes, ", "), r.result);
  }
  return fmt::format("{}: refused {}: {}", r.pass, fmt::join(r.nodes, ", "), r.reason);
}

void pass_context::rewrote(std::vector<std::string> nodes, std::string result) {
  log_.push_back({current_, pass_record::kind::rewrite, std::move(nodes), std::move(result), {}});
}

void pass_context::refused(std::vector<std::string> nodes, std::string reason) {
  log_.push_back({current_, pass_record::kind::refused, std::move(nodes), {}, std::move(reason)});
}

std::vector<std::string> pass_manager::standard_pass_names() {
  std::vector<std::string> names;
  for (factory f : standard_factories()) names.push_back(f()->name());
  return names;
}

pass_manager::pass_manager(pass_options options) : options_(std::move(options)) {
  validate(options_.amp);
  const auto names = standard_pass_names();
  for (const auto& d : options_.disabled) {
    if (std::find(names.begin(), names.end(), d) == names.end()) {
      throw invalid_argument(
          fmt::format("no pass named '{}' (passes: {})", d, fmt::join(names, ", ")));
    }
  }
  for (factory f : standard_factories()) {
    auto p = f();
    if (options_.runs(p->name())) passes_.push_back(std::move(p));
  }
}

pass_manager::pass_manager(std::vector<std::unique_ptr<graph_pass>> passes, pass_options options)
    : options_(std::move(options)), passes_(std::move(passes)) {}

pass_result pass_manager::run(const graph& g, const signature& sig,
                              const evaluate_fn& evaluate) const {
  graph_editor editor(g, sig);
  pass_context ctx(editor, options_, evaluate);
  if (options_.enabled) {
    for (const auto& p : passes_) (void)p->run(ctx);
  }
  return {editor.finish(), ctx.take_log()};
}

}  // namespace loom::passes
