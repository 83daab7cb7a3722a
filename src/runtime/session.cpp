// session: devices, the graph, plans per signature, variables.
#include "loom/runtime/session.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <unordered_map>

#include "executor.hpp"
#include "loom/core/input.hpp"
#include "loom/distributed/communicator.hpp"
#include "loom/memory/device_resources.hpp"
#include "loom/passes/pass_manager.hpp"
#include "partitioner.hpp"
#include "plan.hpp"

namespace loom {

using runtime::endpoint_hash;
using runtime::plan;

namespace {

// The devices the session's factories make for `o`; at least one.
std::vector<std::unique_ptr<device>> make_devices(const session_options& o) {
  const auto& factories = o.factories != nullptr ? *o.factories : device_factory_registry::global();
  auto devices = factories.create_devices(o.devices);
  if (devices.empty()) throw invalid_argument("session: the device factories made no devices");
  return devices;
}

// The passes' options for a session of `devices`: their device types (the AMP pass asks
// those types' kernels); only CPU kernels read channel blocks (Note [channel blocks]), so
// with another device, where a convolution could be placed, the pass keeps none.
passes::pass_options passes_for(passes::pass_options p, const std::vector<std::unique_ptr<device>>& devices) {
  p.device_types.clear();
  for (const auto& d : devices) {
    if (std::find(p.device_types.begin(), p.device_types.end(), d->type()) == p.device_types.end()) {
      p.device_types.push_back(d->type());
    }
  }
  if (std::any_of(devices.begin(), devices.end(), [](const auto& d) { return d->type() != device_type::cpu; })) {
    p.channel_blocks = false;
  }
  return p;
}

}  // namespace

struct session::impl {
  session_options options;
  graph g;
  std::vector<std::unique_ptr<device>> devices;
  /// The passes every plan runs (made once: an unknown pass name fails the constructor).
  passes::pass_manager pipeline;
  variable_store variables;
  /// The processes of session_options::cluster (one: task 0 of 1).
  runtime::cluster_view cluster;
  /// The session's duplicate of the cluster's communicator, named cluster.group.
  std::unique_ptr<distributed::scoped_group> cluster_group;

  mutable std::shared_mutex plans_mutex;
  std::unordered_map<std::string, std::shared_ptr<const plan>> plans;

  std::mutex active_mutex;
  std::set<std::atomic<bool>*> active;  // cancel flags of runs in progress

  impl(graph graph_in, session_options opts)
      : options(std::move(opts)),
        g(std::move(graph_in)),
        devices(make_devices(options)),
        pipeline(passes_for(options.passes, devices)) {}

