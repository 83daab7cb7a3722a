// Checkpoints of a session's variables: save after training steps, train on, restore, and
// the values are the saved ones bit for bit (checked against values computed here); every
// mismatch between the file and the session is an error naming the variable and changes
// nothing; values land on the device of the value they replace.
#include "loom/checkpoint/checkpoint.hpp"

#include <gtest/gtest.h>

#include "checkpoint/checkpoint_test_support.hpp"
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "loom/checkpoint/safetensors.hpp"
#include "loom/core/error.hpp"
#include "loom/core/input.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

namespace fs = std::filesystem;
using checkpoint::restore_checkpoint;
using checkpoint::restore_options;
using checkpoint::save_checkpoint;
using memory::host_tensor;

using loom::testing::temp_dir;

std::vector<std::byte> bytes_of(const tensor& t) {
  std::vector<std::byte> out(t.nbytes());
  copy_to_dense(t, out.data());
  return out;
}

template <class T>
std::vector<std::byte> bytes_of_values(const std::vector<T>& v) {
  std::vector<std::byte> out(v.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// A model: w (float32 [2, 3]), b (int64 [3]), s (float64 scalar), each with an initial
// value and an update that adds a constant, and `frozen` (float32 [2]), which has no
// update but is read by every step. Target "step" runs all of them.
graph model(const std::string& w_device = "") {
  graph g;
  graph_builder b(g);
  std::vector<float> w0;
  std::vector<float> dw;
  for (int i = 0; i < 6; ++i) {
    w0.push_back(static_cast<float>(i) * 0.25f);
    dw.push_back(0.5f - static_cast<float>(i) * 0.125f);
  }
  auto w = ops::variable(b, "w", host_tensor<float>({2, 3}, w0));
  if (!w_device.empty()) g.set_requested_device(w.ep().node, w_device);
  auto bias =
      ops::variable(b, "b", host_tensor<std::int64_t>({3}, std::vector<std::int64_t>{10, -20, 30}));
  auto s = ops::variable(b, "s", host_tensor<double>({}, std::vector<double>{1.0 / 3.0}));
  auto frozen = ops::variable(b, "frozen", host_tensor({2}, {7, 8}));
  auto uw = ops::assign_add(w, ops::constant(b, host_tensor<float>({2, 3}, dw)));
  auto ub = ops::assign_add(
      bias, ops::constant(b, host_tensor<std::int64_t>({3}, std::vector<std::int64_t>{1, 2, 3})));
  auto us = ops::assign_add(s, ops::constant(b, host_tensor<double>({}, std::vector<double>{0.1})));
  ops::no_op(b, {uw, ub, us, frozen}, {.name = "step"});
  return g;
}

// The values of w, b and s after `steps` updates, computed independently of loom.
std::vector<float> w_after(int steps) {
  std::vector<float> out;
  for (int i = 0; i < 6; ++i) {
    float v = static_cast<float>(i) * 0.25f;
    for (int k = 0; k < steps; ++k) v += 0.5f - static_cast<float>(i) * 0.125f;
    out.push_back(v);
  }
  return out;
}
std::vector<std::int64_t> b_after(int steps) {
  return {10 + steps, -20 + 2 * steps, 30 + 3 * steps};
}
double s_after(int steps) {
  double v = 1.0 / 3.0;
  for (int k = 0; k < steps; ++k) v += 0.1;
  return v;
}

void run_steps(session& s, int n) {
  for (int i = 0; i < n; ++i) (void)s.run({}, {}, {"step"});
}

std::vector<std::byte> value_bytes(session& s, const std::string& name) {
  return bytes_of(s.run({}, {name})[0]);
}

struct snapshot {
  std::vector<std::byte> w, b, s;
  friend bool operator==(const snapshot&, const snapshot&) = default;
};
snapshot take(session& s) {
  return {value_bytes(s, "w"), value_bytes(s, "b"), value_bytes(s, "s")};
}

TEST(Checkpoint, RestoreBringsBackTheSavedValuesBitwise) {
  temp_dir dir;
  session s(model());
  run_steps(s, 3);
  const snapshot saved = take(s);
  ASSERT_EQ(saved.w, bytes_of_values(w_after(3)));
  ASSERT_EQ(saved.b, bytes_of_values(b_after(3)));
  ASSERT_EQ(saved.s, bytes_of_values(std::vector<double>{s_after(3)}));
  save_checkpoint(s, dir / "ckpt.safetensors", {{"format", "loom"}, {"step", "3"}});

  // The file: every variable with a value, sorted by name, with the metadata.
  const auto file = checkpoint::load_safetensors(dir / "ckpt.safetensors");
  std::vector<std::string> names;
  for (const auto& [name, t] : file.tensors) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"b", "frozen", "s", "w"}));
  EXPECT_EQ(file.metadata, (std::map<std::string, std::string>{{"format", "loom"}, {"step", "3"}}));
  EXPECT_EQ(bytes_of(file.tensors[3].second), saved.w);
  EXPECT_EQ(file.tensors[3].second.shape(), (shape{2, 3}));
  EXPECT_EQ(file.tensors[2].second.shape(), shape{});

  run_steps(s, 2);
  ASSERT_NE(take(s), saved);
  const auto metadata = restore_checkpoint(s, dir / "ckpt.safetensors");
  EXPECT_EQ(metadata, (std::map<std::string, std::string>{{"format", "loom"}, {"step", "3"}}));
  EXPECT_EQ(take(s), saved);
  // Training goes on from the restored values.
  run_steps(s, 1);
  EXPECT_EQ(value_bytes(s, "w"), bytes_of_values(w_after(4)));
  EXPECT_EQ(value_bytes(s, "b"), bytes_of_values(b_after(4)));
}

