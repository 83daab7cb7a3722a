// graph::add_node: validation, inference and the errors it names; control-edge cycles.
#include <gtest/gtest.h>

#include "loom/graph/graph.hpp"
#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom {
namespace {

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Graph, ValidatesNodesWhenTheyAreAdded) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2, 3});
  auto i = ops::placeholder(b, "i", dtype::i32, {2, 3});
  EXPECT_THROW(g.add_node({.name = "u", .op = "no_such_op"}), not_found);
  EXPECT_NE(message_of([&] { g.add_node({.name = "u", .op = "relux"}); }).find("did you mean"),
            std::string::npos);
  EXPECT_NE(message_of([&] { (void)ops::identity(x, {.name = "x"}); }).find("already exists"),
            std::string::npos);
  const auto dtype_msg = message_of([&] { (void)ops::add(x, i, {.name = "mixed"}); });
  EXPECT_NE(dtype_msg.find("'mixed'"), std::string::npos) << dtype_msg;
  EXPECT_NE(dtype_msg.find("int32"), std::string::npos) << dtype_msg;
  const auto count_msg =
      message_of([&] { g.add_node({.name = "two", .op = "identity", .inputs = {{0, 0}, {0, 0}}}); });
  EXPECT_NE(count_msg.find("expects 1 input"), std::string::npos) << count_msg;
  EXPECT_THROW(g.add_node({.name = "dangling", .op = "identity", .inputs = {{99, 0}}}), not_found);
  EXPECT_THROW(g.add_node({.name = "p", .op = "placeholder", .attrs = {{"dtype", dtype::f32}}}),
               invalid_argument);  // shape is required
  EXPECT_THROW(g.add_node({.name = "bad_attr", .op = "identity", .inputs = {{0, 0}},
                           .attrs = {{"nonsense", 1}}}),
               invalid_argument);
  // A failed add leaves the graph as it was.
  EXPECT_EQ(g.num_nodes(), 2u);
}

TEST(Graph, ConstAndVariableDeriveTheirTypesFromTheirValues) {
  graph g;
  const auto value = memory::host_tensor({2}, {1, 2});
  const node& c = g.add_node({.name = "c", .op = "const", .attrs = {{"value", value}}});
  EXPECT_EQ(c.attr<dtype>("dtype"), dtype::f32);
  EXPECT_EQ(*c.outputs[0].shape, (shape{2}));
  const node& v = g.add_node({.name = "v", .op = "variable", .attrs = {{"initial_value", value}}});
  EXPECT_EQ(v.attr<shape>("shape"), (shape{2}));
}

TEST(Graph, ControlEdgesThatWouldMakeACycleAreRefused) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {1});
  auto a = ops::identity(x, {.name = "a"});
  auto c = ops::identity(a, {.name = "c"});
  const auto msg = message_of([&] { g.add_control_input(a.ep().node, c.ep().node); });
  EXPECT_NE(msg.find("cycle"), std::string::npos) << msg;
  EXPECT_NE(msg.find("a -> c"), std::string::npos) << msg;
  g.add_control_input(c.ep().node, x.ep().node);  // fine: x already precedes c
  EXPECT_EQ(g.at(c.ep().node).control_inputs.size(), 1u);
}

TEST(Graph, UniqueNamesStayLinear) {
  graph g;
  graph_builder b(g);
  output cur = ops::placeholder(b, "x", dtype::f32, {1});
  for (int i = 0; i < 5000; ++i) cur = ops::identity(cur);
  EXPECT_EQ(cur.name(), "identity_4999");
}

// arg_def::any_type: each element of such a list keeps its own dtype (a fused optimizer's
// parameters of mixed precision), while a typed list and a fixed input next to it are
// still unified and checked.
TEST(Graph, AnyTypeListsTakeMixedDtypesAndOthersAreStillChecked) {
  op_registry r;
  register_state_ops(r);
  op_def d;
  d.name = "mixed_lists";
  d.inputs = {arg_def{"xs", {}, dtype::f32, "N", true}, arg_def{"ys", "T", dtype::f32, "M"},
              arg_def{"z", {}, dtype::f32, {}}};
  d.outputs = {arg_def{"out", {}, dtype::f32, {}}};
  d.attrs = {{"N", attr_type::integer, std::nullopt, {}, {}},
             {"M", attr_type::integer, std::nullopt, {}, {}},
             {"T", attr_type::type, std::nullopt, {}, {}}};
  r.add(d);
  graph g(r);
  graph_builder b(g);
  auto f = ops::placeholder(b, "f", dtype::f32, {2});
  auto h = ops::placeholder(b, "h", dtype::bf16, {3});
  auto i = ops::placeholder(b, "i", dtype::i32, {});
  auto f16 = ops::placeholder(b, "f16", dtype::f16, {2});
  const attr_map lengths = {{"N", std::int64_t{3}}, {"M", std::int64_t{2}}};
  const node& ok = g.add_node({.name = "ok", .op = "mixed_lists",
                               .inputs = {f.ep(), h.ep(), i.ep(), f.ep(), f.ep(), f.ep()},
                               .attrs = lengths});
  EXPECT_EQ(ok.attr<dtype>("T"), dtype::f32);
  const auto typed_msg = message_of([&] {
    g.add_node({.name = "bad_typed", .op = "mixed_lists",
                .inputs = {f.ep(), h.ep(), i.ep(), f.ep(), f16.ep(), f.ep()}, .attrs = lengths});
  });
  EXPECT_NE(typed_msg.find("'bad_typed'"), std::string::npos) << typed_msg;
  EXPECT_NE(typed_msg.find("input 4 ('ys', from f16) is float16 but T is float32"), std::string::npos)
      << typed_msg;
  const auto fixed_msg = message_of([&] {
    g.add_node({.name = "bad_fixed", .op = "mixed_lists",
                .inputs = {h.ep(), h.ep(), h.ep(), f.ep(), f.ep(), i.ep()}, .attrs = lengths});
  });
  EXPECT_NE(fixed_msg.find("input 5 ('z', from i) must be float32, got int32"), std::string::npos)
      << fixed_msg;
}

}  // namespace
}  // namespace loom
