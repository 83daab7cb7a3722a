// Small queries the passes share (src/passes only).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/kernel/kernel_registry.hpp"
#include "loom/passes/graph_editor.hpp"

namespace loom::passes {

/// A hash of endpoints, for the passes' maps keyed by value.
struct endpoint_hash {
  std::size_t operator()(endpoint e) const noexcept {
    return std::hash<std::int64_t>()((static_cast<std::int64_t>(e.node) << 20) ^ e.index);
  }
};

/// When `e` is a constant whose elements all equal one value (a scalar, or a filled
/// tensor of at most `max_elements`), that value as a double; else nullopt.
std::optional<double> uniform_constant(const graph_editor& ed, endpoint e,
                                       std::int64_t max_elements = 1 << 16);

/// True when both nodes ask for the same device (both none included). Rewrites that merge
/// or drop nodes require it before placement: a request is the user's word.
bool same_request(const node& a, const node& b);

/// Every output of `id` is unread and unfetched, and nothing waits for it.
bool unused(const graph_editor& ed, node_id id);

/// The input of binary node `id` that is not `known`, when `known` is one of its inputs.
std::optional<endpoint> other_input(const graph_editor& ed, node_id id, endpoint known);

/// The names of nodes, for the log.
std::vector<std::string> names_of(const graph_editor& ed, const std::vector<node_id>& ids);

/// Both shapes known and equal.
bool same_known_shape(const std::optional<shape>& a, const std::optional<shape>& b);

// ---- for the pattern fusions (layer_norm, softmax_xent, epilogue, optimizer) ----------

/// The device type a request names ("/device:CPU:1" -> cpu), or nullopt for none (or a
/// malformed one, which the placer reports).
std::optional<device_type> requested_type(const std::string& request);

/// The kernels of `op` (kernel_registry::global()) that take the type attributes `types`, on
/// the device type `request` names (any when it names none) and, when `device_types` is not
/// empty, on one of those.
std::vector<const kernel_def*> fitting_kernels(std::string_view op,
                                               const std::vector<std::pair<std::string, dtype>>& types,
                                               const std::string& request,
                                               const std::vector<device_type>& device_types = {});

/// Why no kernel runs `op` with the type attributes `types` (such as {{"T", f32}}) on the
/// device type that `request` names, or on any device type when it names none; nullopt
/// when one does. Looks in kernel_registry::global(), which the session uses.
std::optional<std::string> missing_kernel(std::string_view op,
                                          const std::vector<std::pair<std::string, dtype>>& types,
                                          const std::string& request);

/// Who reads `e` besides the nodes of `inside`: "'name'" of a reader outside, "a fetch",
/// or "'name' (a control edge)" for a node waiting for e's node; nullopt when nothing does.
/// What a pattern fusion checks for each of its interior values.
std::optional<std::string> outside_reader(const graph_editor& ed, endpoint e,
                                          const std::vector<node_id>& inside);

/// The refusal reason for an interior value read outside its pattern, with the usual cause
/// (gradients() built before the passes ran) and what to do about it: `fused_builder` is the
/// builder that gives the fused op directly ("ops::layer_norm").
std::string read_outside_reason(const graph_editor& ed, endpoint e, const std::string& reader,
                                std::string_view fused_builder);

/// True when a path of data or control edges leads from `from` to `to` (from != to).
bool reaches(const graph_editor& ed, node_id from, node_id to);

}  // namespace loom::passes
