// The partitioner on its own, without a session: _send/_recv pairs on crossing edges, feeds
// read on another device, one copy per (slot, device), control edges, colocation through
// the placer, the slot and reader invariants, and a partitioned plan run by the executor.
#include "../../src/runtime/partitioner.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "../../src/runtime/executor.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "runtime/runtime_test_support.hpp"

namespace loom {
namespace {

using memory::host_tensor;
using runtime::exec_node;
using runtime::plan;
using testing::tracked_cpu_device;

/// A device the CPU cannot read: the partitioner only asks for its type, name and id.
class fake_gpu_device final : public device {
 public:
  explicit fake_gpu_device(int index)
      : device(device_attributes{fmt::format("/device:CUDA:{}", index),
                                 {device_type::cuda, index},
                                 0,
                                 1,
                                 "fake test GPU"}) {}
  memory::memory_resource& allocator() override { return memory::host_resource::instance(); }
};

/// One device per node id: `chosen` by name, `fallback` for the rest.
std::vector<device*> place(const graph& g, const std::map<std::string, device*>& chosen,
                           device* fallback) {
  std::vector<device*> out(g.num_nodes(), fallback);
  for (const auto& [name, d] : chosen) {
    const node* nd = g.find(name);
    EXPECT_NE(nd, nullptr) << name;
    out[static_cast<std::size_t>(nd->id)] = d;
  }
  return out;
}

passes::signature signature_of(const graph& g, const std::vector<std::string>& feeds,
                               const std::vector<std::string>& fetches,
                               const std::vector<std::string>& targets = {}) {
  passes::signature sig;
  for (const auto& f : feeds) sig.feeds.push_back(g.parse_endpoint(f));
  for (const auto& f : fetches) sig.fetches.push_back(g.parse_endpoint(f));
  for (const auto& t : targets) sig.targets.push_back(g.find(t)->id);
  return sig;
}

std::unique_ptr<plan> partition(const graph& g, const passes::signature& sig,
                                const std::vector<device*>& placement, device* host = nullptr) {
  auto p = std::make_unique<plan>();
  const std::vector<bool> needed = passes::needed_nodes(g, sig);
  runtime::partition({.g = g, .needed = needed, .placement = placement, .sig = sig, .host = host},
                     *p);
  return p;
}

std::int32_t index_of(const plan& p, const std::string& name) {
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    if (p.nodes[i].n->name == name) return static_cast<std::int32_t>(i);
  }
  ADD_FAILURE() << "no plan node " << name;
  return -1;
}
const exec_node& at(const plan& p, const std::string& name) {
  return p.nodes[static_cast<std::size_t>(index_of(p, name))];
}

std::vector<std::string> names_starting(const plan& p, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : p.nodes) {
    if (e.n->name.starts_with(prefix)) out.push_back(e.n->name);
  }
  return out;
}

