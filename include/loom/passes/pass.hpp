// graph_pass: one graph rewrite, and the record of what it did and what it refused.
//
// A pass sees the plan's graph through a graph_editor, changes it, and says why: every
// rewrite it makes and every candidate it looks at and leaves alone goes into the
// pass_context's log, with the nodes involved and the reason. That log is what
// `loom run --explain-fusion` and session::explain_passes print.
//
// Writing a pass (docs/passes.md, "Writing a pass"):
//
//   class fold_twice final : public graph_pass {
//    public:
//     fold_twice() : graph_pass("fold_twice") {}
//    private:
//     bool do_run(pass_context& ctx) override { ... ctx.rewrote(...); return changed; }
//   };
//
// and list it in standard_passes() (pass_manager.cpp), in the order it should run.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/device_id.hpp"
#include "loom/graph/op_registry.hpp"
#include "loom/passes/amp.hpp"
#include "loom/passes/graph_editor.hpp"

namespace loom::passes {

/// One entry of the passes' log.
struct pass_record {
  enum class kind : std::uint8_t { rewrite, refused };
  std::string pass;
  kind what = kind::rewrite;
  /// The nodes the rewrite replaced, or the candidate's nodes.
  std::vector<std::string> nodes;
  /// What they became ("fused_elementwise 'fused/relu_2' (4 ops)", "const 'mul_3'").
  std::string result;
  /// For a refusal: why (which node, which rule).
  std::string reason;
};
/// "fusion: fused mul_1, add_2, relu_3 -> ..." or "fusion: refused exp_4: ...", one line.
std::string to_string(const pass_record& r);

/// Which passes run, and their limits.
struct pass_options {
  /// false: no pass runs (the plan runs the graph as written, pruned).
  bool enabled = true;
  /// Names of passes switched off (pass_manager::standard_pass_names lists them).
  std::vector<std::string> disabled;
  /// Constant folding leaves results larger than this as they are (a folded constant is
  /// kept for the plan's life; a generator node costs nothing until it runs).
  std::size_t max_folded_bytes = std::size_t{1} << 20;
  /// Element-wise fusion stops a group at this many ops.
  std::size_t max_fused_ops = 64;
  /// conv_layout may keep convolutions' activations in channel blocks (NCHW16c, Note
  /// [channel blocks]) where the CPU computes them so; a session whose devices are not all
  /// CPUs switches it off (only CPU kernels read channel blocks).
  bool channel_blocks = true;
  /// Automatic mixed precision (loom/passes/amp.hpp): off unless amp.type is bfloat16 or
  /// float16.
  amp_options amp;
  /// The device types the plan may place nodes on (the session's devices); empty: any. The
  /// AMP pass looks only at these types' kernels.
  std::vector<device_type> device_types;

  [[nodiscard]] bool runs(std::string_view pass) const;
};

/// Runs a graph to get tensors: what constant folding evaluates constant subgraphs with
/// (the session provides one running on its CPU device). Throws what session::run throws.
using evaluate_fn =
    std::function<std::vector<tensor>(const graph& g, const std::vector<endpoint>& fetches)>;

/// What a pass gets: the graph to edit, the options, an evaluator, and the log.
class pass_context {
 public:
  pass_context(graph_editor& editor, const pass_options& options, evaluate_fn evaluate = {})
      : editor_(editor), options_(options), evaluate_(std::move(evaluate)) {}

  [[nodiscard]] graph_editor& editor() const noexcept { return editor_; }
  [[nodiscard]] const pass_options& options() const noexcept { return options_; }
  /// Empty when no evaluator was given (constant folding then does nothing).
  [[nodiscard]] const evaluate_fn& evaluate() const noexcept { return evaluate_; }
  /// Records a rewrite made by the running pass.
  void rewrote(std::vector<std::string> nodes, std::string result);
  /// Records a candidate the running pass left alone, and why.
  void refused(std::vector<std::string> nodes, std::string reason);
  [[nodiscard]] const std::vector<pass_record>& log() const noexcept { return log_; }
  [[nodiscard]] std::vector<pass_record> take_log() noexcept { return std::move(log_); }

  /// Set by the pass manager around each pass.
  void set_current_pass(std::string name) { current_ = std::move(name); }

 private:
  graph_editor& editor_;
  const pass_options& options_;
  evaluate_fn evaluate_;
  std::string current_;
  std::vector<pass_record> log_;
};

class graph_pass {
 public:
  virtual ~graph_pass() = default;
  graph_pass(const graph_pass&) = delete;
  graph_pass& operator=(const graph_pass&) = delete;

  /// The name by which options switch the pass off and the log names it.
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// Rewrites ctx's graph; true when it changed something. Errors are bugs of the pass or
  /// of the graph (loom::invalid_argument naming the node); a failed pass leaves the plan
  /// unbuilt, not the session.
  bool run(pass_context& ctx) {
    ctx.set_current_pass(name_);
    return do_run(ctx);
  }

 protected:
  explicit graph_pass(std::string name) : name_(std::move(name)) {}

 private:
  virtual bool do_run(pass_context& ctx) = 0;
  std::string name_;
};

}  // namespace loom::passes
