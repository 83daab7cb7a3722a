// The partitioner: plan nodes and slots for a placed graph, a _send/_recv pair on every
// edge that crosses devices, the edges each node waits for and the readers of each slot;
// then the kernels, one per plan node.
#include "partitioner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "loom/kernel/kernel_registry.hpp"
#include "loom/kernel/variable_store.hpp"

namespace loom::runtime {
namespace {

// Note [tasks]
// A session whose options name a cluster (session_options::cluster: a communicator of N
// processes, TensorFlow's tasks of one job, over MPI instead of gRPC) is made by every
// process, with the same graph, and every run is called on every process with the same
// feeds, fetches and targets. A node whose request names a task ("/job:worker/task:1/...")
// runs on that task alone; a node with none runs on every task, each computing it itself,
// so a value that every task can compute never crosses. What crosses is a value made by a
// node pinned to a task and read on another: by a node pinned there, or by one that every
// task runs (then every other task receives it), or fetched (every task fetches it).
// The producer's task sends it (_send_task, to each task that reads it) and each reader's
// task receives it (_recv_task), point to point over the session's own duplicate of the
// communicator; both ends run on the task's host device and block only their own threads
// (Note [blocking nodes] in executor.cpp). Every task lists the crossing values alike, from
// the same graph and the same pins, so the index of a value in that list is its message
// tag on both ends. A control edge cannot cross tasks (it would need a message of its own):
// such a graph is refused, naming both nodes.
struct crossing {
  std::int32_t from = -1;          // the producer's task
  std::vector<std::int32_t> to;    // the tasks that read it, ascending
  std::int32_t tag = 0;
};

using endpoint_key = std::pair<node_id, std::int32_t>;

std::map<endpoint_key, crossing> crossings(
    const placed_graph& in,
    const std::unordered_map<endpoint, std::int32_t, endpoint_hash>& fed) {
  std::map<endpoint_key, crossing> out;
  const std::int32_t tasks = in.cluster == nullptr ? 1 : in.cluster->tasks;
  if (tasks <= 1 || in.task_of == nullptr) return out;
  const auto task_of = [&](node_id id) { return (*in.task_of)[static_cast<std::size_t>(id)]; };
  std::map<endpoint_key, std::set<std::int32_t>> readers;
  const auto read_on = [&](endpoint e, std::int32_t reader_task) {
    const std::int32_t from = task_of(e.node);
    if (from < 0 || from == reader_task || fed.contains(e)) return;
    auto& r = readers[{e.node, e.index}];
    for (std::int32_t t = 0; t < tasks; ++t) {
      if (t != from && (reader_task < 0 || t == reader_task)) r.insert(t);
    }
  };
  for (const node& nd : in.g.nodes()) {
    if (!in.needed[static_cast<std::size_t>(nd.id)]) continue;
    const std::int32_t here = task_of(nd.id);
    for (endpoint e : nd.inputs) read_on(e, here);
    for (node_id c : nd.control_inputs) {
      const std::int32_t from = task_of(c);
      if (from >= 0 && from != here) {
        throw invalid_argument(fmt::format(
            "node {} waits for node {} (a control edge), which runs on task {} alone, while {} "
            "runs on {}: control edges cannot cross tasks; pin both to one task, or make the "
            "edge a data edge",
            nd.describe(), in.g.at(c).describe(), from, nd.name,
            here < 0 ? std::string("every task") : fmt::format("task {}", here)));
      }
    }
  }
  for (endpoint e : in.sig.fetches) read_on(e, -1);  // every task fetches it
  std::int32_t tag = 0;
  for (auto& [key, to] : readers) {
    out[key] = {task_of(key.first), {to.begin(), to.end()}, tag++};
  }
  return out;
}

}  // namespace

void partition(const placed_graph& in, plan& p) {
  const graph& pg = in.g;
  const std::size_t n = pg.num_nodes();
  std::unordered_map<endpoint, std::int32_t, endpoint_hash> fed;
  for (std::size_t i = 0; i < in.sig.feeds.size(); ++i) {
    fed.emplace(in.sig.feeds[i], static_cast<std::int32_t>(i));
  }
  const std::map<endpoint_key, crossing> crossing_values = crossings(in, fed);
  const std::int32_t me = in.cluster == nullptr ? 0 : in.cluster->task;
  // Whether node `id` runs in this process (not pinned to another task).
  const auto runs_here = [&](node_id id) {
    const std::int32_t t = in.task_of == nullptr ? -1 : (*in.task_of)[static_cast<std::size_t>(id)];
    return t < 0 || t == me;
  };

  // Plan nodes and slots. Feeds take the first slots.
  std::vector<std::int32_t> exec_of(n, -1);
  const auto feed_count = static_cast<std::int32_t>(in.sig.feeds.size());
  std::int32_t slots = feed_count;
  for (std::int32_t i = 0; i < feed_count; ++i) p.feed_slots.push_back(i);
  for (const node& nd : pg.nodes()) {
    if (!in.needed[static_cast<std::size_t>(nd.id)] || !runs_here(nd.id)) continue;
    exec_of[static_cast<std::size_t>(nd.id)] = static_cast<std::int32_t>(p.nodes.size());
    exec_node e;
    e.n = &nd;
    e.dev = in.placement[static_cast<std::size_t>(nd.id)];
    e.first_output = slots;
    slots += static_cast<std::int32_t>(nd.outputs.size());
    p.nodes.push_back(std::move(e));
  }
  std::vector<std::int32_t> producer_of_slot(static_cast<std::size_t>(slots), -1);
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    for (std::size_t k = 0; k < p.nodes[i].n->outputs.size(); ++k) {
      producer_of_slot[static_cast<std::size_t>(p.nodes[i].first_output) + k] =
          static_cast<std::int32_t>(i);
    }
  }
  // Values of other tasks: the slot of the _recv_task that brings each here.
  std::map<endpoint_key, std::int32_t> received;
  auto slot_of = [&](endpoint e) -> std::int32_t {
    if (auto it = fed.find(e); it != fed.end()) return it->second;
    if (!runs_here(e.node)) return received.at({e.node, e.index});
    return p.nodes[static_cast<std::size_t>(exec_of[static_cast<std::size_t>(e.node)])]
               .first_output +
           e.index;
  };