/// What every partitioned plan satisfies, whatever the graph.
void expect_invariants(const plan& p) {
  const auto feed_count = static_cast<std::int32_t>(p.feed_slots.size());
  for (std::int32_t i = 0; i < feed_count; ++i)
    EXPECT_EQ(p.feed_slots[static_cast<std::size_t>(i)], i);

  // Slots: feeds first, then each node's outputs, consecutive, covering [0, slot_count).
  std::vector<std::int32_t> producer(static_cast<std::size_t>(p.slot_count), -1);
  std::int32_t next = feed_count;
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    const exec_node& e = p.nodes[i];
    EXPECT_EQ(e.first_output, next) << e.n->name;
    next += static_cast<std::int32_t>(e.n->outputs.size());
    for (std::size_t k = 0; k < e.n->outputs.size(); ++k) {
      producer[static_cast<std::size_t>(e.first_output) + k] = static_cast<std::int32_t>(i);
    }
    EXPECT_NE(e.dev, nullptr) << e.n->name;
    EXPECT_EQ(e.kernel, nullptr) << e.n->name;  // kernels are a later step
  }
  EXPECT_EQ(next, p.slot_count);

  // Readers: the inputs that read each slot, plus one per fetch.
  ASSERT_EQ(p.slot_readers.size(), static_cast<std::size_t>(p.slot_count));
  std::vector<std::int32_t> readers(static_cast<std::size_t>(p.slot_count), 0);
  std::vector<std::int32_t> waits(p.nodes.size(), 0);  // consumers lists, per consumer
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    const exec_node& e = p.nodes[i];
    // A _send/_recv holds no graph edge: its one input is a slot.
    EXPECT_EQ(e.input_slots.size(), e.n->id >= 0 ? e.n->inputs.size() : 1) << e.n->name;
    std::int32_t data_waits = 0;
    for (std::int32_t s : e.input_slots) {
      ASSERT_GE(s, 0) << e.n->name;
      ASSERT_LT(s, p.slot_count) << e.n->name;
      ++readers[static_cast<std::size_t>(s)];
      const std::int32_t from = producer[static_cast<std::size_t>(s)];
      if (from < 0) continue;  // a feed
      ++data_waits;
      // A data edge never crosses devices but through a _send (whose input may be elsewhere).
      if (!e.n->name.starts_with("_recv/")) {
        EXPECT_EQ(p.nodes[static_cast<std::size_t>(from)].dev, e.dev) << e.n->name;
      } else {
        EXPECT_TRUE(p.nodes[static_cast<std::size_t>(from)].n->name.starts_with("_send/"));
        EXPECT_NE(p.nodes[static_cast<std::size_t>(from)].dev, e.dev) << e.n->name;
      }
    }
    const auto control = static_cast<std::int32_t>(e.n->id >= 0 ? e.n->control_inputs.size() : 0);
    EXPECT_EQ(e.pending, data_waits + control) << e.n->name;
    for (std::int32_t c : e.consumers) {
      ASSERT_GE(c, 0);
      ASSERT_LT(static_cast<std::size_t>(c), p.nodes.size());
      ++waits[static_cast<std::size_t>(c)];
    }
  }
  for (std::int32_t s : p.fetch_slots) {
    ASSERT_GE(s, 0);
    ASSERT_LT(s, p.slot_count);
    ++readers[static_cast<std::size_t>(s)];
  }
  EXPECT_EQ(readers, p.slot_readers);
  std::vector<std::int32_t> roots;
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    EXPECT_EQ(waits[i], p.nodes[i].pending) << p.nodes[i].n->name;
    if (p.nodes[i].pending == 0) roots.push_back(static_cast<std::int32_t>(i));
  }
  EXPECT_EQ(roots, p.roots);

  // One _recv per (source slot, destination device), every one fed by its own _send.
  std::set<std::pair<std::int32_t, const device*>> copies;
  for (const exec_node& e : p.nodes) {
    if (!e.n->name.starts_with("_recv/")) continue;
    const exec_node& send =
        p.nodes[static_cast<std::size_t>(producer[static_cast<std::size_t>(e.input_slots[0])])];
    EXPECT_TRUE(copies.emplace(send.input_slots[0], e.dev).second) << e.n->name;
    EXPECT_EQ(p.slot_readers[static_cast<std::size_t>(send.first_output)], 1) << send.n->name;
  }
  EXPECT_EQ(p.transfer_nodes.size(), 2 * copies.size());
}

/// Two CPU devices and a graph with a placeholder x, fed in every signature below.
class Partitioner : public ::testing::Test {
 protected:
  tracked_cpu_device cpu0{0, 1};
  tracked_cpu_device cpu1{1, 1};
  graph g;
  graph_builder b{g};
  output x = ops::placeholder(b, "x", dtype::f32, {4});
};

