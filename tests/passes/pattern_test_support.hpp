// Test support for the pattern-fusion tests (layer_norm, softmax_xent, epilogue, optimizer):
// random inputs, values as doubles, sessions with a pass switched off, and queries of the
// planned graph and the passes' log. Header-only, so the other tests of tests/passes link
// nothing of it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/half.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/passes/pass.hpp"
#include "loom/runtime/session.hpp"

namespace loom::testing {

/// A host tensor of `t` (f32, f64, f16, bf16, i32 or i64) holding `v` converted from double
/// (rounded to t through float for f16 / bf16).
inline tensor make_tensor(dtype t, const shape& s, const std::vector<double>& v) {
  EXPECT_EQ(static_cast<std::int64_t>(v.size()), s.num_elements());
  tensor out = memory::host_tensor(t, s);
  for (std::size_t i = 0; i < v.size(); ++i) {
    switch (t) {
      case dtype::f32:
        out.data<float>()[i] = static_cast<float>(v[i]);
        break;
      case dtype::f64:
        out.data<double>()[i] = v[i];
        break;
      case dtype::f16:
        out.data<half>()[i] = half(static_cast<float>(v[i]));
        break;
      case dtype::bf16:
        out.data<bfloat16>()[i] = bfloat16(static_cast<float>(v[i]));
        break;
      case dtype::i32:
        out.data<std::int32_t>()[i] = static_cast<std::int32_t>(v[i]);
        break;
      case dtype::i64:
        out.data<std::int64_t>()[i] = static_cast<std::int64_t>(v[i]);
        break;
      default:
        ADD_FAILURE() << "make_tensor: unsupported dtype " << to_string(t);
    }
  }
  return out;
}

/// `count` values drawn uniformly from [lo, hi).
inline std::vector<double> uniform(std::mt19937& rng, std::int64_t count, double lo = -2.0,
                                   double hi = 2.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<std::size_t>(count));
  for (auto& x : v) x = dist(rng);
  return v;
}

/// The values rounded to `t` (what a tensor of t holds), so references start from the
/// same inputs as the graph.
inline std::vector<double> rounded(dtype t, std::vector<double> v) {
  if (t == dtype::f32) {
    for (auto& x : v) x = static_cast<double>(static_cast<float>(x));
  }
  return v;
}

/// The elements of `x` (f32, f64, i32, i64, bool; any strides) as doubles, row-major.
inline std::vector<double> values(const tensor& x) {
  const auto n = static_cast<std::size_t>(x.num_elements());
  std::vector<double> out(n);
  auto read = [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> buf(n);
    if (n > 0) copy_to_dense(x, buf.data());
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<double>(buf[i]);
  };
  switch (x.type()) {
    case dtype::f32:
      read(float{});
      break;
    case dtype::f64:
      read(double{});
      break;
    case dtype::i32:
      read(std::int32_t{});
      break;
    case dtype::i64:
      read(std::int64_t{});
      break;
    default:
      ADD_FAILURE() << "values: unsupported dtype " << to_string(x.type());
  }
  return out;
}

/// Expects |a - e| <= atol + rtol * |e| element-wise (and equal sizes).
inline void expect_near_all(const std::vector<double>& actual, const std::vector<double>& expected,
                            double rtol, double atol, const std::string& what = "") {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], atol + rtol * std::abs(expected[i]))
        << what << " at element " << i;
  }
}

/// Tolerances for results against a float64 reference.
inline double rtol_of(dtype t) {
  return t == dtype::f64 ? 1e-10 : 2e-4;
}
inline double atol_of(dtype t) {
  return t == dtype::f64 ? 1e-10 : 2e-5;
}

/// Session options with the given passes switched off.
inline session_options without(std::vector<std::string> passes) {
  session_options o;
  o.passes.disabled = std::move(passes);
  return o;
}

/// How many nodes of `op` the graph holds.
inline std::size_t count_op(const graph& g, std::string_view op) {
  return static_cast<std::size_t>(std::count_if(g.nodes().begin(), g.nodes().end(),
                                                [&](const node& n) { return n.op() == op; }));
}

