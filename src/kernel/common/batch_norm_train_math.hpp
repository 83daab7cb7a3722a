// What the backends' training batch norm kernels share (batch_norm_train, sync_batch_norm,
// batch_norm_stats, batch_norm_train_grad, batch_norm_grad_reduce, batch_norm_grad_elemt):
// the per-channel arithmetic in double on the host — the merge of the ranks' packed
// statistics, the coefficients of the normalising and dx passes, the running statistics'
// rule, the packing — and the checks, so that both devices compute the same values and fail
// alike. The passes over x are each backend's.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "apply_rule.hpp"
#include "loom/core/tensor.hpp"
#include "loom/graph/ops/normalization_rules.hpp"
#include "loom/kernel/op_kernel.hpp"

namespace loom::common::batch_norm_train {

namespace rules = normalization_rules;

/// A host tensor of any float dtype as doubles, and doubles written into one (rounded to its
/// dtype).
std::vector<double> read_vector(const tensor& host);
void write_vector(tensor& host, const std::vector<double>& v);

/// The float type of the batch statistics (mean, invstd, the packed vectors) for x of `t`.
[[nodiscard]] inline dtype statistics_type(dtype t) {
  return t == dtype::f64 ? dtype::f64 : dtype::f32;
}

/// The geometry of each op's x with its per-channel inputs checked, as every backend's kernel
/// starts (a rule's failure fails the node): the forward ops' (x, scale, bias, running_mean,
/// running_var, ...), batch_norm_stats' (x) and the backward ops' ((dy, x, scale, mean,
/// invstd, ...), dy checked against x).
rules::batch_norm_geometry forward_geometry(const kernel_context& ctx, const std::string& format);
rules::batch_norm_geometry stats_geometry(const kernel_context& ctx, const std::string& format);
rules::batch_norm_geometry backward_geometry(const kernel_context& ctx, const std::string& format);

/// Which part of the backward pass a node is: batch_norm_train_grad (the whole: dx, dscale,
/// dbias), batch_norm_grad_reduce (the packed sums, dscale, dbias) or batch_norm_grad_elemt
/// (dx from the packed sums of every rank, input 5).
enum class backward_part : std::uint8_t { whole, reduce, elemt };
[[nodiscard]] backward_part backward_part_of(const kernel_construction& c);

/// Per-channel statistics over `count` values: the means and the sums of squared deviations.
struct statistics {
  std::vector<double> mean;
  std::vector<double> m2;
  double count = 0;
};

/// Statistics of `channels` channels over `count` values, their means and m2 all 0 (to fill,
/// or to merge parts into).
[[nodiscard]] statistics zero_statistics(std::int64_t channels, double count = 0);

/// Merges into `s` a part of nb values with per-channel means `mean` and sums of squared
/// deviations `m2` (C each): Chan et al.'s parallel update, its weights the same for every
/// channel. Parts merged in one order give the same bits.
void merge(statistics& s, double nb, const double* mean, const double* m2);

/// The ranks' packed (count, mean, m2) rows (Note [packed batch statistics]; a host tensor
/// [R, 2C + 1]) merged in rank order by Chan et al.'s parallel update. Fails the node for
/// rows of another shape or a count that is not a whole number >= 0.
statistics merge_gathered(const kernel_context& ctx, const tensor& gathered,
                          std::int64_t channels);

/// Fails the node when a channel has fewer than 2 values (no unbiased variance, as PyTorch
/// refuses): "... needs more than 1 value per channel in training, got N (x is X)".
void check_count(const kernel_context& ctx, double count, bool over_ranks);

/// This rank's packed (count, mean, m2) row.
std::vector<double> packed_statistics(const statistics& s);

/// The forward pass's values for one channel: y = (x - cm) a + b, where cm is the mean
/// rounded to the compute type C and b = bias - (mean - cm) a carries the rest (x - cm is
/// exact near the mean: Note [batch norm training kernels]).
template <class C>
struct forward_coefficient {
  C cm;
  double delta;  // mean - cm
  C a;
  C b;
  double invstd;
};
/// The mean as cm + delta: cm rounded to the compute type C, delta the rest.
template <class C>
struct split_mean {
  C cm;
  double delta;
  explicit split_mean(double mean)
      : cm(static_cast<C>(mean)), delta(mean - static_cast<double>(cm)) {}
};

template <class C>
forward_coefficient<C> forward_coefficients(double mean, double m2, double count, double eps,
                                            double scale, double bias) {
  forward_coefficient<C> k;
  k.invstd = 1.0 / std::sqrt(m2 / count + eps);
  const split_mean<C> m(mean);
  k.cm = m.cm;
  k.delta = m.delta;
  const double a = scale * k.invstd;
  k.a = static_cast<C>(a);
  k.b = static_cast<C>(bias - k.delta * a);
  return k;
}

/// The dx pass's values for one channel from the sums Σdy and Σdy (x - mean) over `count`
/// values: dx = dy a + (x - cm) q + b, i.e. a (dy - Σdy/n - xhat Σ(dy xhat)/n).
template <class C>
struct backward_coefficient {
  C a;
  C q;
  C b;
};
template <class C>
backward_coefficient<C> backward_coefficients(double sdy, double sdyx, double count,
                                              double scale, double invstd, double delta) {
  const double a = scale * invstd;
  const double q = count > 0 ? -a * invstd * invstd * sdyx / count : 0.0;
  return {static_cast<C>(a), static_cast<C>(q),
          static_cast<C>((count > 0 ? -a * sdy / count : 0.0) - delta * q)};
}

/// The running statistics after a step (PyTorch's rule): (1 - momentum) running + momentum
/// batch statistic, the variance unbiased (count / (count - 1)).
void update_running(std::vector<double>& running_mean, std::vector<double>& running_var,
                    const statistics& s, double momentum);

/// The packed gradient sums [Σdy (C), Σdy (x - mean) (C), count] of Note [packed batch
/// statistics], and back (fails the node for another shape).
std::vector<double> packed_sums(const std::vector<double>& sdy, const std::vector<double>& sdyx,
                                double count);
void unpack_sums(const kernel_context& ctx, const tensor& sums, std::int64_t channels,
                 std::vector<double>& sdy, std::vector<double>& sdyx, double& count);

}  // namespace loom::common::batch_norm_train
