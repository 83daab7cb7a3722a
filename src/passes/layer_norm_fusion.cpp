// layer_norm_fusion: layer normalisation written out in primitives becomes one layer_norm
// node (one pass over each row, the statistics kept in registers).
//
// Matches, for x of a float dtype with a known rank r and known dims [a, r), reducing over
// the trailing dims [a, r) (axes given negative or positive, in any order; an empty list
// is every dim):
//   mean = reduce_mean(x, axes, keepdims)        d = sub(x, mean)
//   var  = reduce_mean(square(d) | mul(d, d), the same axes, keepdims)
//   y0   = mul(d, rsqrt(add(var, eps)))  or  div(d, sqrt(add(var, eps)))
//   y1   = mul(y0, gamma)                          (optional)
//   y2   = add(y1 | y0, beta)                      (optional)
// with either operand order of every add and mul, and eps a constant whose elements all
// equal one value >= 0 (uniform_constant) that does not broadcast var. gamma and beta must
// have the shape x.shape[a:], or that shape with leading 1s ([1, C]), which holds the same
// elements and is reshaped; a missing gamma or beta becomes a `ones` or `zeros` node of
// that shape. The match becomes layer_norm(x, gamma, beta, axis = a, epsilon = eps), whose
// output 0 replaces the last matched value (its readers, fetches, control readers and
// target). Common subexpressions run before, so `x - mean` written twice is one node.
//
// Refuses, logging the reason (and leaves the graph as written):
//   - an interior value (mean, d, the square, var, var + eps, its (r)sqrt) read outside
//     the pattern, fetched, or waited for: the fused node does not produce it. The usual
//     cause is gradients() having built the backward graph before the passes ran; the
//     reason says so (build with ops::layer_norm, or run the passes before gradients);
//   - a node of the match asking for another device than the first reduce_mean (a request
//     is the user's word), waiting for another node (a control input), or a signature
//     target that is not the last value;
//   - eps that broadcasts var to a larger shape, or is negative;
//   - float16 and bfloat16 (Note [layer_norm in 16 bits]);
//   - a dtype that no layer_norm kernel takes on the requested device type.
//
// Note [layer_norm in 16 bits]
// A pass never changes an answer (docs/passes.md). layer_norm's kernels compute the mean
// and variance of a float16 / bfloat16 row in float32 and round only y; the primitives
// round the mean, each d, each square, the variance and rsqrt to the type, as their own
// kernels store them. Beyond the roundings, float16's range decides results: a d past 256
// squares to inf, the variance is inf, rsqrt is 0 and the unfused y is beta, where
// layer_norm gives the normalised row. So 16-bit primitives stay as written (element-wise
// fusion still takes their element-wise parts, rounding as they do); ops::layer_norm is
// there for float32 statistics. float32 and float64 fuse: the kernel's statistics are
// the same sums in another order (within the tolerances of docs/passes.md).
// Where only the scale or the shift does not fit (gamma or beta of another shape, which
// broadcasts and so is not layer_norm's gamma; y0 or y1 also read elsewhere; another device
// request), the match stops before it, that step is logged as refused, and the rest fuses.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "loom/passes/pass_manager.hpp"
#include "pass_util.hpp"

namespace loom::passes {
namespace {

// The first reader of `e` that `pred` accepts.
template <class Pred>
std::optional<node_id> reader(const graph_editor& ed, endpoint e, Pred pred) {
  for (const use& u : ed.uses(e)) {
    if (ed.alive(u.node) && pred(u.node)) return u.node;
  }
  return std::nullopt;
}

// The reduced axes of reduce_mean `id` as [a, rank) when they are the trailing dims.
std::optional<std::int64_t> trailing_axis(const graph_editor& ed, node_id id, std::size_t rank) {
  const node& n = ed.at(id);
  if (!n.attr<bool>("keepdims")) return std::nullopt;
  const auto axes = n.attr<std::vector<std::int64_t>>("axes");
  if (axes.empty()) return 0;
  std::vector<bool> reduced(rank, false);
  const auto r = static_cast<std::int64_t>(rank);
  for (std::int64_t a : axes) {
    if (a < -r || a >= r) return std::nullopt;
    reduced[static_cast<std::size_t>(a < 0 ? a + r : a)] = true;
  }
  std::size_t first = rank;
  while (first > 0 && reduced[first - 1]) --first;
  for (std::size_t k = 0; k < first; ++k) {
    if (reduced[k]) return std::nullopt;  // not a trailing block
  }
  if (first == rank) return std::nullopt;
  return static_cast<std::int64_t>(first);
}

struct match {
  endpoint x;
  std::int64_t axis = 0;
  shape normalized;  // x.shape[axis:]
  double eps = 0.0;
  node_id anchor = -1;
  // mean, d, square, var, var + eps, (r)sqrt, y0: the core, in order.
  std::vector<node_id> core;
  std::optional<endpoint> gamma;
  std::optional<endpoint> beta;
  node_id scale = -1;  // y1
  node_id shift = -1;  // y2
};

class layer_norm_fusion final : public graph_pass {
 public:
  layer_norm_fusion() : graph_pass("layer_norm_fusion") {}

