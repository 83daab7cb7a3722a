// The partitioner: plan nodes and slots for a placed graph, a _send/_recv pair on every
// edge that crosses devices, the edges each node waits for and the readers of each slot;
// then the kernels, one per plan node.
#include "partitioner.hpp"

#include <fmt/format.h>

#include <map>
#include <string>
#include <unordered_map>
#include <utility>

#include "loom/kernel/kernel_registry.hpp"

namespace loom::runtime {

void partition(const placed_graph& in, plan& p) {
  const graph& pg = in.g;
  const std::size_t n = pg.num_nodes();
  std::unordered_map<endpoint, std::int32_t, endpoint_hash> fed;
  for (std::size_t i = 0; i < in.sig.feeds.size(); ++i) {
    fed.emplace(in.sig.feeds[i], static_cast<std::int32_t>(i));
  }

  // Plan nodes and slots. Feeds take the first slots.
  std::vector<std::int32_t> exec_of(n, -1);
  const auto feed_count = static_cast<std::int32_t>(in.sig.feeds.size());
  std::int32_t slots = feed_count;
  for (std::int32_t i = 0; i < feed_count; ++i) p.feed_slots.push_back(i);
  for (const node& nd : pg.nodes()) {
    if (!in.needed[static_cast<std::size_t>(nd.id)]) continue;
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
  auto slot_of = [&](endpoint e) -> std::int32_t {
    if (auto it = fed.find(e); it != fed.end()) return it->second;
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
}

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