TEST_F(Partitioner, CrossDeviceEdgeGetsOneSendRecvPair) {
  auto a = ops::identity(x, {.name = "a"});
  (void)ops::identity(a, {.name = "b"});
  const auto sig = signature_of(g, {"x"}, {"b"});
  const auto p = partition(g, sig, place(g, {{"b", &cpu1}}, &cpu0));
  expect_invariants(*p);

  // The fed placeholder is not a plan node; a, b, then the pair.
  ASSERT_EQ(p->nodes.size(), 4u);
  EXPECT_EQ(p->nodes[0].n->name, "a");
  EXPECT_EQ(p->nodes[1].n->name, "b");
  EXPECT_EQ(p->nodes[2].n->name, "_send/a_1");
  EXPECT_EQ(p->nodes[3].n->name, "_recv/a_1");
  const exec_node& send = p->nodes[2];
  const exec_node& recv = p->nodes[3];
  EXPECT_EQ(send.dev, &cpu0);
  EXPECT_EQ(recv.dev, &cpu1);
  EXPECT_EQ(send.n->op(), "_send");
  EXPECT_EQ(recv.n->op(), "_recv");
  EXPECT_EQ(send.n->id, -1);
  EXPECT_EQ(send.n->attr<dtype>("T"), dtype::f32);
  EXPECT_EQ(send.n->attr<std::string>("recv_device"), "/device:CPU:1");
  EXPECT_EQ(recv.n->attr<std::string>("send_device"), "/device:CPU:0");
  EXPECT_EQ(p->transfer_nodes.size(), 2u);

  // Slots: x, a, b, send, recv.
  EXPECT_EQ(p->feed_slots, (std::vector<std::int32_t>{0}));
  EXPECT_EQ(p->slot_count, 5);
  EXPECT_EQ(at(*p, "a").input_slots, (std::vector<std::int32_t>{0}));
  EXPECT_EQ(send.input_slots, (std::vector<std::int32_t>{1}));
  EXPECT_EQ(recv.input_slots, (std::vector<std::int32_t>{3}));
  EXPECT_EQ(at(*p, "b").input_slots, (std::vector<std::int32_t>{4}));
  EXPECT_EQ(p->fetch_slots, (std::vector<std::int32_t>{2}));
  EXPECT_EQ(p->slot_readers, (std::vector<std::int32_t>{1, 1, 1, 1, 1}));

  // Edges: a → send → recv → b.
  EXPECT_EQ(at(*p, "a").consumers, (std::vector<std::int32_t>{2}));
  EXPECT_EQ(send.consumers, (std::vector<std::int32_t>{3}));
  EXPECT_EQ(recv.consumers, (std::vector<std::int32_t>{1}));
  EXPECT_EQ(p->roots, (std::vector<std::int32_t>{0}));
}

TEST_F(Partitioner, SameDeviceEdgesGetNoCopies) {
  auto a = ops::identity(x, {.name = "a"});
  (void)ops::add(a, a, {.name = "b"});
  const auto p = partition(g, signature_of(g, {"x"}, {"b", "a"}), place(g, {}, &cpu0));
  expect_invariants(*p);
  EXPECT_EQ(p->nodes.size(), 2u);
  EXPECT_TRUE(p->transfer_nodes.empty());
  EXPECT_EQ(at(*p, "b").input_slots, (std::vector<std::int32_t>{1, 1}));
  // a's slot: b reads it twice, and the fetch holds it.
  EXPECT_EQ(p->slot_readers, (std::vector<std::int32_t>{1, 3, 1}));
  EXPECT_EQ(at(*p, "a").consumers, (std::vector<std::int32_t>{1, 1}));
  EXPECT_EQ(at(*p, "b").pending, 2);
}

TEST_F(Partitioner, FeedReadOnAnotherCpuDeviceIsReadInPlace) {
  (void)ops::identity(x, {.name = "a"});
  const auto p =
      partition(g, signature_of(g, {"x"}, {"a"}), place(g, {{"a", &cpu1}}, &cpu0), &cpu0);
  expect_invariants(*p);
  ASSERT_EQ(p->nodes.size(), 1u);
  EXPECT_TRUE(p->transfer_nodes.empty());
  EXPECT_EQ(at(*p, "a").dev, &cpu1);
  EXPECT_EQ(at(*p, "a").input_slots, (std::vector<std::int32_t>{0}));
  EXPECT_EQ(at(*p, "a").pending, 0);
}

