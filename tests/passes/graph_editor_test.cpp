// The graph editor: what a signature copies, pins, rewiring, removal, and the compact
// graph it finishes with.
#include "loom/passes/graph_editor.hpp"

#include <gtest/gtest.h>

#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::passes {
namespace {

using memory::host_tensor;

struct fixture {
  graph g;
  graph_builder b{g};
  output x = ops::placeholder(b, "x", dtype::f32, {4});
  output a = ops::exp(x, {.name = "a"});
  output c = ops::mul(a, a, {.name = "c"});
  output unused = ops::neg(x, {.name = "unused"});
  output d = ops::add(c, x, {.name = "d"});
};

TEST(GraphEditor, CopiesWhatTheSignatureNeedsAndFedValuesBecomeArgs) {
  fixture f;
  graph_editor ed(f.g, {{f.a.ep()}, {f.d.ep()}, {}});
  // a is fed: x and exp are not needed, `unused` never was.
  EXPECT_EQ(ed.g().find("unused"), nullptr);
  EXPECT_EQ(ed.g().find("x") != nullptr, true);  // d reads x
  const node* arg = ed.g().find("a/fed_0");
  ASSERT_NE(arg, nullptr);
  EXPECT_EQ(arg->op(), "_arg");
  EXPECT_TRUE(ed.is_pinned(arg->id));
  EXPECT_EQ(ed.g().find("a"), nullptr);
  const node& c = ed.g().get("c");
  EXPECT_EQ(ed.inputs(c.id)[0].node, arg->id);
  EXPECT_EQ(ed.uses({arg->id, 0}).size(), 2u);
  const auto out = ed.finish();
  ASSERT_EQ(out.feeds.size(), 1u);
  EXPECT_EQ(out.g.at(out.feeds[0].node).op(), "_arg");
  EXPECT_EQ(out.g.at(out.fetches[0].node).name, "d");
}

TEST(GraphEditor, FedPlaceholderKeepsItsNameAndUnknownRanksStayUnknown) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2, 3});
  auto y = ops::tanh(x, {.name = "y"});
  graph_editor ed(g, {{x.ep()}, {y.ep()}, {}});
  const node& arg = ed.g().get("x");
  EXPECT_EQ(arg.op(), "_arg");
  EXPECT_EQ(arg.outputs[0], (tensor_type{dtype::f32, shape{2, 3}}));
}

TEST(GraphEditor, ReplaceUsesMovesReadersAndFetches) {
  fixture f;
  graph_editor ed(f.g, {{f.x.ep()}, {f.c.ep(), f.d.ep()}, {}});
  const node_id c = ed.g().get("c").id;
  const node_id a = ed.g().get("a").id;
  const node_id sq = ed.add({.name = "sq", .op = "square", .inputs = {{a, 0}}});
  ed.replace_uses({c, 0}, {sq, 0});
  EXPECT_TRUE(ed.uses({c, 0}).empty());
  EXPECT_TRUE(ed.is_fetched({sq, 0}));
  EXPECT_FALSE(ed.is_fetched({c, 0}));
  ed.erase(c);
  EXPECT_FALSE(ed.alive(c));
  // sq was added after d, which now reads it: finish must reorder.
  const auto out = ed.finish();
  EXPECT_EQ(out.g.find("c"), nullptr);
  const node& d = out.g.get("d");
  const node& sq_out = out.g.get("sq");
  EXPECT_LT(sq_out.id, d.id);
  EXPECT_EQ(d.inputs[0].node, sq_out.id);
  EXPECT_EQ(out.fetches[0].node, sq_out.id);
  EXPECT_EQ(out.fetches[1].node, d.id);
}

TEST(GraphEditor, RefusesToBreakTheGraph) {
  fixture f;
  graph_editor ed(f.g, {{f.x.ep()}, {f.d.ep()}, {}});
  const node_id a = ed.g().get("a").id;
  const node_id c = ed.g().get("c").id;
  // Still read.
  EXPECT_THROW(ed.erase(a), invalid_argument);
  // A fed value is pinned.
  EXPECT_THROW(ed.erase(ed.g().get("x").id), invalid_argument);
  // A replacement of another dtype or shape.
  const node_id wide = ed.add(
      {.name = "wide", .op = "zeros", .attrs = {{"dtype", dtype::f32}, {"shape", shape{5}}}});
  EXPECT_THROW(ed.replace_uses({c, 0}, {wide, 0}), invalid_argument);
  const node_id ints = ed.add(
      {.name = "ints", .op = "zeros", .attrs = {{"dtype", dtype::i32}, {"shape", shape{4}}}});
  EXPECT_THROW(ed.replace_uses({c, 0}, {ints, 0}), invalid_argument);
  // Reading a removed node.
  ed.erase(wide);
  EXPECT_THROW((void)ed.add({.name = "bad", .op = "neg", .inputs = {{wide, 0}}}), invalid_argument);
  // Unknown endpoints in the signature.
  EXPECT_THROW(graph_editor(f.g, {{}, {{99, 0}}, {}}), not_found);
  EXPECT_THROW(graph_editor(f.g, {{}, {{f.a.ep().node, 3}}, {}}), not_found);
  EXPECT_THROW(graph_editor(f.g, {{f.x.ep(), f.x.ep()}, {f.d.ep()}, {}}), invalid_argument);
}

TEST(GraphEditor, ReplaceNodeMovesTargetsAndControlEdges) {
  graph g;
  graph_builder b(g);
  auto v = ops::variable(b, "v", host_tensor({2}, {1, 2}));
  auto x = ops::placeholder(b, "x", dtype::f32, {2});
  const std::string up = ops::assign_add(v, x, {.name = "up"}).producer().name;
  const std::string done = ops::no_op(b, {}, {.name = "done"});
  g.add_control_input(g.get(done).id, g.get(up).id);
  graph_editor ed(g, {{x.ep()}, {}, {g.get(up).id, g.get(done).id}});
  const node_id old_up = ed.g().get("up").id;
  const node_id other = ed.add({.name = "up2", .op = "assign_add", .inputs = ed.inputs(old_up)});
  EXPECT_THROW(ed.erase(old_up), invalid_argument);  // a target, and waited for
  ed.replace_node(old_up, other);
  EXPECT_FALSE(ed.is_pinned(old_up));
  EXPECT_TRUE(ed.is_pinned(other));
  EXPECT_TRUE(ed.has_control_users(other));
  ed.erase(old_up);
  const auto out = ed.finish();
  EXPECT_EQ(out.g.at(out.targets[0]).name, "up2");
  EXPECT_EQ(out.g.get("done").control_inputs, (std::vector<node_id>{out.targets[0]}));
  // The variable assign_add reads stays; the removed update is gone.
  EXPECT_EQ(out.g.find("up"), nullptr);
  EXPECT_NE(out.g.find("v"), nullptr);
}

TEST(GraphEditor, TopologicalOrderCoversLiveNodesInputsFirst) {
  fixture f;
  graph_editor ed(f.g, {{f.x.ep()}, {f.d.ep()}, {}});
  const auto order = ed.topological_order();
  EXPECT_EQ(order.size(), ed.live_count());
  std::vector<int> pos(ed.g().num_nodes(), -1);
  for (std::size_t i = 0; i < order.size(); ++i)
    pos[static_cast<std::size_t>(order[i])] = static_cast<int>(i);
  for (node_id id : order) {
    for (endpoint e : ed.inputs(id))
      EXPECT_LT(pos[static_cast<std::size_t>(e.node)], pos[static_cast<std::size_t>(id)]);
  }
}

}  // namespace
}  // namespace loom::passes