  // Partition: an edge whose source slot lives on another device goes through a _send on
  // the source device and a _recv on the destination, one pair per (slot, device).
  const op_def& send_def = pg.ops().get("_send");
  const op_def& recv_def = pg.ops().get("_recv");
  std::map<std::pair<std::int32_t, const device*>, std::int32_t> recv_slot;
  auto add_transfer_node = [&](const op_def& def, std::string name, const tensor_type& type,
                               device* dev, std::string peer_attr, std::string peer) {
    node t;
    t.id = -1;
    t.name = std::move(name);
    t.def = &def;
    t.attrs = {{"T", type.type}, {std::move(peer_attr), std::move(peer)}};
    t.outputs = {type};
    p.transfer_nodes.push_back(std::move(t));
    exec_node e;
    e.n = &p.transfer_nodes.back();
    e.dev = dev;
    e.first_output = slots++;
    producer_of_slot.push_back(static_cast<std::int32_t>(p.nodes.size()));
    p.nodes.push_back(std::move(e));
    return static_cast<std::int32_t>(p.nodes.size() - 1);
  };
  const std::size_t graph_nodes = p.nodes.size();

  // Between tasks (Note [tasks]): a _recv_task for each value of another task read here, a
  // _send_task for each value of this task read elsewhere, on the host device.
  if (!crossing_values.empty()) {
    const op_def& send_task_def = pg.ops().get("_send_task");
    const op_def& recv_task_def = pg.ops().get("_recv_task");
    for (const auto& [key, c] : crossing_values) {
      const endpoint e{key.first, key.second};
      const tensor_type& type = pg.type_of(e);
      const bool reader = std::find(c.to.begin(), c.to.end(), me) != c.to.end();
      if (!reader && c.from != me) continue;
      node t;
      t.id = -1;
      t.def = reader ? &recv_task_def : &send_task_def;
      t.name = fmt::format("{}/{}", reader ? "_recv_task" : "_send_task", pg.endpoint_name(e));
      t.attrs = {{"T", type.type}, {"group", in.cluster->group}, {"tag", std::int64_t{c.tag}}};
      if (reader) {
        t.attrs.emplace("from", std::int64_t{c.from});
        t.outputs = {type};
      } else {
        t.attrs.emplace("to", std::vector<std::int64_t>(c.to.begin(), c.to.end()));
      }
      p.transfer_nodes.push_back(std::move(t));
      exec_node x;
      x.n = &p.transfer_nodes.back();
      x.dev = in.host;
      x.first_output = slots;
      if (reader) {
        received[key] = slots;
        producer_of_slot.push_back(static_cast<std::int32_t>(p.nodes.size()));
        ++slots;
      } else {
        const device* src = p.nodes[static_cast<std::size_t>(exec_of[static_cast<std::size_t>(e.node)])].dev;
        if (!is_host_accessible(src->type())) {
          throw invalid_argument(fmt::format(
              "{} is read on another task, but it is made on {}: values cross tasks from host "
              "memory only (pin the node to the task's CPU)",
              pg.endpoint_name(e), src->name()));
        }
        x.input_slots.push_back(slot_of(e));
      }
      p.nodes.push_back(std::move(x));
    }
  }