 private:
  // The structure of the core from reduce_mean `m`, without the rules about readers and
  // devices; nullopt when `m` does not start a layer normalisation.
  static std::optional<match> find_core(const graph_editor& ed, node_id m) {
    const node& mn = ed.at(m);
    if (mn.op() != "reduce_mean" || !is_floating(mn.outputs[0].type)) return std::nullopt;
    const endpoint x = ed.inputs(m)[0];
    const auto& xs = ed.type_of(x).shape;
    if (!xs || xs->rank() == 0) return std::nullopt;
    const std::size_t rank = xs->rank();
    const auto axis = trailing_axis(ed, m, rank);
    if (!axis) return std::nullopt;
    const endpoint mean{m, 0};
    const auto d = reader(ed, mean, [&](node_id r) {
      const auto& in = ed.inputs(r);
      return ed.at(r).op() == "sub" && in[0] == x && in[1] == mean;
    });
    if (!d) return std::nullopt;
    const endpoint dv{*d, 0};
    const auto sq = reader(ed, dv, [&](node_id r) {
      const auto& in = ed.inputs(r);
      return ed.at(r).op() == "square" || (ed.at(r).op() == "mul" && in[0] == dv && in[1] == dv);
    });
    if (!sq) return std::nullopt;
    const auto var = reader(ed, {*sq, 0}, [&](node_id r) {
      return ed.at(r).op() == "reduce_mean" && trailing_axis(ed, r, rank) == axis;
    });
    if (!var) return std::nullopt;
    const endpoint vv{*var, 0};
    std::optional<double> eps;
    const auto ve = reader(ed, vv, [&](node_id r) {
      if (ed.at(r).op() != "add") return false;
      const auto e = other_input(ed, r, vv);
      if (!e || *e == vv) return false;
      eps = uniform_constant(ed, *e);
      return eps.has_value();
    });
    if (!ve) return std::nullopt;
    const endpoint vev{*ve, 0};
    // rsqrt then mul, or sqrt then div.
    std::optional<node_id> y0;
    const auto rs = reader(ed, vev, [&](node_id r) {
      const std::string& op = ed.at(r).op();
      if (op != "rsqrt" && op != "sqrt") return false;
      const endpoint rv{r, 0};
      y0 = reader(ed, rv, [&](node_id q) {
        const auto& in = ed.inputs(q);
        if (op == "rsqrt") return ed.at(q).op() == "mul" && other_input(ed, q, rv) == dv;
        return ed.at(q).op() == "div" && in[0] == dv && in[1] == rv;
      });
      return y0.has_value();
    });
    if (!rs) return std::nullopt;
    match mt;
    mt.x = x;
    mt.axis = *axis;
    for (std::size_t k = static_cast<std::size_t>(*axis); k < rank; ++k)
      mt.normalized.push_back((*xs)[k]);
    mt.eps = *eps;
    mt.anchor = m;
    mt.core = {m, *d, *sq, *var, *ve, *rs, *y0};
    return mt;
  }