TEST_F(Partitioner, FeedReadOnAGpuComesFromTheHostDevice) {
  fake_gpu_device gpu(0);
  (void)ops::identity(x, {.name = "a"});
  (void)ops::identity(x, {.name = "b"});
  (void)ops::identity(x, {.name = "c"});
  const auto sig = signature_of(g, {"x"}, {"a", "b", "c"});
  const auto placement = place(g, {{"a", &gpu}, {"b", &gpu}, {"c", &cpu1}}, &cpu0);
  const auto p = partition(g, sig, placement, &cpu0);
  expect_invariants(*p);

  // One pair for both GPU readers, sent from the host device; c on CPU:1 reads in place.
  EXPECT_EQ(names_starting(*p, "_send/"), (std::vector<std::string>{"_send/x_0"}));
  EXPECT_EQ(names_starting(*p, "_recv/"), (std::vector<std::string>{"_recv/x_0"}));
  const exec_node& send = at(*p, "_send/x_0");
  const exec_node& recv = at(*p, "_recv/x_0");
  EXPECT_EQ(send.dev, &cpu0);
  EXPECT_EQ(recv.dev, &gpu);
  EXPECT_EQ(send.n->attr<std::string>("recv_device"), "/device:CUDA:0");
  EXPECT_EQ(recv.n->attr<std::string>("send_device"), "/device:CPU:0");
  EXPECT_EQ(send.input_slots, (std::vector<std::int32_t>{0}));  // the feed's slot
  EXPECT_EQ(send.pending, 0);
  EXPECT_EQ(at(*p, "a").input_slots, (std::vector<std::int32_t>{recv.first_output}));
  EXPECT_EQ(at(*p, "b").input_slots, (std::vector<std::int32_t>{recv.first_output}));
  EXPECT_EQ(at(*p, "c").input_slots, (std::vector<std::int32_t>{0}));
  EXPECT_EQ(p->slot_readers[0], 2);  // the _send and c

  // With no host device, nothing sends the feed: the GPU readers read its slot.
  const auto bare = partition(g, sig, placement, nullptr);
  expect_invariants(*bare);
  EXPECT_TRUE(bare->transfer_nodes.empty());
  EXPECT_EQ(at(*bare, "a").input_slots, (std::vector<std::int32_t>{0}));
}

TEST_F(Partitioner, OneCopyPerSlotAndDestinationDevice) {
  tracked_cpu_device cpu2(2, 1);
  auto a = ops::identity(x, {.name = "a"});
  (void)ops::identity(a, {.name = "b"});
  (void)ops::identity(a, {.name = "c"});
  (void)ops::add(a, a, {.name = "d"});
  (void)ops::identity(a, {.name = "e"});
  (void)ops::identity(a, {.name = "f"});
  const auto sig = signature_of(g, {"x"}, {"b", "c", "d", "e", "f", "a"});
  const auto p =
      partition(g, sig, place(g, {{"b", &cpu1}, {"c", &cpu1}, {"d", &cpu1}, {"e", &cpu2}}, &cpu0));
  expect_invariants(*p);

  EXPECT_EQ(names_starting(*p, "_send/"), (std::vector<std::string>{"_send/a_1", "_send/a_2"}));
  EXPECT_EQ(names_starting(*p, "_recv/"), (std::vector<std::string>{"_recv/a_1", "_recv/a_2"}));
  const std::int32_t to1 = at(*p, "_recv/a_1").first_output;
  const std::int32_t to2 = at(*p, "_recv/a_2").first_output;
  EXPECT_EQ(at(*p, "b").input_slots, (std::vector<std::int32_t>{to1}));
  EXPECT_EQ(at(*p, "c").input_slots, (std::vector<std::int32_t>{to1}));
  EXPECT_EQ(at(*p, "d").input_slots, (std::vector<std::int32_t>{to1, to1}));
  EXPECT_EQ(at(*p, "e").input_slots, (std::vector<std::int32_t>{to2}));
  EXPECT_EQ(at(*p, "f").input_slots, (std::vector<std::int32_t>{at(*p, "a").first_output}));
  EXPECT_EQ(p->slot_readers[static_cast<std::size_t>(to1)], 4);  // b, c, d twice
  EXPECT_EQ(p->slot_readers[static_cast<std::size_t>(to2)], 1);
  // a's slot: the two _sends, f, and the fetch.
  EXPECT_EQ(p->slot_readers[static_cast<std::size_t>(at(*p, "a").first_output)], 4);
}