  for (std::size_t i = 0; i < graph_nodes; ++i) {
    const node& nd = *p.nodes[i].n;
    device* dst = p.nodes[i].dev;
    for (endpoint e : nd.inputs) {
      std::int32_t s = slot_of(e);
      const std::int32_t producer = producer_of_slot[static_cast<std::size_t>(s)];
      // Fed values live in the caller's memory: a consumer on a device the CPU cannot
      // reach (a GPU) receives them through a copy, as from a node on the host device.
      device* src = producer >= 0 ? p.nodes[static_cast<std::size_t>(producer)].dev
                    : s < feed_count && !is_host_accessible(dst->type()) ? in.host
                                                                         : nullptr;
      if (src != nullptr && src != dst) {
        auto key = std::make_pair(s, static_cast<const device*>(dst));
        auto it = recv_slot.find(key);
        if (it == recv_slot.end()) {
          const tensor_type& type = pg.type_of(e);
          const std::string base = fmt::format("{}_{}", pg.endpoint_name(e), dst->id().index);
          const std::int32_t send =
              add_transfer_node(send_def, "_send/" + base, type, src, "recv_device", dst->name());
          p.nodes[static_cast<std::size_t>(send)].input_slots.push_back(s);
          const std::int32_t recv =
              add_transfer_node(recv_def, "_recv/" + base, type, dst, "send_device", src->name());
          p.nodes[static_cast<std::size_t>(recv)].input_slots.push_back(
              p.nodes[static_cast<std::size_t>(send)].first_output);
          it = recv_slot.emplace(key, p.nodes[static_cast<std::size_t>(recv)].first_output).first;
        }
        s = it->second;
      }
      p.nodes[i].input_slots.push_back(s);
    }
  }

  // Edges: consumers and pending counts; readers per slot.
  p.slot_count = slots;
  p.slot_readers.assign(static_cast<std::size_t>(slots), 0);
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    auto& e = p.nodes[i];
    for (std::int32_t s : e.input_slots) {
      ++p.slot_readers[static_cast<std::size_t>(s)];
      const std::int32_t producer = producer_of_slot[static_cast<std::size_t>(s)];
      if (producer >= 0) {
        p.nodes[static_cast<std::size_t>(producer)].consumers.push_back(
            static_cast<std::int32_t>(i));
        ++e.pending;
      }
    }
    if (e.n->id >= 0) {
      for (node_id c : e.n->control_inputs) {
        // One that runs on every task (crossings() refused the others).
        const std::int32_t producer = exec_of[static_cast<std::size_t>(c)];
        p.nodes[static_cast<std::size_t>(producer)].consumers.push_back(
            static_cast<std::int32_t>(i));
        ++e.pending;
      }
    }
  }
  for (endpoint e : in.sig.fetches) {
    const std::int32_t s = slot_of(e);
    p.fetch_slots.push_back(s);
    ++p.slot_readers[static_cast<std::size_t>(s)];  // the fetch's hold
  }
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    if (p.nodes[i].pending == 0) p.roots.push_back(static_cast<std::int32_t>(i));
  }
  p.nodes_to_run = static_cast<std::int32_t>(p.nodes.size());  // until constants are bound
}