  std::shared_ptr<const plan> get_plan(const std::vector<std::string>& feeds,
                                       const std::vector<std::string>& fetches,
                                       const std::vector<std::string>& targets);
  std::shared_ptr<const plan> build_plan(const std::vector<std::string>& feeds,
                                         const std::vector<std::string>& fetches,
                                         const std::vector<std::string>& targets);
  /// The plan of `sig` over `source`: passes, placement, partitions, kernels.
  std::shared_ptr<plan> plan_graph(const graph& source, const passes::signature& sig,
                                   const passes::pass_manager& pass_pipeline,
                                   const runtime::cluster_view& tasks,
                                   const passes::evaluate_fn& evaluate = {}) const;
};

namespace {

std::string signature_key(const std::vector<std::string>& feeds,
                          const std::vector<std::string>& fetches,
                          const std::vector<std::string>& targets) {
  return fmt::format("{}\x1f{}\x1f{}", fmt::join(feeds, "\x1e"), fmt::join(fetches, "\x1e"),
                     fmt::join(targets, "\x1e"));
}

}  // namespace

session::session(graph g, session_options options)
    : impl_(std::make_unique<impl>(std::move(g), std::move(options))) {
  if (impl_->options.cluster != nullptr && impl_->options.cluster->size() > 1) join_cluster();
}

// Note [tasks] in src/runtime/partitioner.cpp: the tasks' device tables, exchanged, and a
// duplicate of the communicator for the transfers, so that their tags meet nobody else's.
void session::join_cluster() {
  auto& c = impl_->cluster;
  const auto& comm = impl_->options.cluster;
  c.task = comm->rank();
  c.tasks = comm->size();
  std::string table;
  for (const auto& d : impl_->devices) {
    table += fmt::format("{} {} {}\n", static_cast<int>(d->type()), d->id().index,
                         d->attributes().description);
  }
  const std::vector<std::string> tables = distributed::all_gather_strings(*comm, table);
  c.remote.resize(static_cast<std::size_t>(c.tasks));
  for (std::int32_t t = 0; t < c.tasks; ++t) {
    if (t == c.task) continue;
    std::string_view rest = tables[static_cast<std::size_t>(t)];
    while (!rest.empty()) {
      const std::string_view line = rest.substr(0, rest.find('\n'));
      rest.remove_prefix(std::min(rest.size(), line.size() + 1));
      const std::size_t a = line.find(' ');
      const std::size_t b = line.find(' ', a + 1);
      const std::string what = fmt::format("task {}'s device table", t);
      const auto type = parse_number<std::int32_t>(line.substr(0, a), what);
      const auto index = parse_number<std::int32_t>(line.substr(a + 1, b - a - 1), what);
      if (!is_valid_device_type(type)) throw parse_error(fmt::format("{}: device type {}", what, type), 0);
      c.remote[static_cast<std::size_t>(t)].push_back(std::make_unique<runtime::remote_device>(
          t, device_id{static_cast<device_type>(type), index},
          std::string(b == std::string_view::npos ? std::string_view() : line.substr(b + 1))));
    }
  }
  c.group = fmt::format("session@{}", static_cast<const void*>(impl_.get()));
  impl_->cluster_group = std::make_unique<distributed::scoped_group>(c.group, comm->split(0, c.task));
}

session::~session() {
  // Variables first: their buffers go back to the devices' pools before the pools go.
  impl_->variables.clear();
  {
    std::unique_lock lock(impl_->plans_mutex);
    impl_->plans.clear();
  }
  // Devices in the reverse order of their making (a vector destroys its elements first to
  // last): a GPU device holds tensors of a CPU device's pool (the sources of copies in
  // flight) until it is destroyed, so the CPU devices, made first, must go last. Destroyed
  // the other way round, the first session of `loom train` on a GPU crashed.
  while (!impl_->devices.empty()) impl_->devices.pop_back();
}

std::shared_ptr<const plan> session::impl::get_plan(const std::vector<std::string>& feeds,
                                                    const std::vector<std::string>& fetches,
                                                    const std::vector<std::string>& targets) {
  const std::string key = signature_key(feeds, fetches, targets);
  {
    std::shared_lock lock(plans_mutex);
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
  }
  auto built = build_plan(feeds, fetches, targets);
  std::unique_lock lock(plans_mutex);
  auto [it, inserted] = plans.emplace(key, std::move(built));
  return it->second;
}

std::shared_ptr<const plan> session::impl::build_plan(const std::vector<std::string>& feeds,
                                                      const std::vector<std::string>& fetches,
                                                      const std::vector<std::string>& targets) {
  // Resolve names.
  passes::signature sig;
  std::unordered_map<endpoint, std::int32_t, endpoint_hash> fed;  // endpoint -> feed index
  for (std::size_t i = 0; i < feeds.size(); ++i) {
    endpoint e;
    try {
      e = g.parse_endpoint(feeds[i]);
    } catch (const not_found& ex) {
      throw not_found(fmt::format("feed '{}': {}", feeds[i], ex.what()));
    }
    if (!fed.emplace(e, static_cast<std::int32_t>(i)).second) {
      throw invalid_argument(fmt::format("feed '{}' is given twice", feeds[i]));
    }
    sig.feeds.push_back(e);
  }
  for (const auto& f : fetches) {
    try {
      sig.fetches.push_back(g.parse_endpoint(f));
    } catch (const not_found& ex) {
      throw not_found(fmt::format("fetch '{}': {}", f, ex.what()));
    }
  }
  for (const auto& t : targets) {
    const node* nd = g.find(t);
    if (nd == nullptr) throw not_found(fmt::format("target '{}': no node of that name", t));
    sig.targets.push_back(nd->id);
  }

  // Every placeholder the signature needs must be fed.
  const std::vector<bool> needed = passes::needed_nodes(g, sig);
  for (const node& nd : g.nodes()) {
    if (needed[static_cast<std::size_t>(nd.id)] && nd.op() == "placeholder") {
      throw invalid_argument(fmt::format(
          "placeholder '{}' ({}{}) needs a feed: the fetches and targets depend on it", nd.name,
          to_string(nd.attr<dtype>("dtype")), to_string(nd.attr<shape>("shape"))));
    }
  }

  // The passes rewrite a copy of what the signature needs (Note [fed values in rewritten
  // graphs]); constant folding evaluates through plans of this session made without them.
  const passes::evaluate_fn evaluate = [this](const graph& sub, const std::vector<endpoint>& outs) {
    static const passes::pass_manager none([] {
      passes::pass_options o;
      o.enabled = false;
      return o;
    }());
    // Each task folds the same constants itself: its own devices only.
    static const runtime::cluster_view alone = [] {
      runtime::cluster_view v;
      v.all_here = true;
      return v;
    }();
    const auto constant_plan = plan_graph(sub, {{}, outs, {}}, none, alone);
    std::atomic<bool> never{false};
    return runtime::execute_plan(*constant_plan, {}, variables, {&never, nullptr}, nullptr);
  };
  auto p = plan_graph(g, sig, pipeline, cluster, evaluate);
  p->feed_endpoints = sig.feeds;  // check_feed reads the session's graph
  return p;
}

std::shared_ptr<plan> session::impl::plan_graph(const graph& source, const passes::signature& sig,
                                                const passes::pass_manager& pass_pipeline,
                                                const runtime::cluster_view& tasks,
                                                const passes::evaluate_fn& evaluate) const {
  auto p = std::make_shared<plan>();
  auto rewritten = pass_pipeline.run(source, sig, evaluate);
  p->g = std::make_unique<graph>(std::move(rewritten.rewritten.g));
  p->pass_log = std::move(rewritten.log);
  const graph& pg = *p->g;
  const passes::signature rsig{rewritten.rewritten.feeds, rewritten.rewritten.fetches,
                               rewritten.rewritten.targets};
  const std::vector<bool> needed = passes::needed_nodes(pg, rsig);

  // Place.
  std::vector<std::int32_t> task_of;
  const auto placed =
      runtime::place_nodes(pg, needed, devices, options, tasks, task_of, p->placement);
  if (options.log_device_placement) {
    for (const auto& d : p->placement) {
      fmt::print(stderr, "loom placement: {} ({}) -> {}: {}\n", d.node, d.op, d.device, d.reason);
    }
  }

  // Partition (src/runtime/partitioner.cpp): fed values reaching a device the CPU cannot
  // read come from the first CPU device.
  device* host_device = nullptr;
  for (const auto& d : devices) {
    if (d->type() == device_type::cpu) {
      host_device = d.get();
      break;
    }
  }
  runtime::partition({.g = pg,
                      .needed = needed,
                      .placement = placed,
                      .sig = rsig,
                      .host = host_device,
                      .cluster = &tasks,
                      .task_of = &task_of},
                     *p);

  // Kernels, once per plan node.
  runtime::instantiate_kernels(*p, pg);
  return p;
}

namespace {

void check_feed(const graph& g, const std::string& name, endpoint e, const tensor& value) {
  const tensor_type& want = g.type_of(e);
  if (!value.defined()) throw invalid_argument(fmt::format("feed '{}' is an empty tensor", name));
  if (value.type() != want.type) {
    throw invalid_argument(fmt::format("feed '{}' is {} but node {} expects {}", name,
                                       value.describe(), g.at(e.node).describe(), to_string(want)));
  }
  if (!want.shape) return;
  bool ok = want.shape->rank() == value.rank();
  for (std::size_t i = 0; ok && i < value.rank(); ++i) {
    ok = (*want.shape)[i] < 0 || (*want.shape)[i] == value.dim(i);
  }
  if (!ok) {
    throw invalid_argument(fmt::format("feed '{}' has shape {} but node {} expects {}", name,
                                       to_string(value.shape()), g.at(e.node).describe(),
                                       to_string(want)));
  }
}

}  // namespace

std::vector<tensor> session::run(const std::vector<feed>& feeds,
                                 const std::vector<std::string>& fetches,
                                 const std::vector<std::string>& targets, run_metadata* metadata,
                                 const run_options& options) {
  std::vector<std::string> feed_names;
  feed_names.reserve(feeds.size());
  for (const auto& f : feeds) feed_names.push_back(f.first);
  const auto p = impl_->get_plan(feed_names, fetches, targets);

  std::vector<tensor> values;
  values.reserve(feeds.size());
  for (std::size_t i = 0; i < feeds.size(); ++i) {
    check_feed(impl_->g, feeds[i].first, p->feed_endpoints[i], feeds[i].second);
    values.push_back(feeds[i].second);
  }

  // This run's cancel flag: set by cancel(), or mirrored from the caller's.
  std::atomic<bool> cancelled{false};
  {
    std::lock_guard lock(impl_->active_mutex);
    impl_->active.insert(&cancelled);
  }
  struct unregister {
    impl* s;
    std::atomic<bool>* flag;
    ~unregister() {
      std::lock_guard lock(s->active_mutex);
      s->active.erase(flag);
    }
  } guard{impl_.get(), &cancelled};

  if (metadata != nullptr && options.trace) {
    for (const auto& d : p->placement) {
      metadata->placement.push_back(fmt::format("{} -> {} ({})", d.node, d.device, d.reason));
    }
  }
  auto result =
      runtime::execute_plan(*p, std::move(values), impl_->variables, {&cancelled, options.cancel},
                            options.trace ? metadata : nullptr);
  return result;
}

void session::cancel() {
  std::lock_guard lock(impl_->active_mutex);
  for (auto* flag : impl_->active) flag->store(true, std::memory_order_relaxed);
}

std::vector<placement_decision> session::explain_placement(
    const std::vector<std::string>& feeds, const std::vector<std::string>& fetches,
    const std::vector<std::string>& targets) {
  return impl_->get_plan(feeds, fetches, targets)->placement;
}

std::vector<passes::pass_record> session::explain_passes(const std::vector<std::string>& feeds,
                                                         const std::vector<std::string>& fetches,
                                                         const std::vector<std::string>& targets) {
  return impl_->get_plan(feeds, fetches, targets)->pass_log;
}

const graph& session::planned_graph(const std::vector<std::string>& feeds,
                                    const std::vector<std::string>& fetches,
                                    const std::vector<std::string>& targets) {
  // The plan stays in the session's cache for the session's life, and its graph with it.
  return *impl_->get_plan(feeds, fetches, targets)->g;
}

std::vector<std::pair<std::string, std::vector<std::string>>> session::partitions(
    const std::vector<std::string>& feeds, const std::vector<std::string>& fetches,
    const std::vector<std::string>& targets) {
  const auto p = impl_->get_plan(feeds, fetches, targets);
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const auto& part : runtime::partitions_of(*p, impl_->devices)) {
    std::vector<std::string> names;
    names.reserve(part.nodes.size());
    for (std::int32_t i : part.nodes)
      names.push_back(p->nodes[static_cast<std::size_t>(i)].n->name);
    out.emplace_back(part.dev->name(), std::move(names));
  }
  return out;
}

