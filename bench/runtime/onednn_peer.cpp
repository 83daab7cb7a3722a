#include "runtime/onednn_peer.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>

#include "bench_stats.hpp"
#include "loom/device/cpu_device.hpp"
#include "loom/graph/graph.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/kernel/variable_store.hpp"

namespace loom::bench {
namespace {

void fill_random(float* p, std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0F, 1.0F);
  for (std::size_t i = 0; i < n; ++i) p[i] = d(rng);
}

// ---- the peer: oneDNN as its users call it -----------------------------------------------

class direct_onednn {
 public:
  virtual ~direct_onednn() = default;
  void run() {
    for (auto& r : before_) r.prim.execute(stream_, r.from, r.to);
    primitive_.execute(stream_, args_);
    for (auto& r : after_) r.prim.execute(stream_, r.from, r.to);
    stream_.wait();
  }
  [[nodiscard]] const std::string& implementation() const { return implementation_; }

 protected:
  explicit direct_onednn(int threads) : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
    omp_set_num_threads(threads);
  }
  dnnl::memory make_memory(const dnnl::memory::desc& md, unsigned seed) {
    dnnl::memory m(md, engine_);
    fill_random(static_cast<float*>(m.get_data_handle()), md.get_size() / sizeof(float), seed);
    return m;
  }

  // A reorder between the user's plain buffer and the layout the primitive chose.
  struct staged {
    dnnl::reorder prim;
    dnnl::memory from, to;
  };
  // The argument `arg` of the primitive in layout `chosen`, over user data in `plain`: the
  // memory the primitive gets, with a reorder before the primitive (inputs) or after it
  // (outputs) when the layouts differ.
  dnnl::memory stage(const dnnl::memory::desc& plain, const dnnl::memory::desc& chosen, bool output,
                     unsigned seed) {
    dnnl::memory user = make_memory(plain, seed);
    if (chosen == plain) return user;
    dnnl::memory inner(chosen, engine_);
    if (output) {
      after_.push_back({dnnl::reorder(inner, user), inner, user});
    } else {
      before_.push_back({dnnl::reorder(user, inner), user, inner});
    }
    return inner;
  }

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::vector<staged> before_, after_;
  dnnl::primitive primitive_;
  std::unordered_map<int, dnnl::memory> args_;
  std::string implementation_;
};

class direct_matmul final : public direct_onednn {
 public:
  direct_matmul(int n, int threads) : direct_onednn(threads) {
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::dims d{n, n};
    const dnnl::memory::desc md(d, dnnl::memory::data_type::f32, tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), engine_);
    primitive_ = dnnl::matmul(pd);
    implementation_ = pd.impl_info_str();
    args_ = {{DNNL_ARG_SRC, make_memory(md, 1)},
             {DNNL_ARG_WEIGHTS, make_memory(md, 2)},
             {DNNL_ARG_DST, make_memory(md, 3)}};
  }
};

class direct_conv2d final : public direct_onednn {
 public:
  direct_conv2d(const conv2d_case& c, int threads) : direct_onednn(threads) {
    using tag = dnnl::memory::format_tag;
    constexpr auto f32 = dnnl::memory::data_type::f32;
    const dnnl::memory::dim pad = c.kernel / 2;
    const dnnl::memory::dim out = c.size + 2 * pad - c.kernel + 1;
    const dnnl::memory::desc src({c.n, c.channels, c.size, c.size}, f32, tag::nchw);
    const dnnl::memory::desc wei({c.filters, c.channels, c.kernel, c.kernel}, f32, tag::oihw);
    const dnnl::memory::desc dst({c.n, c.filters, out, out}, f32, tag::nchw);
    // As oneDNN recommends for NCHW data: the primitive picks its layouts (tag::any), and
    // the call reorders the input and weights into them and the output back, every call.
    const auto any = [](const dnnl::memory::desc& md) {
      return dnnl::memory::desc(md.dims(), md.data_type(), tag::any);
    };
    const dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference,
                                               dnnl::algorithm::convolution_direct, any(src),
                                               any(wei), any(dst), {1, 1}, {pad, pad}, {pad, pad});
    const dnnl::convolution_forward::primitive_desc pd(desc, engine_);
    primitive_ = dnnl::convolution_forward(pd);
    implementation_ = pd.impl_info_str();
    args_ = {{DNNL_ARG_SRC, stage(src, pd.src_desc(), false, 1)},
             {DNNL_ARG_WEIGHTS, stage(wei, pd.weights_desc(), false, 2)},
             {DNNL_ARG_DST, stage(dst, pd.dst_desc(), true, 3)}};
  }
};