namespace {

// Note [constants bound with the plan]
// A `const` node (an imported model's weights: 67 of mobilenet_v2's 122 nodes) made the same
// tensor on every run, and running it cost what running any node costs (its kernel context,
// its consumers' counts, its place in the chain): about 10 us a run of mobilenet_v2 at batch
// 1, before its first convolution and between the others. So the plan makes each constant's
// value once, with its kernel (a copy on the node's device, where the value lives elsewhere),
// and the node never runs: a run starts with the value in the constant's output slot and its
// consumers waiting for one edge fewer (a node whose inputs are all constants is a root). The
// plan holds a reference to the value, so no reader can write into it (Note [buffer
// forwarding] in executor.cpp). A constant with control edges runs as before.
void bind_constants(plan& p) {
  variable_store none;
  for (auto& e : p.nodes) {
    if (e.n->id < 0 || e.n->op() != "const" || !e.input_slots.empty() || !e.n->control_inputs.empty() ||
        e.n->outputs.size() != 1) {
      continue;
    }
    tensor value;
    kernel_context ctx(*e.n, *e.dev, {}, std::span<tensor>(&value, 1), &none, nullptr);
    e.kernel->compute(ctx);
    if (!value.defined()) continue;
    e.constant = std::move(value);
    for (std::int32_t c : e.consumers) --p.nodes[static_cast<std::size_t>(c)].pending;
  }
  p.roots.clear();
  p.bound_constants.clear();
  p.nodes_to_run = 0;
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    const exec_node& e = p.nodes[i];
    if (e.constant.defined()) {
      if (p.slot_readers[static_cast<std::size_t>(e.first_output)] > 0) {
        p.bound_constants.push_back(static_cast<std::int32_t>(i));
      }
      continue;
    }
    ++p.nodes_to_run;
    if (e.pending == 0) p.roots.push_back(static_cast<std::int32_t>(i));
  }
}

}  // namespace

void instantiate_kernels(plan& p, const graph& g) {
  const auto& kernels = kernel_registry::global();
  for (auto& e : p.nodes) {
    const kernel_def* def = kernels.find(*e.n, e.dev->type());
    if (def == nullptr) (void)kernels.get(*e.n, e.dev->type());  // throws, listing kernels
    e.kernel = def->create(kernel_construction(*e.n, *e.dev, &g));
    e.cheap = e.kernel->is_cheap();
    e.whole_device = e.kernel->uses_all_threads();
    e.blocking = e.kernel->blocks();
  }
  // Note [one team per device]
  // oneDNN's kernels (whole_device) run on OpenMP, which keeps a team of threads for each
  // thread that starts parallel regions, and loom's own kernels split their work on the
  // team of the thread that runs them too (Note [a thread's team] in
  // src/device/thread_pool.cpp). When a node was handed to a pool worker (an expensive
  // node made ready beside another), the chain after it ran there, its products on a second
  // team: two teams, twice the threads for the device's cores, and a transformer at batch 1
  // on 2 threads took 7 ms instead of 4 in most processes. So on a device that runs
  // whole_device kernels every node stays on the thread that made it ready (the run's caller
  // for a chain from the first root): the device's threads work inside each node, on one
  // team, instead of beside each other on the pool.
  std::vector<const device*> team_devices;
  for (const auto& e : p.nodes) {
    if (e.whole_device && std::find(team_devices.begin(), team_devices.end(), e.dev) == team_devices.end()) {
      team_devices.push_back(e.dev);
    }
  }
  for (auto& e : p.nodes) {
    e.keeps_thread = std::find(team_devices.begin(), team_devices.end(), e.dev) != team_devices.end();
  }
  bind_constants(p);
}

std::vector<device_partition> partitions_of(const plan& p,
                                            const std::vector<std::unique_ptr<device>>& devices) {
  std::vector<device_partition> out;
  for (const auto& d : devices) {
    device_partition part{d.get(), {}};
    for (std::size_t i = 0; i < p.nodes.size(); ++i) {
      if (p.nodes[i].dev == d.get()) part.nodes.push_back(static_cast<std::int32_t>(i));
    }
    if (!part.nodes.empty()) out.push_back(std::move(part));
  }
  return out;
}

}  // namespace loom::runtime
