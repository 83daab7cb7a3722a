// session: devices, the graph, plans per signature, variables.
#include "loom/runtime/session.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <unordered_map>

#include "executor.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/memory/device_resources.hpp"
#include "loom/passes/pass_manager.hpp"
#include "plan.hpp"

namespace loom {

using runtime::exec_node;
using runtime::plan;

struct session::impl {
  session_options options;
  graph g;
  /// The passes every plan runs (made once: an unknown pass name fails the constructor).
  passes::pass_manager pipeline;
  std::vector<std::unique_ptr<device>> devices;
  variable_store variables;

  mutable std::shared_mutex plans_mutex;
  std::unordered_map<std::string, std::shared_ptr<const plan>> plans;

  std::mutex active_mutex;
  std::set<std::atomic<bool>*> active;  // cancel flags of runs in progress

  impl(graph graph_in, session_options opts)
      : options(std::move(opts)), g(std::move(graph_in)), pipeline(options.passes) {}

  std::shared_ptr<const plan> get_plan(const std::vector<std::string>& feeds,
                                       const std::vector<std::string>& fetches,
                                       const std::vector<std::string>& targets);
  std::shared_ptr<const plan> build_plan(const std::vector<std::string>& feeds,
                                         const std::vector<std::string>& fetches,
                                         const std::vector<std::string>& targets);
  /// The plan of `sig` over `source`: passes, placement, partitions, kernels.
  std::shared_ptr<plan> plan_graph(const graph& source, const passes::signature& sig,
                                   const passes::pass_manager& pass_pipeline,
                                   const passes::evaluate_fn& evaluate = {}) const;
};

namespace {

std::string signature_key(const std::vector<std::string>& feeds,
                          const std::vector<std::string>& fetches,
                          const std::vector<std::string>& targets) {
  return fmt::format("{}\x1f{}\x1f{}", fmt::join(feeds, "\x1e"), fmt::join(fetches, "\x1e"),
                     fmt::join(targets, "\x1e"));
}

struct endpoint_hash {
  std::size_t operator()(endpoint e) const noexcept {
    return std::hash<std::int64_t>()((static_cast<std::int64_t>(e.node) << 20) ^ e.index);
  }
};

}  // namespace

session::session(graph g, session_options options)
    : impl_(std::make_unique<impl>(std::move(g), std::move(options))) {
  const auto& factories = impl_->options.factories != nullptr ? *impl_->options.factories
                                                              : device_factory_registry::global();
  impl_->devices = factories.create_devices(impl_->options.devices);
  if (impl_->devices.empty())
    throw invalid_argument("session: the device factories made no devices");
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
    const auto constant_plan = plan_graph(sub, {{}, outs, {}}, none);
    std::atomic<bool> never{false};
    return runtime::execute_plan(*constant_plan, {}, variables, {&never, nullptr}, nullptr);
  };
  auto p = plan_graph(g, sig, pipeline, evaluate);
  p->feed_endpoints = sig.feeds;  // check_feed reads the session's graph
  return p;
}