// ---- loom: the node's kernel, called as the executor calls it --------------------------

class loom_kernel_runner {
 public:
  loom_kernel_runner(int threads, const std::function<output(graph_builder&)>& build,
                     const std::vector<shape>& input_shapes)
      : device_(0, threads, 0, "bench device") {
    graph_builder b(graph_);
    const node& n = graph_.get(build(b).producer().name);
    node_ = &n;
    kernel_ = kernel_registry::global()
                  .get(n, device_type::cpu)
                  .create(kernel_construction(n, device_, &graph_));
    unsigned seed = 1;
    for (const auto& s : input_shapes) {
      tensor t = device_.allocate(dtype::f32, s);
      fill_random(t.data<float>(), static_cast<std::size_t>(t.num_elements()), seed++);
      inputs_.push_back(std::move(t));
    }
  }
  void run() {
    std::vector<tensor> in = inputs_;
    std::vector<tensor> out(1);
    kernel_context ctx(*node_, device_, in, out, &variables_, nullptr);
    kernel_->compute(ctx);
  }

 private:
  cpu_device device_;
  graph graph_;
  const node* node_ = nullptr;
  std::unique_ptr<op_kernel> kernel_;
  std::vector<tensor> inputs_;
  variable_store variables_;
};

std::unique_ptr<loom_kernel_runner> loom_matmul(int n, int threads) {
  const std::int64_t d = n;
  return std::make_unique<loom_kernel_runner>(
      threads,
      [d](graph_builder& b) {
        return ops::matmul(ops::placeholder(b, "a", dtype::f32, {d, d}),
                           ops::placeholder(b, "b", dtype::f32, {d, d}));
      },
      std::vector<shape>{{d, d}, {d, d}});
}

std::unique_ptr<loom_kernel_runner> loom_conv2d(const conv2d_case& c, int threads) {
  const shape xs{c.n, c.channels, c.size, c.size};
  const shape ws{c.filters, c.channels, c.kernel, c.kernel};
  const std::int64_t pad = c.kernel / 2;
  return std::make_unique<loom_kernel_runner>(
      threads,
      [&](graph_builder& b) {
        return ops::conv2d(ops::placeholder(b, "x", dtype::f32, xs),
                           ops::placeholder(b, "w", dtype::f32, ws),
                           {.strides = {1, 1}, .padding = {pad, pad, pad, pad}});
      },
      std::vector<shape>{xs, ws});
}

// Median seconds of `f` over `repetitions` calls after two warm-up calls.
double time_median(const std::function<void()>& f, int repetitions) {
  f();
  f();
  std::vector<double> t;
  for (int i = 0; i < repetitions; ++i) t.push_back(seconds_of(f));
  return median(std::move(t));
}

// Both in alternation: medians of direct and loom.
kernel_peer_result compare(std::string name, double flop, direct_onednn& direct,
                           loom_kernel_runner& loom, int repetitions) {
  repetitions = std::max(repetitions, 1);
  for (int i = 0; i < 2; ++i) {
    direct.run();
    loom.run();
  }
  std::vector<double> td;
  std::vector<double> tl;
  for (int i = 0; i < repetitions; ++i) {
    // Alternate which goes first, so neither always runs on a cache the other warmed.
    if (i % 2 == 0) {
      td.push_back(seconds_of([&] { direct.run(); }));
      tl.push_back(seconds_of([&] { loom.run(); }));
    } else {
      tl.push_back(seconds_of([&] { loom.run(); }));
      td.push_back(seconds_of([&] { direct.run(); }));
    }
  }
  kernel_peer_result r;
  r.name = std::move(name);
  r.flop = flop;
  r.direct_best_seconds = *std::min_element(td.begin(), td.end());
  r.loom_best_seconds = *std::min_element(tl.begin(), tl.end());
  r.best_ratio = r.direct_best_seconds / r.loom_best_seconds;
  r.direct_seconds = median(std::move(td));
  r.loom_seconds = median(std::move(tl));
  r.direct_gflops = flop / r.direct_seconds / 1e9;
  r.loom_gflops = flop / r.loom_seconds / 1e9;
  r.ratio = r.loom_gflops / r.direct_gflops;
  r.implementation = direct.implementation();
  return r;
}

double matmul_flop(int n) {
  return 2.0 * n * n * static_cast<double>(n);
}