TEST_F(Partitioner, ControlEdgesCrossDevicesWithoutCopies) {
  auto a = ops::identity(x, {.name = "a"});
  auto c = ops::identity(x, {.name = "c"});
  (void)ops::no_op(b, {a}, {.name = "after_a"});
  g.add_control_input(c.ep().node, a.ep().node);  // c reads x after a ran
  auto d = ops::identity(a, {.name = "d"});
  g.add_control_input(d.ep().node, a.ep().node);  // d reads a and waits for it
  const auto sig = signature_of(g, {"x"}, {"c", "d"}, {"after_a"});
  const auto p =
      partition(g, sig, place(g, {{"after_a", &cpu1}, {"c", &cpu1}, {"d", &cpu1}}, &cpu0));
  expect_invariants(*p);

  // Only d's data edge is copied; the control edges wait on a directly, across devices.
  EXPECT_EQ(names_starting(*p, "_send/"), (std::vector<std::string>{"_send/a_1"}));
  const std::int32_t ia = index_of(*p, "a");
  EXPECT_EQ(at(*p, "after_a").pending, 1);
  EXPECT_TRUE(at(*p, "after_a").input_slots.empty());
  EXPECT_EQ(at(*p, "c").pending, 1);
  EXPECT_EQ(at(*p, "c").input_slots, (std::vector<std::int32_t>{0}));
  EXPECT_EQ(at(*p, "d").pending, 2);  // the _recv, and a by its control edge
  EXPECT_EQ(at(*p, "d").input_slots, (std::vector<std::int32_t>{at(*p, "_recv/a_1").first_output}));
  const auto& consumers = at(*p, "a").consumers;
  for (const char* name : {"after_a", "c", "d", "_send/a_1"}) {
    EXPECT_EQ(std::count(consumers.begin(), consumers.end(), index_of(*p, name)), 1) << name;
  }
  EXPECT_EQ(consumers.size(), 4u);
  // a's slot is read by the _send alone: control edges read nothing.
  EXPECT_EQ(p->slot_readers[static_cast<std::size_t>(at(*p, "a").first_output)], 1);
  EXPECT_EQ(p->roots, (std::vector<std::int32_t>{ia}));
}

TEST_F(Partitioner, ColocatedNodesShareTheDeviceThePlacerChose) {
  std::vector<std::unique_ptr<device>> devices;
  for (int i = 0; i < 3; ++i) devices.push_back(std::make_unique<tracked_cpu_device>(i, 1));
  auto v = ops::variable(b, "v", host_tensor({4}, {0, 0, 0, 0}));
  auto d = ops::identity(x, {.name = "d", .device = "/device:CPU:2"});
  (void)ops::assign_add(v, d, {.name = "update", .device = "/device:CPU:1"});
  (void)ops::identity(v, {.name = "read_v", .device = "/device:CPU:2"});
  const auto sig = signature_of(g, {"x"}, {"read_v"}, {"update"});
  const std::vector<bool> needed = passes::needed_nodes(g, sig);
  std::vector<placement_decision> decisions;
  std::vector<std::int32_t> task_of;
  const auto placed = runtime::place_nodes(g, needed, devices, session_options{},
                                           runtime::cluster_view{}, task_of, decisions);
  // The update's request moves its variable with it.
  EXPECT_EQ(placed[static_cast<std::size_t>(g.find("v")->id)], devices[1].get());
  EXPECT_EQ(placed[static_cast<std::size_t>(g.find("update")->id)], devices[1].get());

  plan p;
  runtime::partition({.g = g, .needed = needed, .placement = placed, .sig = sig}, p);
  expect_invariants(p);
  for (const exec_node& e : p.nodes) {
    if (e.n->id >= 0) {
      EXPECT_EQ(e.dev, placed[static_cast<std::size_t>(e.n->id)]) << e.n->name;
    }
  }
  // The update reads its variable in place; d and read_v's variable cross devices.
  EXPECT_EQ(at(p, "update").input_slots[0], at(p, "v").first_output);
  EXPECT_EQ(names_starting(p, "_recv/"), (std::vector<std::string>{"_recv/d_1", "_recv/v_2"}));

  const auto parts = runtime::partitions_of(p, devices);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].dev, devices[1].get());
  EXPECT_EQ(parts[1].dev, devices[2].get());
  std::vector<std::string> on1;
  for (std::int32_t i : parts[0].nodes) on1.push_back(p.nodes[static_cast<std::size_t>(i)].n->name);
  EXPECT_EQ(on1, (std::vector<std::string>{"v", "update", "_recv/d_1", "_send/v_2"}));
}

