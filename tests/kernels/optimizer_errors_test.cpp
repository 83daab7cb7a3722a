// Bad input to the optimizer ops: typed errors naming the node, op, dtype or shape, at graph
// construction where the graph knows enough, else from the kernel (node_error); a failed
// step changes nothing and leaves the session usable.
#include <gtest/gtest.h>

#include "optimizer_test_util.hpp"

namespace loom {
namespace {

using namespace testing;
using namespace testing::optim;

template <class E>
std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no error";
}

void expect_parts(const std::string& msg, const std::vector<std::string>& parts) {
  for (const auto& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

struct fixture {
  graph g;
  graph_builder b{g};
  output w = ops::variable(b, "w", f32_tensor({4}, {1, 2, 3, 4}));
  output v = ops::variable(b, "v", f32_tensor({3}, {1, 2, 3}));
  output gw = ops::placeholder(b, "gw", dtype::f32, {4});
  output gv = ops::placeholder(b, "gv", dtype::f32, {3});
  output lr = ops::scalar(b, 0.1);
  output step = ops::placeholder(b, "step", dtype::i64, {});
  output scale = ops::scalar(b, 1.0);
};

TEST(OptimizerErrors, ParamMustBeAVariable) {
  fixture f;
  auto x = ops::placeholder(f.b, "x", dtype::f32, {4});
  expect_parts(message_of<invalid_argument>([&] { (void)ops::apply_adam(x, f.gw, f.lr, f.step); }),
               {"apply_adam", "param", "'x'", "placeholder"});
  expect_parts(message_of<invalid_argument>([&] {
                 (void)ops::fused_sgd({f.w, x}, {f.gw, f.gw}, f.lr, f.scale);
               }),
               {"fused_sgd", "params[1]", "'x'"});
  // A graph written without the builder (as from JSON) fails when its kernel is made.
  f.g.add_node({.name = "raw", .op = "apply_sgd", .inputs = {f.gw.ep(), f.gw.ep(), f.lr.ep()}});
  session s(f.g);
  expect_parts(message_of<node_error>([&] {
                 s.run({{"gw", f32_tensor({4}, {0, 0, 0, 0})}}, {}, {"raw"});
               }),
               {"'raw'", "apply_sgd", "must come from a variable", "'gw'"});
}

TEST(OptimizerErrors, ListsMustHaveEqualLengths) {
  fixture f;
  expect_parts(message_of<invalid_argument>([&] {
                 (void)ops::fused_adam({f.w, f.v}, {f.gw}, f.lr, f.step, f.scale);
               }),
               {"fused_adam", "2 params but 1 grads"});
  // Raw nodes: N decides the split, and the count must fit.
  expect_parts(message_of<invalid_argument>([&] {
                 f.g.add_node({.name = "raw",
                               .op = "fused_sgd",
                               .inputs = {f.w.ep(), f.v.ep(), f.gw.ep(), f.lr.ep(), f.scale.ep()},
                               .attrs = {{"N", std::int64_t{2}}}});
               }),
               {"'raw'", "fused_sgd", "expects 6 inputs, got 5"});
}

TEST(OptimizerErrors, ShapesAndDtypesAreCheckedWhenTheNodeIsAdded) {
  fixture f;
  expect_parts(message_of<invalid_argument>([&] {
                 (void)ops::fused_adam({f.w, f.v}, {f.gw, f.gw}, f.lr, f.step, f.scale, {}, {},
                                       {.name = "upd"});
               }),
               {"'upd'", "fused_adam", "grads[1] float32[4] does not fit params[1] float32[3]"});
  expect_parts(message_of<invalid_argument>(
                   [&] { (void)ops::apply_sgd(f.w, f.gv, f.lr, {}, {.name = "s"}); }),
               {"'s'", "apply_sgd", "grad float32[3] does not fit param float32[4]"});
  auto iv = ops::variable(f.b, "iv", make(dtype::i32, {4}, {1, 2, 3, 4}));
  expect_parts(
      message_of<invalid_argument>(
          [&] { (void)ops::apply_adamw(iv, f.gw, f.lr, f.step, {}, {.name = "i"}); }),
      {"'i'", "apply_adamw", "int32[4]", "parameters must be float32, float16 or bfloat16"});
  auto ig = ops::placeholder(f.b, "ig", dtype::i64, {4});
  expect_parts(message_of<invalid_argument>([&] {
                 (void)ops::fused_sgd({f.w}, {ig}, f.lr, f.scale, {}, {}, {.name = "ig_upd"});
               }),
               {"'ig_upd'", "grads[0]", "int64[4]", "gradients must be"});
  auto lr2 = ops::constant(f.b, f32_tensor({2}, {0.1, 0.2}));
  expect_parts(message_of<invalid_argument>(
                   [&] { (void)ops::apply_adam(f.w, f.gw, lr2, f.step, {}, {.name = "l"}); }),
               {"'l'", "lr (input 2) must be a scalar, got float32[2]"});
  auto lr64 = ops::scalar(f.b, 0.1, dtype::f64);
  expect_parts(message_of<invalid_argument>(
                   [&] { (void)ops::apply_sgd(f.w, f.gw, lr64, {}, {.name = "l64"}); }),
               {"'l64'", "lr", "float32", "float64"});
  auto step32 = ops::scalar(f.b, 1, dtype::i32);
  expect_parts(message_of<invalid_argument>(
                   [&] { (void)ops::apply_adam(f.w, f.gw, f.lr, step32, {}, {.name = "st"}); }),
               {"'st'", "step", "int64", "int32"});
  // Mixed dtypes are fine: a bf16 parameter with f16 gradients next to an f32 one.
  auto hb = ops::variable(f.b, "hb", make(dtype::bf16, {3}, {1, 2, 3}));
  auto gh = ops::placeholder(f.b, "gh", dtype::f16, {3});
  EXPECT_NO_THROW((void)ops::fused_adam({f.w, hb}, {f.gw, gh}, f.lr, f.step, f.scale));
}

TEST(OptimizerErrors, HyperparametersOutOfRange) {
  fixture f;
  expect_parts(message_of<invalid_argument>([&] {
                 (void)ops::apply_sgd(f.w, f.gw, f.lr, {.nesterov = true}, {.name = "n"});
               }),
               {"'n'", "nesterov momentum needs momentum > 0 and dampening = 0"});
  expect_parts(message_of<invalid_argument>(
                   [&] { (void)ops::apply_adam(f.w, f.gw, f.lr, f.step, {.beta1 = 1.0}); }),
               {"beta1", "must be in [0, 1)"});
  expect_parts(message_of<invalid_argument>([&] {
                 (void)ops::apply_adam(f.w, f.gw, f.lr, f.step, {.moment_dtype = dtype::f16});
               }),
               {"moment_dtype = float16 is not supported", "bfloat16"});
  expect_parts(message_of<invalid_argument>([&] {
                 (void)ops::fused_sgd({f.w}, {f.gw}, f.lr, f.scale, {}, {.max_grad_norm = -1});
               }),
               {"max_grad_norm", ">= 0"});
  expect_parts(message_of<invalid_argument>(
                   [&] { (void)ops::apply_sgd(f.w, f.gw, f.lr, {.momentum = -0.5}); }),
               {"momentum", ">= 0"});
}

TEST(OptimizerErrors, RuntimeValuesAreCheckedAndAFailedStepChangesNothing) {
  fixture f;
  auto gq = ops::placeholder(f.b, "gq", dtype::f32, {-1});  // shape known only at run time
  auto lr_in = ops::placeholder(f.b, "lr_in", dtype::f32, {});
  auto scale_in = ops::placeholder(f.b, "scale_in", dtype::f32, {});
  (void)ops::fused_adam({f.w, f.v}, {f.gw, gq}, lr_in, f.step, scale_in, {}, {}, {.name = "upd"});
  session s(f.g);
  const tensor good_w = f32_tensor({4}, {1, 1, 1, 1});
  auto feeds = [&](tensor q, float lr, std::int64_t t, float scale) {
    tensor l = memory::host_tensor(dtype::f32, shape{});
    *l.data<float>() = lr;
    tensor sc = memory::host_tensor(dtype::f32, shape{});
    *sc.data<float>() = scale;
    return std::vector<feed>{
        {"gw", good_w}, {"gq", q}, {"lr_in", l}, {"step", i64_scalar(t)}, {"scale_in", sc}};
  };
  const std::vector<std::string> fetch = {"upd:0"};
  expect_parts(message_of<node_error>([&] {
                 s.run(feeds(f32_tensor({5}, {1, 1, 1, 1, 1}), 0.1f, 1, 1), fetch);
               }),
               {"'upd'", "fused_adam", "grads[1] (input 3) has shape [5]", "'v' has shape [3]"});
  expect_parts(message_of<node_error>([&] {
                 s.run(feeds(f32_tensor({3}, {1, 1, 1}), 0.1f, 0, 1), fetch);
               }),
               {"'upd'", "step", "1-based", "got 0"});
  expect_parts(message_of<node_error>([&] {
                 s.run(feeds(f32_tensor({3}, {1, 1, 1}), -0.1f, 1, 1), fetch);
               }),
               {"'upd'", "lr", ">= 0", "-0.1"});
  expect_parts(message_of<node_error>([&] {
                 s.run(feeds(f32_tensor({3}, {1, 1, 1}), 0.1f, 1, 0), fetch);
               }),
               {"'upd'", "grad_scale", "> 0"});
  // Nothing was written and no state was made by the failed steps.
  EXPECT_EQ(values(var_value(s, "w")), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(values(var_value(s, "v")), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(s.variables().find("w/adam_m"), nullptr);
  // State of the wrong dtype (a checkpoint of another configuration) is named.
  s.variables().get("v/adam_m").value = make(dtype::bf16, {3}, {0, 0, 0});
  s.variables().get("v/adam_v").value = f32_tensor({3}, {0, 0, 0});
  expect_parts(message_of<node_error>([&] {
                 s.run(feeds(f32_tensor({3}, {1, 1, 1}), 0.1f, 1, 1), fetch);
               }),
               {"'upd'", "state variable 'v/adam_m' is bfloat16[3]", "needs float32[3]"});
  EXPECT_EQ(values(var_value(s, "w")), (std::vector<double>{1, 2, 3, 4}));
  // The session still works.
  s.variables().get("v/adam_m").value = f32_tensor({3}, {0, 0, 0});
  const auto out = s.run(feeds(f32_tensor({3}, {1, 1, 1}), 0.1f, 1, 1), {"upd:0", "upd:1"});
  EXPECT_FALSE(*out[1].data<bool>());
  EXPECT_NE(values(var_value(s, "w"))[0], 1.0);
}

TEST(OptimizerErrors, AParameterListedTwiceIsRefused) {
  fixture f;
  (void)ops::fused_sgd({f.w, f.w}, {f.gw, f.gw}, f.lr, f.scale, {}, {}, {.name = "twice"});
  session s(f.g);
  expect_parts(message_of<node_error>([&] {
                 s.run({{"gw", f32_tensor({4}, {0, 0, 0, 0})}}, {"twice:0"});
               }),
               {"'twice'", "params[1]", "variable 'w'", "earlier parameter"});
}

}  // namespace
}  // namespace loom