/// A node of a planned graph, as the tests look at it (a copy of the graph itself would hold
/// constants that the session's constant folding allocated from its device, past the
/// session's end).
struct planned_node {
  std::string name;
  std::string op;
  /// The ops of the nodes it waits for (control inputs).
  std::vector<std::string> waits_for;
};

/// What the tests keep of a planned graph.
inline std::vector<planned_node> describe(const graph& g) {
  std::vector<planned_node> out;
  for (const node& n : g.nodes()) {
    planned_node p{n.name, n.op(), {}};
    for (node_id c : n.control_inputs) p.waits_for.push_back(g.at(c).op());
    out.push_back(std::move(p));
  }
  return out;
}

inline std::size_t count_op(const std::vector<planned_node>& g, std::string_view op) {
  return static_cast<std::size_t>(
      std::count_if(g.begin(), g.end(), [&](const planned_node& n) { return n.op == op; }));
}

/// The node named `name` (a test failure and an empty node when there is none).
inline planned_node node_named(const std::vector<planned_node>& g, std::string_view name) {
  for (const auto& n : g) {
    if (n.name == name) return n;
  }
  ADD_FAILURE() << "no node named " << name;
  return {};
}

/// The log, one line per record, for failure messages.
inline std::string log_text(const std::vector<passes::pass_record>& log) {
  std::string s;
  for (const auto& r : log) s += "  " + passes::to_string(r) + "\n";
  return s;
}

/// The records of `pass` of kind `what` whose result or reason contains every one of
/// `parts`.
inline std::vector<passes::pass_record> records(const std::vector<passes::pass_record>& log,
                                                std::string_view pass,
                                                passes::pass_record::kind what,
                                                const std::vector<std::string>& parts = {}) {
  std::vector<passes::pass_record> out;
  for (const auto& r : log) {
    if (r.pass != pass || r.what != what) continue;
    const std::string& text = what == passes::pass_record::kind::rewrite ? r.result : r.reason;
    bool all = true;
    for (const auto& p : parts) all = all && text.find(p) != std::string::npos;
    if (all) out.push_back(r);
  }
  return out;
}

inline std::size_t rewrites(const std::vector<passes::pass_record>& log, std::string_view pass) {
  return records(log, pass, passes::pass_record::kind::rewrite).size();
}

/// True when some refusal of `pass` gives a reason containing every one of `parts`.
inline bool refused_with(const std::vector<passes::pass_record>& log, std::string_view pass,
                         const std::vector<std::string>& parts) {
  return !records(log, pass, passes::pass_record::kind::refused, parts).empty();
}

/// A message of the loom::error `f` throws ("no error" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.what();
  }
  return "no error";
}

/// A host copy of `t` (fetched tensors live in the session's pools, which go with it).
inline tensor detach(const tensor& t) {
  tensor out = memory::host_tensor(t.type(), t.shape());
  if (t.num_elements() > 0) copy_to_dense(t, out.raw_data());
  return out;
}

/// Host copies of `ts`.
inline std::vector<tensor> detach(const std::vector<tensor>& ts) {
  std::vector<tensor> out;
  for (const auto& t : ts) out.push_back(detach(t));
  return out;
}

/// One graph run with every pass, and with `pass` switched off.
struct compared {
  /// The fetches (host copies).
  std::vector<tensor> on;
  std::vector<tensor> off;
  /// The log of the run with every pass.
  std::vector<passes::pass_record> log;
  /// The graph that run's plan ran.
  std::vector<planned_node> planned;
};

/// Runs `g` twice, in two sessions made with `base`: once as it is, once with `pass` off.
inline compared run_both(const graph& g, const std::string& pass, const std::vector<feed>& feeds,
                         const std::vector<std::string>& fetches,
                         const std::vector<std::string>& targets = {},
                         const session_options& base = {}) {
  std::vector<std::string> names;
  for (const auto& f : feeds) names.push_back(f.first);
  compared c;
  session on(g, base);
  c.on = detach(on.run(feeds, fetches, targets));
  c.log = on.explain_passes(names, fetches, targets);
  c.planned = describe(on.planned_graph(names, fetches, targets));
  session_options o = base;
  o.passes.disabled.push_back(pass);
  session off(g, o);
  c.off = detach(off.run(feeds, fetches, targets));
  return c;
}

}  // namespace loom::testing