TEST_F(Partitioner, GivenPlacementIsKeptAndEachCrossingCopied) {
  auto halves = ops::split(x, 2);
  auto y = ops::add(halves[0], halves[1], {.name = "y"});
  auto z = ops::mul(y, halves[1], {.name = "z"});
  (void)ops::add(z, y, {.name = "w"});
  const auto sig = signature_of(g, {"x"}, {"w", halves[1].name()});
  const std::string split_name = halves[0].producer().name;
  const auto placement =
      place(g, {{split_name, &cpu0}, {"y", &cpu1}, {"z", &cpu0}, {"w", &cpu1}}, &cpu0);
  const auto p = partition(g, sig, placement);
  expect_invariants(*p);
  for (const exec_node& e : p->nodes) {
    if (e.n->id >= 0) {
      EXPECT_EQ(e.dev, placement[static_cast<std::size_t>(e.n->id)]) << e.n->name;
    }
  }
  // split:0 and split:1 to CPU:1 (for y), y back to CPU:0 (for z), z to CPU:1 (for w); w
  // reads y on its own device. split:1 to CPU:0 needs nothing.
  EXPECT_EQ(names_starting(*p, "_recv/"),
            (std::vector<std::string>{fmt::format("_recv/{}_1", split_name),
                                      fmt::format("_recv/{}:1_1", split_name), "_recv/y_0",
                                      "_recv/z_1"}));
  EXPECT_EQ(at(*p, "w").input_slots[1], at(*p, "y").first_output);
  EXPECT_EQ(p->fetch_slots, (std::vector<std::int32_t>{at(*p, "w").first_output,
                                                       at(*p, split_name).first_output + 1}));
}

TEST_F(Partitioner, PartitionedPlanRunsWithoutASession) {
  testing::tracked_devices devs(2, 1);
  std::vector<std::unique_ptr<device>> devices = devs.registry.create_devices(device_options{});
  ASSERT_EQ(devices.size(), 2u);
  auto a = ops::add(x, x, {.name = "a"});
  auto c = ops::mul(a, a, {.name = "c"});
  (void)ops::add(c, a, {.name = "d"});
  const auto sig = signature_of(g, {"x"}, {"d", "c"});
  const auto p =
      partition(g, sig, place(g, {{"c", devices[1].get()}}, devices[0].get()), devices[0].get());
  expect_invariants(*p);
  runtime::instantiate_kernels(*p, g);
  for (const exec_node& e : p->nodes) EXPECT_NE(e.kernel, nullptr) << e.n->name;

  variable_store variables;
  std::atomic<bool> never{false};
  {
    const auto out = runtime::execute_plan(*p, {host_tensor({4}, {1, 2, 3, 4})}, variables,
                                           {&never, nullptr}, nullptr);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].device(), (device_id{device_type::cpu, 0}));
    EXPECT_EQ(out[1].device(), (device_id{device_type::cpu, 1}));
    EXPECT_EQ(std::vector<float>(out[0].span<float>().begin(), out[0].span<float>().end()),
              (std::vector<float>{6, 20, 42, 72}));
    EXPECT_EQ(std::vector<float>(out[1].span<float>().begin(), out[1].span<float>().end()),
              (std::vector<float>{4, 16, 36, 64}));
  }
  EXPECT_EQ(devs.outstanding_count(), 0u);
}

}  // namespace
}  // namespace loom
