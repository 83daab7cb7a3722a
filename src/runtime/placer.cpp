// The placer: a device for every node.
//
// Rules, in order (docs/runtime.md, "Placement"):
// 1. Colocation. A node whose op names an input to stay with (assign and friends: the
//    variable they update) joins that producer's group; a group is placed as one.
// 2. Explicit request. A group's requests ("/device:CPU:1", "cpu", "cuda:0") narrow the
//    candidates; conflicting requests within a group are an error. A request that no
//    device meets is an error unless soft placement is on, which then ignores it.
// 3. Kernel availability. Only devices with a kernel for every node of the group remain.
// 4. Priority. The first remaining device in priority order: GPUs before CPUs, lower
//    indices first.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "loom/core/device_id.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/memory/memory_resource.hpp"
#include "plan.hpp"

namespace loom::runtime {
namespace {

int type_rank(device_type t) {
  return t == device_type::cuda ? 0 : t == device_type::cpu ? 1 : 2;
}

struct union_find {
  std::vector<node_id> parent;
  explicit union_find(std::size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  node_id find(node_id x) {
    while (parent[static_cast<std::size_t>(x)] != x) {
      parent[static_cast<std::size_t>(x)] =
          parent[static_cast<std::size_t>(parent[static_cast<std::size_t>(x)])];
      x = parent[static_cast<std::size_t>(x)];
    }
    return x;
  }
  void unite(node_id a, node_id b) {
    a = find(a);
    b = find(b);
    if (a != b) parent[static_cast<std::size_t>(std::max(a, b))] = std::min(a, b);
  }
};

std::string names_of(const std::vector<device*>& devices) {
  std::vector<std::string> names;
  for (const device* d : devices) names.push_back(d->name());
  return names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace

remote_device::remote_device(std::int32_t task, device_id id, std::string description)
    : device(device_attributes{task_device_name(task, id), id, 0, 0, std::move(description)}),
      task_(task) {}

memory::memory_resource& remote_device::allocator() {
  throw error(fmt::format("{} is another process's device: nothing is allocated on it here",
                          name()));
}

std::vector<device*> place_nodes(const graph& g, const std::vector<bool>& needed,
                                 const std::vector<std::unique_ptr<device>>& devices,
                                 const session_options& options, const cluster_view& cluster,
                                 std::vector<std::int32_t>& task_of,
                                 std::vector<placement_decision>& decisions) {
  const auto& registry = kernel_registry::global();
  const std::size_t n = g.num_nodes();
  task_of.assign(n, -1);

  // The devices of each task in priority order: this process's own, or another's stand-ins.
  const auto by_priority = [](const std::vector<std::unique_ptr<device>>& list) {
    std::vector<device*> out;
    for (const auto& d : list) out.push_back(d.get());
    std::stable_sort(out.begin(), out.end(), [](const device* a, const device* b) {
      if (type_rank(a->type()) != type_rank(b->type()))
        return type_rank(a->type()) < type_rank(b->type());
      return a->id().index < b->id().index;
    });
    return out;
  };
  const std::vector<device*> ordered = by_priority(devices);
  // In a session of several tasks, this task's devices too go by their names across tasks.
  const auto name_of = [&](const device* d) {
    return cluster.tasks > 1 && dynamic_cast<const remote_device*>(d) == nullptr
               ? task_device_name(cluster.task, d->id())
               : d->name();
  };
  // Each other task's stand-ins in priority order, sorted once.
  std::vector<std::vector<device*>> remote_ordered;
  for (const auto& r : cluster.remote) remote_ordered.push_back(by_priority(r));
  const auto devices_of_task = [&](std::int32_t task) -> const std::vector<device*>& {
    return task == cluster.task || static_cast<std::size_t>(task) >= remote_ordered.size()
               ? ordered
               : remote_ordered[static_cast<std::size_t>(task)];
  };

  // Colocation groups, over the whole graph so that a variable lands on the same device
  // in every plan, whichever of its readers and writers the plan holds.
  union_find groups(n);
  for (const node& nd : g.nodes()) {
    const int k = nd.def->colocate_with_input;
    if (k >= 0 && static_cast<std::size_t>(k) < nd.inputs.size()) {
      groups.unite(nd.id, nd.inputs[static_cast<std::size_t>(k)].node);
    }
    if (!nd.def->colocate_with_attr.empty()) {
      const auto it = nd.attrs.find(nd.def->colocate_with_attr);
      const node* other = it == nd.attrs.end() || it->second.type() != attr_type::string
                              ? nullptr
                              : g.find(it->second.as<std::string>());
      if (other == nullptr) {
        throw not_found(fmt::format("node {}: attribute '{}' names no node of the graph",
                                    nd.describe(), nd.def->colocate_with_attr));
      }
      groups.unite(nd.id, other->id);
    }
  }
  std::vector<std::vector<node_id>> members(n);
  for (const node& nd : g.nodes())
    members[static_cast<std::size_t>(groups.find(nd.id))].push_back(nd.id);

  std::vector<device*> placed(n, nullptr);
  std::vector<device*> group_device(n, nullptr);
  for (const node& nd : g.nodes()) {
    if (!needed[static_cast<std::size_t>(nd.id)]) continue;
    const node_id root = groups.find(nd.id);
    if (device* d = group_device[static_cast<std::size_t>(root)]; d != nullptr) {
      placed[static_cast<std::size_t>(nd.id)] = d;
      task_of[static_cast<std::size_t>(nd.id)] = task_of[static_cast<std::size_t>(root)];
      decisions.push_back(
          {nd.name, nd.op(), name_of(d), fmt::format("colocated with {}", g.at(root).describe())});
      continue;
    }
    const auto& group = members[static_cast<std::size_t>(root)];
    auto who = [&] {
      return group.size() == 1 ? fmt::format("node {}", nd.describe())
                               : fmt::format("node {} and the {} nodes colocated with it",
                                             nd.describe(), group.size() - 1);
    };

    // Requests of the group.
    std::string request;
    std::string request_from;
    task_request asked;
    for (node_id m : group) {
      const node& mn = g.at(m);
      if (mn.requested_device.empty()) continue;
      task_request spec;
      try {
        spec = parse_task_request(mn.requested_device);
      } catch (const invalid_argument& e) {
        throw invalid_argument(fmt::format("node {}: {}", mn.describe(), e.what()));
      }
      if (!request.empty() && (asked.task != spec.task || asked.device != spec.device)) {
        if (!options.allow_soft_placement) {
          throw invalid_argument(
              fmt::format("cannot place {}: '{}' asks for {} but colocated '{}' asks for {}", who(),
                          request_from, request, mn.name, mn.requested_device));
        }
        continue;  // soft placement: the first request wins
      }
      request = mn.requested_device;
      request_from = mn.name;
      asked = spec;
    }

    // The task: another process's devices when the request names one (Note [tasks] in
    // src/runtime/partitioner.cpp).
    if (cluster.all_here) asked.task.reset();
    if (asked.task && *asked.task >= cluster.tasks) {
      throw invalid_argument(fmt::format(
          "cannot place {}: '{}' asks for task {}, but the session's processes are {} "
          "(session_options::cluster{})",
          who(), request, *asked.task,
          cluster.tasks == 1 ? std::string("task 0 alone")
                             : fmt::format("tasks 0 to {}", cluster.tasks - 1),
          cluster.tasks == 1 ? ": a session of several processes is made under mpirun" : ""));
    }
    const std::int32_t task = asked.task.value_or(-1);
    const std::vector<device*>& here = task < 0 ? ordered : devices_of_task(task);
    std::vector<device*> candidates = here;
    std::string reason;
    if (!request.empty()) {
      std::vector<device*> matching;
      for (device* d : here) {
        if (asked.device.matches(d->id())) matching.push_back(d);
      }
      if (matching.empty()) {
        if (!options.allow_soft_placement) {
          throw invalid_argument(fmt::format(
              "cannot place {}: requested device '{}' does not exist (devices: {}); enable "
              "allow_soft_placement to place it elsewhere",
              who(), request, names_of(here)));
        }
        reason = fmt::format("requested '{}', which does not exist; soft placement: ", request);
      } else {
        candidates = std::move(matching);
        reason =
            fmt::format("requested '{}'{}", request,
                        request_from == nd.name ? "" : fmt::format(" (by '{}')", request_from));
      }
    }

    // Kernel availability for every member of the group.
    auto runs_all = [&](const device* d) {
      return std::all_of(group.begin(), group.end(),
                         [&](node_id m) { return registry.find(g.at(m), d->type()) != nullptr; });
    };
    std::vector<device*> able;
    for (device* d : candidates) {
      if (runs_all(d)) able.push_back(d);
    }
    if (able.empty() && !request.empty() && options.allow_soft_placement) {
      for (device* d : here) {
        if (runs_all(d)) able.push_back(d);
      }
      reason = fmt::format("requested '{}', which has no kernel for it; soft placement: ", request);
    }
    if (able.empty()) {
      // The registry's error lists the kernels that exist.
      for (node_id m : group) {
        for (device* d : candidates) (void)registry.get(g.at(m), d->type());
      }
      throw invalid_argument(fmt::format("cannot place {}: no device among {} has its kernels",
                                         who(), names_of(candidates)));
    }
    device* chosen = able.front();
    if (reason.empty() || reason.ends_with(": ")) {
      // Name why the devices before it were passed over (per node, so a GPU falling back to
      // the CPU says which op had no kernel there).
      std::string passed_over;
      for (device* d : here) {
        if (d == chosen) break;
        if (d->type() == chosen->type()) continue;
        for (node_id m : group) {
          if (registry.find(g.at(m), d->type()) == nullptr) {
            passed_over = fmt::format("; {} has no {} kernel for {}", d->name(),
                                      to_string(d->type()), g.at(m).describe());
            break;
          }
        }
        if (!passed_over.empty()) break;
      }
      reason += able.size() == here.size()
                    ? "the highest-priority device"
                    : "the highest-priority device with a kernel" + passed_over;
    }
    placed[static_cast<std::size_t>(nd.id)] = chosen;
    group_device[static_cast<std::size_t>(root)] = chosen;
    task_of[static_cast<std::size_t>(nd.id)] = task;
    task_of[static_cast<std::size_t>(root)] = task;
    decisions.push_back({nd.name, nd.op(), name_of(chosen), reason});
  }
  return placed;
}

}  // namespace loom::runtime