const graph& session::get_graph() const noexcept {
  return impl_->g;
}
const std::vector<std::unique_ptr<device>>& session::devices() const noexcept {
  return impl_->devices;
}

std::vector<std::string> session::cluster_devices() const {
  std::vector<std::string> out;
  const auto& c = impl_->cluster;
  for (std::int32_t t = 0; t < c.tasks; ++t) {
    if (t == c.task) {
      for (const auto& d : impl_->devices) out.push_back(task_device_name(t, d->id()));
    } else {
      for (const auto& d : c.remote[static_cast<std::size_t>(t)]) out.push_back(d->name());
    }
  }
  return out;
}

device& session::find_device(std::string_view name) const {
  const device_id id = parse_device_id(name);
  for (const auto& d : impl_->devices) {
    if (d->id() == id) return *d;
  }
  std::vector<std::string> names;
  for (const auto& d : impl_->devices) names.push_back(d->name());
  throw not_found(
      fmt::format("no device '{}' in this session (devices: {})", name, fmt::join(names, ", ")));
}

tensor session::host_value(const tensor& t) const {
  if (!t.defined() || is_host_accessible(t.device().type)) return t;
  return find_device(to_string(t.device()))
      .copy_to_host(t, memory::get_device_resource(device_id{device_type::cpu, 0}));
}

variable_store& session::variables() noexcept {
  return impl_->variables;
}

std::size_t session::plan_count() const {
  std::shared_lock lock(impl_->plans_mutex);
  return impl_->plans.size();
}

}  // namespace loom