std::shared_ptr<plan> session::impl::plan_graph(const graph& source, const passes::signature& sig,
                                                const passes::pass_manager& pass_pipeline,
                                                const passes::evaluate_fn& evaluate) const {
  auto p = std::make_shared<plan>();
  auto rewritten = pass_pipeline.run(source, sig, evaluate);
  p->g = std::make_unique<graph>(std::move(rewritten.rewritten.g));
  p->pass_log = std::move(rewritten.log);
  const graph& pg = *p->g;
  const std::size_t n = pg.num_nodes();
  std::unordered_map<endpoint, std::int32_t, endpoint_hash> fed;
  for (std::size_t i = 0; i < rewritten.rewritten.feeds.size(); ++i) {
    fed.emplace(rewritten.rewritten.feeds[i], static_cast<std::int32_t>(i));
  }
  const std::vector<endpoint>& fetch_eps = rewritten.rewritten.fetches;
  const passes::signature rsig{rewritten.rewritten.feeds, fetch_eps, rewritten.rewritten.targets};
  const std::vector<bool> needed = passes::needed_nodes(pg, rsig);

  // Place.
  const auto placed = runtime::place_nodes(pg, needed, devices, options, p->placement);
  if (options.log_device_placement) {
    for (const auto& d : p->placement) {
      fmt::print(stderr, "loom placement: {} ({}) -> {}: {}\n", d.node, d.op, d.device, d.reason);
    }
  }

  // Plan nodes and slots. Feeds take the first slots.
  std::vector<std::int32_t> exec_of(n, -1);
  const auto feed_count = static_cast<std::int32_t>(rsig.feeds.size());
  std::int32_t slots = feed_count;
  for (std::int32_t i = 0; i < feed_count; ++i) p->feed_slots.push_back(i);
  for (const node& nd : pg.nodes()) {
    if (!needed[static_cast<std::size_t>(nd.id)]) continue;
    exec_of[static_cast<std::size_t>(nd.id)] = static_cast<std::int32_t>(p->nodes.size());
    exec_node e;
    e.n = &nd;
    e.dev = placed[static_cast<std::size_t>(nd.id)];
    e.first_output = slots;
    slots += static_cast<std::int32_t>(nd.outputs.size());
    p->nodes.push_back(std::move(e));
  }
  std::vector<std::int32_t> producer_of_slot(static_cast<std::size_t>(slots), -1);
  for (std::size_t i = 0; i < p->nodes.size(); ++i) {
    for (std::size_t k = 0; k < p->nodes[i].n->outputs.size(); ++k) {
      producer_of_slot[static_cast<std::size_t>(p->nodes[i].first_output) + k] =
          static_cast<std::int32_t>(i);
    }
  }
  auto slot_of = [&](endpoint e) -> std::int32_t {
    if (auto it = fed.find(e); it != fed.end()) return it->second;
    return p->nodes[static_cast<std::size_t>(exec_of[static_cast<std::size_t>(e.node)])]
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
    p->transfer_nodes.push_back(std::move(t));
    exec_node e;
    e.n = &p->transfer_nodes.back();
    e.dev = dev;
    e.first_output = slots++;
    producer_of_slot.push_back(static_cast<std::int32_t>(p->nodes.size()));
    p->nodes.push_back(std::move(e));
    return static_cast<std::int32_t>(p->nodes.size() - 1);
  };
  device* host_device = nullptr;
  for (const auto& d : devices) {
    if (d->type() == device_type::cpu) {
      host_device = d.get();
      break;
    }
  }
  const std::size_t graph_nodes = p->nodes.size();
  for (std::size_t i = 0; i < graph_nodes; ++i) {
    const node& nd = *p->nodes[i].n;
    device* dst = p->nodes[i].dev;
    for (endpoint e : nd.inputs) {
      std::int32_t s = slot_of(e);
      const std::int32_t producer = producer_of_slot[static_cast<std::size_t>(s)];
      // Fed values live in the caller's memory: a consumer on a device the CPU cannot
      // reach (a GPU) receives them through a copy, as from a node on the host device.
      device* src = producer >= 0 ? p->nodes[static_cast<std::size_t>(producer)].dev
                    : s < feed_count && !is_host_accessible(dst->type()) ? host_device
                                                                         : nullptr;
      if (src != nullptr && src != dst) {
        auto key = std::make_pair(s, static_cast<const device*>(dst));
        auto it = recv_slot.find(key);
        if (it == recv_slot.end()) {
          const tensor_type& type = pg.type_of(e);
          const std::string base = fmt::format("{}_{}", pg.endpoint_name(e), dst->id().index);
          const std::int32_t send =
              add_transfer_node(send_def, "_send/" + base, type, src, "recv_device", dst->name());
          p->nodes[static_cast<std::size_t>(send)].input_slots.push_back(s);
          const std::int32_t recv =
              add_transfer_node(recv_def, "_recv/" + base, type, dst, "send_device", src->name());
          p->nodes[static_cast<std::size_t>(recv)].input_slots.push_back(
              p->nodes[static_cast<std::size_t>(send)].first_output);
          it = recv_slot.emplace(key, p->nodes[static_cast<std::size_t>(recv)].first_output).first;
        }
        s = it->second;
      }
      p->nodes[i].input_slots.push_back(s);
    }
  }

  // Edges: consumers and pending counts; readers per slot.
  p->slot_count = slots;
  p->slot_readers.assign(static_cast<std::size_t>(slots), 0);
  for (std::size_t i = 0; i < p->nodes.size(); ++i) {
    auto& e = p->nodes[i];
    for (std::int32_t s : e.input_slots) {
      ++p->slot_readers[static_cast<std::size_t>(s)];
      const std::int32_t producer = producer_of_slot[static_cast<std::size_t>(s)];
      if (producer >= 0) {
        p->nodes[static_cast<std::size_t>(producer)].consumers.push_back(
            static_cast<std::int32_t>(i));
        ++e.pending;
      }
    }
    if (e.n->id >= 0) {
      for (node_id c : e.n->control_inputs) {
        const std::int32_t producer = exec_of[static_cast<std::size_t>(c)];
        p->nodes[static_cast<std::size_t>(producer)].consumers.push_back(
            static_cast<std::int32_t>(i));
        ++e.pending;
      }
    }
  }
  for (endpoint e : fetch_eps) {
    const std::int32_t s = slot_of(e);
    p->fetch_slots.push_back(s);
    ++p->slot_readers[static_cast<std::size_t>(s)];  // the fetch's hold
  }
  for (std::size_t i = 0; i < p->nodes.size(); ++i) {
    if (p->nodes[i].pending == 0) p->roots.push_back(static_cast<std::int32_t>(i));
  }

  // Kernels, once per plan node.
  const auto& kernels = kernel_registry::global();
  for (auto& e : p->nodes) {
    const kernel_def* def = kernels.find(*e.n, e.dev->type());
    if (def == nullptr) (void)kernels.get(*e.n, e.dev->type());  // throws, listing kernels
    e.kernel = def->create(kernel_construction(*e.n, *e.dev, &pg));
    e.cheap = e.kernel->is_cheap();
    e.whole_device = e.kernel->uses_all_threads();
  }
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
  for (const auto& d : impl_->devices) {
    std::vector<std::string> names;
    for (const auto& e : p->nodes) {
      if (e.dev == d.get()) names.push_back(e.n->name);
    }
    if (!names.empty()) out.emplace_back(d->name(), std::move(names));
  }
  return out;
}

const graph& session::get_graph() const noexcept {
  return impl_->g;
}
const std::vector<std::unique_ptr<device>>& session::devices() const noexcept {
  return impl_->devices;
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
