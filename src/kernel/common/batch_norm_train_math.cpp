// The host arithmetic of the training batch norm kernels (batch_norm_train_math.hpp).
#include "batch_norm_train_math.hpp"

#include <fmt/format.h>

#include "loom/core/dtype.hpp"

namespace loom::common::batch_norm_train {
namespace {

template <class V>
double to_double(V v) {
  if constexpr (std::is_same_v<V, half> || std::is_same_v<V, bfloat16>) {
    return static_cast<double>(static_cast<float>(v));
  } else {
    return static_cast<double>(v);
  }
}

// x's geometry (input `x_input`, channels where `format` puts them) with the per-channel
// vectors `params` named `names`; a rule's failure fails the node.
rules::batch_norm_geometry geometry(const kernel_context& ctx, std::size_t x_input,
                                    const std::array<const shape*, 4>& params,
                                    const std::array<const char*, 4>& names,
                                    const std::string& format) {
  return apply_rule(ctx, [&] {
    const shape& x = ctx.input(x_input).shape();
    return rules::batch_norm_geometry_of(x, params, rules::batch_norm_channel_axis(format, x.rank()),
                                         names);
  });
}

}  // namespace

std::vector<double> read_vector(const tensor& host) {
  std::vector<double> v(static_cast<std::size_t>(host.num_elements()));
  visit_dtype(host.type(), [&](auto tag) {
    using V = decltype(tag);
    if constexpr (std::is_floating_point_v<V> || std::is_same_v<V, half> ||
                  std::is_same_v<V, bfloat16>) {
      const V* p = host.data<V>();
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = to_double(p[i]);
    }
  });
  return v;
}

void write_vector(tensor& host, const std::vector<double>& v) {
  visit_dtype(host.type(), [&](auto tag) {
    using V = decltype(tag);
    if constexpr (std::is_floating_point_v<V>) {
      V* p = host.data<V>();
      for (std::size_t i = 0; i < v.size(); ++i) p[i] = static_cast<V>(v[i]);
    } else if constexpr (std::is_same_v<V, half> || std::is_same_v<V, bfloat16>) {
      V* p = host.data<V>();
      for (std::size_t i = 0; i < v.size(); ++i) p[i] = V(static_cast<float>(v[i]));
    }
  });
}

rules::batch_norm_geometry forward_geometry(const kernel_context& ctx, const std::string& format) {
  return geometry(ctx, 0,
                  {&ctx.input(1).shape(), &ctx.input(2).shape(), &ctx.input(3).shape(),
                   &ctx.input(4).shape()},
                  {"scale", "bias", "running_mean", "running_var"}, format);
}

rules::batch_norm_geometry stats_geometry(const kernel_context& ctx, const std::string& format) {
  return geometry(ctx, 0, {}, rules::batch_norm_param_names, format);
}

rules::batch_norm_geometry backward_geometry(const kernel_context& ctx, const std::string& format) {
  const auto g = geometry(
      ctx, 1, {&ctx.input(2).shape(), &ctx.input(3).shape(), &ctx.input(4).shape(), nullptr},
      {"scale", "mean", "invstd", ""}, format);
  apply_rule(ctx, [&] { rules::check_batch_norm_dy(ctx.input(0).shape(), ctx.input(1).shape()); });
  return g;
}

backward_part backward_part_of(const kernel_construction& c) {
  const std::string& op = c.node().op();
  return op == "batch_norm_grad_reduce"  ? backward_part::reduce
         : op == "batch_norm_grad_elemt" ? backward_part::elemt
                                         : backward_part::whole;
}

void merge(statistics& s, double nb, const double* mean, const double* m2) {
  if (nb <= 0) return;
  const double total = s.count + nb;
  const double f = nb / total;
  const double h = s.count * nb / total;
  for (std::size_t c = 0; c < s.mean.size(); ++c) {
    const double d = mean[c] - s.mean[c];
    s.mean[c] += d * f;
    s.m2[c] += m2[c] + d * d * h;
  }
  s.count = total;
}

statistics zero_statistics(std::int64_t channels, double count) {
  statistics s;
  s.mean.assign(static_cast<std::size_t>(channels), 0.0);
  s.m2.assign(s.mean.size(), 0.0);
  s.count = count;
  return s;
}

statistics merge_gathered(const kernel_context& ctx, const tensor& gathered,
                          std::int64_t channels) {
  apply_rule(ctx, [&] {
    rules::check_batch_norm_packed(gathered.shape(), channels, true, "the gathered statistics");
  });
  const std::vector<double> rows = read_vector(gathered);
  const std::int64_t ranks = gathered.shape()[0];
  const std::int64_t w = 2 * channels + 1;
  statistics s = zero_statistics(channels);
  std::vector<double> n(static_cast<std::size_t>(ranks));
  for (std::int64_t r = 0; r < ranks; ++r) {
    const double nr = rows[static_cast<std::size_t>(r * w)];
    if (!(nr >= 0) || nr != std::floor(nr)) {
      ctx.fail("the gathered statistics of rank {} hold a count of {}", r, nr);
    }
    n[static_cast<std::size_t>(r)] = nr;
  }
  for (std::int64_t r = 0; r < ranks; ++r) {
    const double* row = rows.data() + r * w;
    merge(s, n[static_cast<std::size_t>(r)], row + 1, row + 1 + channels);
  }
  return s;
}

void check_count(const kernel_context& ctx, double count, bool over_ranks) {
  if (count < 2) {
    ctx.fail("{} needs more than 1 value per channel in training, got {}{}", ctx.node().op(),
             count,
             over_ranks ? std::string(" over all ranks")
                        : fmt::format(" (x is {})", to_string(ctx.input(0).shape())));
  }
}

std::vector<double> packed_statistics(const statistics& s) {
  std::vector<double> p{s.count};
  p.insert(p.end(), s.mean.begin(), s.mean.end());
  p.insert(p.end(), s.m2.begin(), s.m2.end());
  return p;
}

void update_running(std::vector<double>& running_mean, std::vector<double>& running_var,
                    const statistics& s, double momentum) {
  const double unbias = s.count / (s.count - 1);
  for (std::size_t i = 0; i < running_mean.size(); ++i) {
    running_mean[i] = (1 - momentum) * running_mean[i] + momentum * s.mean[i];
    running_var[i] = (1 - momentum) * running_var[i] + momentum * s.m2[i] / s.count * unbias;
  }
}

std::vector<double> packed_sums(const std::vector<double>& sdy, const std::vector<double>& sdyx,
                                double count) {
  std::vector<double> p(sdy);
  p.insert(p.end(), sdyx.begin(), sdyx.end());
  p.push_back(count);
  return p;
}

void unpack_sums(const kernel_context& ctx, const tensor& sums, std::int64_t channels,
                 std::vector<double>& sdy, std::vector<double>& sdyx, double& count) {
  apply_rule(ctx, [&] { rules::check_batch_norm_packed(sums.shape(), channels, false, "sums"); });
  const std::vector<double> p = read_vector(sums);
  const auto ch = static_cast<std::ptrdiff_t>(channels);
  sdy.assign(p.begin(), p.begin() + ch);
  sdyx.assign(p.begin() + ch, p.begin() + 2 * ch);
  count = p[static_cast<std::size_t>(2 * channels)];
}

}  // namespace loom::common::batch_norm_train