  // Why the core breaks a rule; nullopt when it fuses.
  static std::optional<std::string> check_core(const graph_editor& ed, const match& mt) {
    const node& anchor = ed.at(mt.anchor);
    for (node_id id : mt.core) {
      const node& n = ed.at(id);
      if (!same_request(n, anchor)) {
        return fmt::format("'{}' asks for device '{}' and '{}' for '{}'", n.name,
                           n.requested_device, anchor.name, anchor.requested_device);
      }
      if (!ed.control_inputs(id).empty()) {
        return fmt::format("'{}' waits for '{}' (a control input)", n.name,
                           ed.at(ed.control_inputs(id).front()).name);
      }
    }
    // Interior values: all but y0, whose readers are the match's result's.
    for (std::size_t i = 0; i + 1 < mt.core.size(); ++i) {
      const endpoint e{mt.core[i], 0};
      if (ed.is_pinned(e.node)) {
        return fmt::format("'{}' is a target of the run", ed.at(e.node).name);
      }
      if (auto who = outside_reader(ed, e, mt.core)) {
        return read_outside_reason(ed, e, *who, "ops::layer_norm");
      }
    }
    const node& var = ed.at(mt.core[3]);
    const node& ve = ed.at(mt.core[4]);
    if (ve.outputs[0].shape != var.outputs[0].shape) {
      return fmt::format("epsilon's constant broadcasts the variance {} to {}",
                         to_string(var.outputs[0]), to_string(ve.outputs[0]));
    }
    if (!(mt.eps >= 0.0) || !std::isfinite(mt.eps)) {
      return fmt::format("epsilon {} is not a finite value >= 0", mt.eps);
    }
    for (std::int64_t dim : mt.normalized) {
      if (dim < 0) {
        return fmt::format("the normalised dims {} of x {} are not all known",
                           to_string(mt.normalized), to_string(ed.type_of(mt.x)));
      }
    }
    const dtype t = ed.type_of(mt.x).type;
    if (t == dtype::f16 || t == dtype::bf16) {
      // Note [layer_norm in 16 bits]: the kernel would change the answer.
      return fmt::format(
          "x is {}: layer_norm keeps the statistics in float32, where the primitives round "
          "each of them to {} (d * d overflows float16 above 256, which makes the variance "
          "inf and y = beta), so the fused node would change the answer",
          to_string(t), to_string(t));
    }
    if (auto why = missing_kernel("layer_norm", {{"T", t}}, anchor.requested_device)) return why;
    return std::nullopt;
  }

  // Whether `p` (gamma or beta) holds exactly the elements of a [x.shape[a:]] parameter.
  static std::optional<std::string> param_fits(const graph_editor& ed, const match& mt, endpoint p,
                                               const char* what) {
    const auto& ps = ed.type_of(p).shape;
    const auto& xs = ed.type_of(mt.x).shape;
    bool fits = ps.has_value() && ps->rank() >= mt.normalized.rank() && ps->rank() <= xs->rank();
    if (fits) {
      const std::size_t lead = ps->rank() - mt.normalized.rank();
      for (std::size_t k = 0; k < ps->rank(); ++k) {
        fits = fits && (k < lead ? (*ps)[k] == 1 : (*ps)[k] == mt.normalized[k - lead]);
      }
    }
    if (fits) return std::nullopt;
    return fmt::format(
        "{} '{}' is {}, not x.shape[{}:] = {} (with leading 1s at most): it broadcasts, so it "
        "does not hold layer_norm's {} elements",
        what, ed.g().endpoint_name(p), to_string(ed.type_of(p)), mt.axis, to_string(mt.normalized),
        what);
  }

  // Extends the match by the scale and the shift where they fit; logs where they do not.
  static void extend(const graph_editor& ed, pass_context& ctx, match& mt) {
    const node& anchor = ed.at(mt.anchor);
    endpoint last{mt.core.back(), 0};
    std::vector<node_id> inside = mt.core;
    auto step = [&](const char* op,
                    const char* what) -> std::optional<std::pair<node_id, endpoint>> {
      const auto& uses = ed.uses(last);
      if (uses.size() != 1) {
        // Log the readers that would have been the step (their operand fits), not every
        // `op` reading the value (a gradient's, say).
        for (const use& u : uses) {
          const auto p = other_input(ed, u.node, last);
          if (ed.at(u.node).op() == op && p && *p != last && !param_fits(ed, mt, *p, what)) {
            ctx.refused({ed.at(u.node).name},
                        fmt::format("not fused as layer_norm's {}: '{}' is read by {} nodes", what,
                                    ed.g().endpoint_name(last), uses.size()));
          }
        }
        return std::nullopt;
      }
      const node_id r = uses.front().node;
      const node& rn = ed.at(r);
      if (rn.op() != op) return std::nullopt;
      const auto p = other_input(ed, r, last);
      if (!p || *p == last) return std::nullopt;
      auto refuse = [&](const std::string& why) {
        ctx.refused({rn.name}, fmt::format("not fused as layer_norm's {}: {}", what, why));
        return std::nullopt;
      };
      if (ed.is_fetched(last) || ed.has_control_users(last.node) || ed.is_pinned(last.node)) {
        return refuse(fmt::format("'{}' is also fetched, targeted or waited for",
                                  ed.g().endpoint_name(last)));
      }
      if (!same_request(rn, anchor)) {
        return refuse(fmt::format("it asks for device '{}', the pattern for '{}'",
                                  rn.requested_device, anchor.requested_device));
      }
      if (!ed.control_inputs(r).empty())
        return refuse("it waits for another node (a control input)");
      if (rn.outputs[0].shape != ed.type_of(mt.x).shape) {
        return refuse(fmt::format("its result {} is not x's shape {}", to_string(rn.outputs[0]),
                                  to_string(ed.type_of(mt.x))));
      }
      if (auto why = param_fits(ed, mt, *p, what)) return refuse(*why);
      return std::pair{r, *p};
    };
    if (auto s = step("mul", "gamma")) {
      mt.scale = s->first;
      mt.gamma = s->second;
      last = {s->first, 0};
      inside.push_back(s->first);
    }
    if (auto s = step("add", "beta")) {
      mt.shift = s->first;
      mt.beta = s->second;
    }
  }

