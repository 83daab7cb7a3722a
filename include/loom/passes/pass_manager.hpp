// pass_manager: runs loom's graph passes, in order, on the part of a graph that one
// (feeds, fetches, targets) signature needs, before placement.
//
// The standard pipeline (docs/passes.md describes each):
//   1. remove_identities      identity nodes and no-op arithmetic (x * 1, reshape to the same
//   shape)
//   2. constant_folding       subgraphs of constants evaluated once, on the CPU
//   3. common_subexpressions  equal nodes on equal inputs computed once
//   4. layer_norm_fusion      mean / variance / normalize / scale / shift -> layer_norm
//   5. softmax_xent_fusion    -sum(one_hot(labels) * log_softmax(logits)) -> softmax_cross_entropy
//   6. epilogue_fusion        matmul / conv2d + bias + residual + activation -> one oneDNN
//   primitive
//   7. amp                    with pass_options::amp on: matrix products and convolutions in
//                             bfloat16 / float16, casts at the boundaries (loom/passes/amp.hpp)
//   8. conv_layout            float32 / bfloat16 convolutions in NHWC between transposes,
//                             transposes that undo each other dropped
//   9. elementwise_fusion     maximal groups of element-wise ops -> fused_elementwise
//  10. optimizer_fusion       per-variable apply_adam / adamw / sgd -> one multi-tensor update
//  11. prune_dead             nodes nothing reads any more
// The session runs it when it builds a plan (session_options::passes switches passes off);
//
// Thread-safe: a manager is immutable; each run has its own editor and log.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/passes/graph_editor.hpp"
#include "loom/passes/pass.hpp"

namespace loom::passes {

/// What a run of the passes produced.
struct pass_result {
  rewritten_graph rewritten;
  /// Every rewrite made and every candidate refused, in order.
  std::vector<pass_record> log;
};

class pass_manager {
 public:
  /// The standard pipeline, less the passes `options` switches off. Throws
  /// loom::invalid_argument for an unknown pass name in options.disabled, and as
  /// validate(options.amp).
  explicit pass_manager(pass_options options = {});
  /// A pipeline of the caller's passes (run in order), with `options`' limits.
  pass_manager(std::vector<std::unique_ptr<graph_pass>> passes, pass_options options);

  /// The names of the standard passes, in the order they run.
  [[nodiscard]] static std::vector<std::string> standard_pass_names();

  /// Copies what `sig` needs of `g`, runs the passes, and returns the compact result.
  /// `evaluate` lets constant folding run kernels (empty: no folding).
  [[nodiscard]] pass_result run(const graph& g, const signature& sig,
                                const evaluate_fn& evaluate = {}) const;

  [[nodiscard]] const pass_options& options() const noexcept { return options_; }

 private:
  pass_options options_;
  std::vector<std::unique_ptr<graph_pass>> passes_;
};

/// The standard passes, each made fresh (their factories live beside them, in src/passes/).
std::unique_ptr<graph_pass> make_remove_identities();
std::unique_ptr<graph_pass> make_constant_folding();
std::unique_ptr<graph_pass> make_common_subexpressions();
std::unique_ptr<graph_pass> make_layer_norm_fusion();
std::unique_ptr<graph_pass> make_softmax_xent_fusion();
std::unique_ptr<graph_pass> make_epilogue_fusion();
std::unique_ptr<graph_pass> make_amp();
std::unique_ptr<graph_pass> make_conv_layout();
std::unique_ptr<graph_pass> make_elementwise_fusion();
std::unique_ptr<graph_pass> make_optimizer_fusion();
std::unique_ptr<graph_pass> make_prune_dead();

}  // namespace loom::passes