TEST(Checkpoint, RestoreIntoAFreshSession) {
  temp_dir dir;
  {
    session s(model());
    run_steps(s, 5);
    save_checkpoint(s, dir / "ckpt.safetensors");
  }
  session fresh(model());
  EXPECT_TRUE(restore_checkpoint(fresh, dir / "ckpt.safetensors").empty());
  // The values are in host memory until the variables' kernels use them.
  tensor w = fresh.variables().find("w")->value;
  EXPECT_EQ(w.device(), (device_id{device_type::cpu, 0}));
  EXPECT_EQ(value_bytes(fresh, "w"), bytes_of_values(w_after(5)));
  EXPECT_EQ(value_bytes(fresh, "b"), bytes_of_values(b_after(5)));
  EXPECT_EQ(value_bytes(fresh, "s"), bytes_of_values(std::vector<double>{s_after(5)}));
  run_steps(fresh, 2);
  EXPECT_EQ(value_bytes(fresh, "w"), bytes_of_values(w_after(7)));
}

TEST(Checkpoint, OnlyVariablesWithValuesAreSaved) {
  temp_dir dir;
  graph g;
  graph_builder b(g);
  ops::variable(b, "unset", dtype::f32, {2});
  ops::variable(b, "set", host_tensor({1}, {4}));
  session s(std::move(g));
  (void)s.run({}, {"set"});
  save_checkpoint(s, dir / "c.safetensors");
  const auto file = checkpoint::load_safetensors(dir / "c.safetensors");
  ASSERT_EQ(file.tensors.size(), 1u);
  EXPECT_EQ(file.tensors[0].first, "set");
  // Restoring needs "unset" unless missing variables are allowed.
  EXPECT_THROW((void)restore_checkpoint(s, dir / "c.safetensors"), not_found);
  EXPECT_NO_THROW((void)restore_checkpoint(s, dir / "c.safetensors", {.allow_missing = true}));
}