double conv_flop(const conv2d_case& c) {
  const double out = c.size + 2 * (c.kernel / 2) - c.kernel + 1;
  return 2.0 * c.n * c.filters * out * out * c.channels * c.kernel * c.kernel;
}

std::string conv_name(const conv2d_case& c) {
  return fmt::format("conv2d f32 {}x{}x{}x{} * {}x{}x{}x{} pad {}", c.n, c.channels, c.size, c.size,
                     c.filters, c.channels, c.kernel, c.kernel, c.kernel / 2);
}

}  // namespace

bool runtime_kernel_results::met() const {
  return std::all_of(results.begin(), results.end(),
                     [this](const kernel_peer_result& r) { return r.ratio >= target_ratio; });
}

double time_onednn_matmul(int n, int threads, int repetitions) {
  direct_matmul p(n, threads);
  return time_median([&] { p.run(); }, repetitions);
}

double time_loom_matmul(int n, int threads, int repetitions) {
  auto l = loom_matmul(n, threads);
  return time_median([&] { l->run(); }, repetitions);
}

double time_onednn_conv2d(const conv2d_case& c, int threads, int repetitions) {
  direct_conv2d p(c, threads);
  return time_median([&] { p.run(); }, repetitions);
}

double time_loom_conv2d(const conv2d_case& c, int threads, int repetitions) {
  auto l = loom_conv2d(c, threads);
  return time_median([&] { l->run(); }, repetitions);
}

runtime_kernel_results run_kernel_peers(int threads, int repetitions, bool quick) {
  runtime_kernel_results r;
  r.threads = threads;
  r.repetitions = repetitions;
  std::vector<int> sizes{1024};
  if (!quick) sizes.push_back(2048);
  for (const int n : sizes) {
    direct_matmul direct(n, threads);
    auto loom = loom_matmul(n, threads);
    r.results.push_back(compare(fmt::format("matmul f32 {0}x{0}x{0}", n), matmul_flop(n), direct,
                                *loom, repetitions));
  }
  std::vector<conv2d_case> convs;
  if (quick) {
    convs.push_back({.n = 1, .channels = 64, .filters = 64, .size = 56, .kernel = 3});
  } else {
    convs.push_back({.n = 8, .channels = 64, .filters = 64, .size = 56, .kernel = 3});
    convs.push_back({.n = 8, .channels = 128, .filters = 128, .size = 28, .kernel = 3});
  }
  for (const auto& c : convs) {
    direct_conv2d direct(c, threads);
    auto loom = loom_conv2d(c, threads);
    r.results.push_back(compare(conv_name(c), conv_flop(c), direct, *loom, repetitions));
  }
  return r;
}

std::string to_text(const runtime_kernel_results& r) {
  std::string s = fmt::format(
      "kernels against direct oneDNN calls ({} threads, median of {}; target loom/direct >= "
      "{:.2f})\n",
      r.threads, r.repetitions, r.target_ratio);
  s += fmt::format("  {:<44} {:>12} {:>12} {:>7} {:>7}  {}\n", "workload", "oneDNN GF/s",
                   "loom GF/s", "ratio", "best", "oneDNN implementation");
  for (const auto& k : r.results) {
    s += fmt::format("  {:<44} {:>12.1f} {:>12.1f} {:>7.3f} {:>7.3f}  {}{}\n", k.name,
                     k.direct_gflops, k.loom_gflops, k.ratio, k.best_ratio, k.implementation,
                     k.ratio >= r.target_ratio ? "" : "  (below target)");
  }
  s += "  (ratio: of the medians; best: of the fastest calls)\n";
  return s;
}

nlohmann::json to_json(const runtime_kernel_results& r) {
  nlohmann::json j;
  j["threads"] = r.threads;
  j["repetitions"] = r.repetitions;
  j["target_ratio"] = r.target_ratio;
  j["met"] = r.met();
  j["results"] = nlohmann::json::array();
  for (const auto& k : r.results) {
    j["results"].push_back({{"name", k.name},
                            {"flop", k.flop},
                            {"direct_seconds", k.direct_seconds},
                            {"loom_seconds", k.loom_seconds},
                            {"direct_gflops", k.direct_gflops},
                            {"loom_gflops", k.loom_gflops},
                            {"ratio", k.ratio},
                            {"direct_best_seconds", k.direct_best_seconds},
                            {"loom_best_seconds", k.loom_best_seconds},
                            {"best_ratio", k.best_ratio},
                            {"implementation", k.implementation}});
  }
  return j;
}

}  // namespace loom::bench