  // gamma or beta as layer_norm takes it: `p` reshaped to x.shape[a:] when it has leading
  // 1s, or a ones/zeros node of that shape when absent.
  static endpoint param(graph_editor& ed, const match& mt, std::optional<endpoint> p,
                        const char* fill) {
    const node& anchor = ed.at(mt.anchor);
    const dtype t = ed.type_of(mt.x).type;
    if (!p) {
      return {ed.add({.name = ed.g().unique_name(fmt::format("{}/{}", anchor.name, fill)),
                      .op = fill,
                      .inputs = {},
                      .attrs = {{"dtype", t}, {"shape", mt.normalized}},
                      .device = anchor.requested_device,
                      .control_inputs = {}}),
              0};
    }
    if (ed.type_of(*p).shape->rank() == mt.normalized.rank()) return *p;
    return {ed.add({.name = ed.g().unique_name(fmt::format("{}/reshaped", ed.at(p->node).name)),
                    .op = "reshape",
                    .inputs = {*p},
                    .attrs = {{"shape", mt.normalized.to_vector()}},
                    .device = anchor.requested_device,
                    .control_inputs = {}}),
            0};
  }

  static void rewrite(graph_editor& ed, pass_context& ctx, const match& mt) {
    std::vector<node_id> chain = mt.core;
    if (mt.scale >= 0) chain.push_back(mt.scale);
    if (mt.shift >= 0) chain.push_back(mt.shift);
    const node_id last = chain.back();
    const std::string last_name = ed.at(last).name;
    const endpoint gamma = param(ed, mt, mt.gamma, "ones");
    const endpoint beta = param(ed, mt, mt.beta, "zeros");
    const node_id ln = ed.add({.name = ed.g().unique_name("fused/" + last_name),
                               .op = "layer_norm",
                               .inputs = {mt.x, gamma, beta},
                               .attrs = {{"axis", mt.axis}, {"epsilon", mt.eps}},
                               .device = ed.at(mt.anchor).requested_device,
                               .control_inputs = {}});
    ed.replace_uses({last, 0}, {ln, 0});
    ed.replace_node(last, ln);
    const auto names = names_of(ed, chain);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) ed.erase(*it);
    auto quoted = [&](std::optional<endpoint> p, const char* otherwise) {
      return p ? fmt::format("'{}'", ed.g().endpoint_name(*p)) : std::string(otherwise);
    };
    ctx.rewrote(names, fmt::format("layer_norm '{}' (axis {}, epsilon {}, gamma {}, beta {})",
                                   ed.at(ln).name, mt.axis, mt.eps, quoted(mt.gamma, "ones"),
                                   quoted(mt.beta, "zeros")));
  }

  bool do_run(pass_context& ctx) override {
    graph_editor& ed = ctx.editor();
    bool changed = false;
    for (node_id id : ed.topological_order()) {
      if (!ed.alive(id) || ed.at(id).op() != "reduce_mean") continue;
      auto mt = find_core(ed, id);
      if (!mt) continue;
      if (auto why = check_core(ed, *mt)) {
        ctx.refused(names_of(ed, mt->core), *why);
        continue;
      }
      extend(ed, ctx, *mt);
      rewrite(ed, ctx, *mt);
      changed = true;
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<graph_pass> make_layer_norm_fusion() {
  return std::make_unique<layer_norm_fusion>();
}

}  // namespace loom::passes