// The message of the error E that restoring `path` into `s` throws.
template <class E>
std::string restore_failure(session& s, const fs::path& path, const restore_options& o = {}) {
  try {
    (void)restore_checkpoint(s, path, o);
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

void expect_contains(const std::string& msg, std::initializer_list<std::string> parts) {
  for (const auto& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

// A checkpoint holding w, b, s, frozen as saved from `s`, with `name` replaced by `t`.
void write_altered(session& s, const fs::path& path, const std::string& name, const tensor& t) {
  save_checkpoint(s, path);
  auto file = checkpoint::load_safetensors(path);
  for (auto& [n, v] : file.tensors) {
    if (n == name) v = t;
  }
  checkpoint::save_safetensors(path, file.tensors);
}

TEST(Checkpoint, WrongDtypeOrShapeNamesTheVariableAndChangesNothing) {
  temp_dir dir;
  session s(model());
  run_steps(s, 2);
  const fs::path bad_dtype = dir / "bad_dtype.safetensors";
  const fs::path bad_shape = dir / "bad_shape.safetensors";
  const fs::path good = dir / "good.safetensors";
  save_checkpoint(s, good);
  write_altered(s, bad_dtype, "w", host_tensor<double>({2, 3}, std::vector<double>(6, 1.0)));
  write_altered(s, bad_shape, "b", host_tensor<std::int64_t>({4}, std::vector<std::int64_t>(4, 1)));
  run_steps(s, 1);
  const snapshot before = take(s);

  expect_contains(restore_failure<invalid_argument>(s, bad_dtype),
                  {"variable 'w'", "float32[2, 3]", "float64[2, 3]", bad_dtype.string(),
                   "no variable was changed"});
  EXPECT_EQ(take(s), before);
  expect_contains(restore_failure<invalid_argument>(s, bad_shape),
                  {"variable 'b'", "int64[3]", "int64[4]", bad_shape.string()});
  EXPECT_EQ(take(s), before);
  // Both wrong at once: both named.
  const fs::path both = dir / "both.safetensors";
  save_checkpoint(s, both);
  auto file = checkpoint::load_safetensors(both);
  file.tensors[0].second = host_tensor<float>({3}, std::vector<float>{1, 2, 3});  // b
  file.tensors[3].second = host_tensor<float>({3, 2}, std::vector<float>(6, 0));  // w
  checkpoint::save_safetensors(both, file.tensors);
  expect_contains(restore_failure<invalid_argument>(s, both),
                  {"variable 'b'", "float32[3]", "variable 'w'", "float32[3, 2]"});
  EXPECT_EQ(take(s), before);
  // The session is still fine.
  (void)restore_checkpoint(s, good);
  EXPECT_EQ(value_bytes(s, "w"), bytes_of_values(w_after(2)));
}

TEST(Checkpoint, MissingVariablesAreAnErrorUnlessAllowed) {
  temp_dir dir;
  session s(model());
  run_steps(s, 1);
  const fs::path path = dir / "partial.safetensors";
  // Only w, at the values after one step.
  checkpoint::save_safetensors(path, {{"w", host_tensor<float>({2, 3}, w_after(1))}});
  run_steps(s, 2);
  const snapshot before = take(s);
  expect_contains(restore_failure<not_found>(s, path),
                  {"'b' (int64[3])", "'frozen' (float32[2])", "'s' (float64[])", path.string(),
                   "allow_missing", "no variable was changed"});
  EXPECT_EQ(take(s), before);
  (void)restore_checkpoint(s, path, {.allow_missing = true});
  EXPECT_EQ(value_bytes(s, "w"), bytes_of_values(w_after(1)));
  EXPECT_EQ(value_bytes(s, "b"), before.b);
  EXPECT_EQ(value_bytes(s, "s"), before.s);
}

TEST(Checkpoint, StateOutsideTheGraphIsSavedCheckedAndCreated) {
  temp_dir dir;
  session s(model());
  run_steps(s, 1);
  // Optimizer state as kernels would make it: in the store, not in the graph.
  s.variables().get("opt/w/m").value =
      host_tensor<float>({2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6});
  const fs::path path = dir / "with_state.safetensors";
  save_checkpoint(s, path);
  s.variables().get("opt/w/m").value = host_tensor<float>({2, 3}, std::vector<float>(6, 0));
  (void)restore_checkpoint(s, path);
  EXPECT_EQ(bytes_of(s.variables().find("opt/w/m")->value),
            bytes_of_values(std::vector<float>{1, 2, 3, 4, 5, 6}));

  // A fresh session gets the state created.
  session fresh(model());
  (void)restore_checkpoint(fresh, path);
  ASSERT_NE(fresh.variables().find("opt/w/m"), nullptr);
  EXPECT_EQ(bytes_of(fresh.variables().find("opt/w/m")->value),
            bytes_of_values(std::vector<float>{1, 2, 3, 4, 5, 6}));

  // State whose current value differs in shape from the file's is refused.
  s.variables().get("opt/w/m").value = host_tensor<float>({6}, std::vector<float>(6, 0));
  const snapshot before = take(s);
  expect_contains(restore_failure<invalid_argument>(s, path),
                  {"variable 'opt/w/m'", "its value is float32[6]", "float32[2, 3]"});
  EXPECT_EQ(s.variables().find("opt/w/m")->value.shape(), (shape{6}));
  EXPECT_EQ(take(s), before);
}

TEST(Checkpoint, ValuesGoToTheDeviceOfTheValueTheyReplace) {
  temp_dir dir;
  session_options o;
  o.devices.virtual_cpu_devices = 2;
  o.devices.cpu_threads = 2;
  session s(model("cpu:1"), o);
  run_steps(s, 1);
  const device_id cpu1{device_type::cpu, 1};
  ASSERT_EQ(s.variables().find("w")->value.device(), cpu1);
  save_checkpoint(s, dir / "c.safetensors");
  run_steps(s, 1);
  (void)restore_checkpoint(s, dir / "c.safetensors");
  const tensor w = s.variables().find("w")->value;
  EXPECT_EQ(w.device(), cpu1);
  EXPECT_EQ(bytes_of(w), bytes_of_values(w_after(1)));
  run_steps(s, 1);
  EXPECT_EQ(value_bytes(s, "w"), bytes_of_values(w_after(2)));
  EXPECT_EQ(s.variables().find("w")->value.device(), cpu1);
}

TEST(Checkpoint, FileErrorsPassThrough) {
  temp_dir dir;
  session s(model());
  run_steps(s, 1);
  const snapshot before = take(s);
  EXPECT_THROW((void)restore_checkpoint(s, dir / "absent.safetensors"), not_found);
  const fs::path garbage = dir / "garbage.safetensors";
  { std::ofstream(garbage) << "this is not a checkpoint at all"; }
  try {
    (void)restore_checkpoint(s, garbage);
    ADD_FAILURE() << "expected parse_error";
  } catch (const parse_error& e) {
    EXPECT_NE(std::string(e.what()).find(garbage.string()), std::string::npos) << e.what();
  }
  EXPECT_EQ(take(s), before);
  // Saving onto a directory fails and names it.
  fs::create_directory(dir / "taken");
  EXPECT_THROW(save_checkpoint(s, dir / "taken"), error);
}

// ---- restore_options: what a caller that knows its model asks for -------------------------

// A checkpoint of `s` with `extra` tensors added.
void write_with(session& s, const fs::path& path,
                const std::vector<std::pair<std::string, tensor>>& extra,
                const std::map<std::string, std::string>& metadata = {}) {
  save_checkpoint(s, path, metadata);
  auto file = checkpoint::load_safetensors(path);
  for (const auto& e : extra) file.tensors.push_back(e);
  checkpoint::save_safetensors(path, file.tensors, metadata);
}

tensor halves(dtype t, std::vector<std::uint16_t> bits) {
  tensor out = memory::host_tensor(t, {static_cast<std::int64_t>(bits.size())});
  std::memcpy(out.raw_data(), bits.data(), bits.size() * 2);
  return out;
}

TEST(Checkpoint, UnknownTensorsAreRefusedWhenTheCallerKnowsItsModel) {
  temp_dir dir;
  session s(model());
  run_steps(s, 1);
  const fs::path path = dir / "extra.safetensors";
  write_with(s, path,
             {{"fc9/w", host_tensor<float>({3}, std::vector<float>{1, 2, 3})},
              {"opt/w/m", host_tensor<float>({2, 3}, std::vector<float>(6, 1))}});
  const snapshot before = take(s);
  restore_options strict;
  strict.allow_unknown = false;
  expect_contains(restore_failure<invalid_argument>(s, path, strict),
                  {path.string(),
                   "tensors 'fc9/w' (float32[3]), 'opt/w/m' (float32[2, 3]) are no "
                   "variable of the session",
                   "no variable was changed"});
  EXPECT_EQ(take(s), before);
  EXPECT_EQ(s.variables().find("fc9/w"), nullptr);

  // Declared state is known: with its dtype and shape it is restored, with another refused.
  strict.expected_state = {{"fc9/w", {dtype::f32, {3}}}, {"opt/w/m", {dtype::f32, {2, 3}}}};
  (void)restore_checkpoint(s, path, strict);
  EXPECT_EQ(bytes_of(s.variables().find("fc9/w")->value),
            bytes_of_values(std::vector<float>{1, 2, 3}));
  session fresh(model());
  strict.expected_state["opt/w/m"] = {dtype::f32, {3, 2}};
  expect_contains(restore_failure<invalid_argument>(fresh, path, strict),
                  {"state 'opt/w/m': the session expects float32[3, 2], the file holds "
                   "float32[2, 3]",
                   path.string()});
  EXPECT_EQ(fresh.variables().find("fc9/w"), nullptr);
  // By default such tensors become variables, as before.
  session lenient(model());
  (void)restore_checkpoint(lenient, path);
  EXPECT_NE(lenient.variables().find("fc9/w"), nullptr);
}

TEST(Checkpoint, NonFiniteValuesAreRefusedWhenAsked) {
  temp_dir dir;
  session s(model());
  run_steps(s, 1);
  const snapshot before = take(s);
  restore_options o;
  o.refuse_nonfinite = true;
  const struct {
    std::string name;
    tensor value;
    std::string part;
  } cases[] = {
      {"w", host_tensor<float>({2, 3}, std::vector<float>{0, 1, 2, NAN, 4, 5}),
       "tensor 'w' (float32[2, 3]) holds nan at element 3"},
      {"s", host_tensor<double>({}, std::vector<double>{-INFINITY}),
       "tensor 's' (float64[]) holds -inf at element 0"},
      {"opt/h", halves(dtype::f16, {0x3C00, 0x7E00}), "holds nan at element 1"},
      {"opt/g", halves(dtype::bf16, {0xFF80}), "holds -inf at element 0"},
  };
  for (const auto& c : cases) {
    const fs::path path = dir / "nonfinite.safetensors";
    if (c.name.starts_with("opt/")) {
      write_with(s, path, {{c.name, c.value}});
    } else {
      write_altered(s, path, c.name, c.value);
    }
    expect_contains(restore_failure<invalid_argument>(s, path, o), {c.part, path.string()});
    EXPECT_EQ(take(s), before) << c.name;
    EXPECT_EQ(s.variables().find("opt/h"), nullptr);
    // Not asked: restored as they are.
    session other(model());
    EXPECT_NO_THROW((void)restore_checkpoint(other, path)) << c.name;
  }
  // Integers are not checked; finite halves pass.
  const fs::path fine = dir / "fine.safetensors";
  write_with(s, fine, {{"opt/h", halves(dtype::f16, {0x3C00, 0x7BFF})}});
  EXPECT_NO_THROW((void)restore_checkpoint(s, fine, o));
}

TEST(Checkpoint, CheckMetadataSeesTheMetadataBeforeAnythingChanges) {
  temp_dir dir;
  session s(model());
  run_steps(s, 1);
  const fs::path path = dir / "meta.safetensors";
  save_checkpoint(s, path, {{"epoch", "x"}});
  run_steps(s, 1);
  const snapshot before = take(s);
  std::map<std::string, std::string> seen;
  restore_options o;
  o.check_metadata = [&](const std::map<std::string, std::string>& meta) {
    seen = meta;
    (void)parse_number<int>(meta.at("epoch"), "the epoch");
  };
  expect_contains(restore_failure<parse_error>(s, path, o), {"the epoch: 'x' is not an integer"});
  EXPECT_EQ(seen, (std::map<std::string, std::string>{{"epoch", "x"}}));
  EXPECT_EQ(take(s), before);
}

}  // namespace
}  // namespace loom
