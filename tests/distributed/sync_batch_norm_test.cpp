// sync_batch_norm across the ranks (include/loom/graph/ops/normalization.hpp): every rank's
// y, dx and running statistics equal one process's batch_norm_train over the concatenated
// global batch (unequal batches, an empty one included), and data-parallel training of a CNN
// with synchronized batch norms ends where one process ends. Run as one process and under
// mpirun -np 2 / -np 4 (tests/CMakeLists.txt).
//
// Tolerances: the merged statistics add the same float32 values in other groupings than one
// process does (per rank, then Chan's merge in double), so a mean or variance differs by a
// few float32 roundings (about 1e-7 relative); y and dx inherit that, 2e-6 relative here.
// Training carries it through the steps: 4 SGD steps at lr 0.005 stay below 1e-5 (the same
// configuration through loom.train on 320 digits differed by 1.5e-6 at most, a momentum of
// conv1). At lr 0.05 the loss of this small batch grows (to 20
// and more): the steps amplify any rounding difference, so that the same runs differed by
// 2e-3 when oneDNN's convolutions split their sums otherwise (on a loaded machine); a
// diverging run compares nothing.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "loom/checkpoint/safetensors.hpp"
#include "loom/distributed/communicator.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops.hpp"
#include "loom/graph/ops/normalization.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/passes/sync_batch_norm.hpp"
#include "loom/runtime/session.hpp"
#include "loom/train/trainer.hpp"

namespace loom {
namespace {

namespace fs = std::filesystem;
using memory::host_tensor;

std::shared_ptr<distributed::communicator> w() { return distributed::world(); }

// Rank r's batch: sizes that differ between ranks, rank 1 of 4 empty.
std::int64_t batch_of(int r, int ranks) {
  if (ranks == 1) return 9;
  static const std::int64_t sizes[] = {5, 0, 3, 8};
  return ranks == 2 ? (r == 0 ? 5 : 3) : sizes[r % 4];
}

// Deterministic values every rank can make: element i of a tensor `seed`.
std::vector<float> values(std::int64_t n, int seed, float offset) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    v[static_cast<std::size_t>(i)] =
        offset + static_cast<float>(std::sin(0.37 * static_cast<double>(i) + seed) * 2.0 +
                                    std::cos(1.3 * static_cast<double>(i * i % 97) + seed));
  }
  return v;
}

std::vector<float> floats(const tensor& t) {
  const tensor h = memory::contiguous_copy(t, memory::host_resource::instance(), device_id{});
  const auto s = h.span<float>();
  return {s.begin(), s.end()};
}

struct step_result {
  std::vector<float> y, dx, dscale, dbias, running_mean, running_var;
};

// One step of a batch norm over x (channels per `format`), loss Σ y·dy: y, dx, dscale,
// dbias, and the running statistics after it. `sync`: sync_batch_norm over "world".
step_result step(const shape& xs, const std::vector<float>& x, const std::vector<float>& dy,
                 const std::string& format, bool sync) {
  const std::int64_t c = format == "NCHW" ? xs[1] : xs[xs.rank() - 1];
  graph g;
  graph_builder b(g);
  const output xin = ops::placeholder(b, "x", dtype::f32, xs);
  const output dyin = ops::placeholder(b, "dy", dtype::f32, xs);
  const output scale = ops::variable(b, "scale", host_tensor<float>({c}, values(c, 5, 1.0F)));
  const output bias = ops::variable(b, "bias", host_tensor<float>({c}, values(c, 6, 0.0F)));
  const output rm = ops::variable(b, "rm", host_tensor<float>({c}, values(c, 7, 0.0F)));
  const output rv = ops::variable(b, "rv", host_tensor<float>({c}, values(c, 8, 3.0F)));
  ops::batch_norm_options o{.epsilon = 1e-3, .momentum = 0.3, .data_format = format};
  const auto outs = sync ? ops::sync_batch_norm(xin, scale, bias, rm, rv, "world", o, {.name = "bn"})
                         : ops::batch_norm_train(xin, scale, bias, rm, rv, o, {.name = "bn"});
  const output loss = ops::reduce_sum(ops::mul(outs.y, dyin), {});
  const auto grads = gradients(loss, {xin, scale, bias});
  const std::vector<std::string> fetches{outs.y.name(), grads[0].name(), grads[1].name(),
                                         grads[2].name()};
  session s(std::move(g));
  const auto out = s.run({{"x", host_tensor<float>(xs, x)}, {"dy", host_tensor<float>(xs, dy)}},
                         fetches);
  const auto running = s.run({}, {"rm", "rv"});
  return {floats(out[0]), floats(out[1]), floats(out[2]),
          floats(out[3]), floats(running[0]), floats(running[1])};
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                 const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rtol * (1.0 + std::abs(want[i]))) << what << " at " << i;
  }
}

// Σ over the ranks of v, on every rank.
std::vector<float> summed(const std::vector<float>& v) {
  tensor t = host_tensor<float>({static_cast<std::int64_t>(v.size())}, v);
  w()->all_reduce(t, t, reduce_op::sum)->wait();
  return floats(t);
}

TEST(SyncBatchNorm, EveryRankMatchesOneProcessOnTheGlobalBatch) {
  const int ranks = w()->size();
  const int me = w()->rank();
  for (const std::string format : {"NCHW", "NHWC"}) {
    SCOPED_TRACE(format);
    // The global batch [N, 3, 4, 5] (NHWC: [N, 4, 5, 3]), and this rank's rows of it.
    std::int64_t total = 0;
    std::int64_t first = 0;
    for (int r = 0; r < ranks; ++r) {
      if (r == me) first = total;
      total += batch_of(r, ranks);
    }
    const std::int64_t per = 60;
    const auto shape_of = [&](std::int64_t n) {
      return format == "NCHW" ? shape{n, 3, 4, 5} : shape{n, 4, 5, 3};
    };
    // Values around 50 with unit spread per channel, so the statistics matter.
    const std::vector<float> x = values(total * per, 1, 50.0F);
    const std::vector<float> dy = values(total * per, 2, 0.0F);
    const std::int64_t mine = batch_of(me, ranks);
    const auto rows = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + first * per, v.begin() + (first + mine) * per);
    };
    const step_result one = step(shape_of(total), x, dy, format, false);
    const step_result sync = step(shape_of(mine), rows(x), rows(dy), format, true);
    expect_near(sync.y, rows(one.y), 2e-6, "y");
    expect_near(sync.dx, rows(one.dx), 2e-6, "dx");
    // dscale and dbias are each rank's; their sum over the ranks is the global batch's.
    expect_near(summed(sync.dscale), one.dscale, 2e-6, "dscale");
    expect_near(summed(sync.dbias), one.dbias, 2e-6, "dbias");
    // Every rank's running statistics are the global batch's.
    expect_near(sync.running_mean, one.running_mean, 2e-6, "running_mean");
    expect_near(sync.running_var, one.running_var, 2e-6, "running_var");
  }
}

TEST(SyncBatchNorm, ChannelsThatDisagreeAcrossRanksAreAnErrorNamingTheRank) {
  if (w()->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::int64_t c = w()->rank() == 0 ? 3 : 4;
  try {
    (void)step(shape{4, c}, values(4 * c, 1, 0.0F), values(4 * c, 2, 0.0F), "NCHW", true);
    ADD_FAILURE() << "expected an error";
  } catch (const error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank"), std::string::npos) << what;
    EXPECT_NE(what.find("bn/gather"), std::string::npos) << what;
  }
  w()->barrier()->wait();
}

TEST(SyncBatchNorm, ConversionAfterTheGradientsIsRefused) {
  graph g;
  graph_builder b(g);
  const output x = ops::placeholder(b, "x", dtype::f32, {4, 3});
  const output v = ops::variable(b, "v", host_tensor<float>({3}, {1, 1, 1}));
  const auto y = ops::batch_norm_train(x, v, v, v, v, {}, {.name = "bn"}).y;
  (void)gradients(ops::reduce_sum(y, {}), {x});
  try {
    (void)passes::convert_sync_batch_norm(g);
    ADD_FAILURE() << "expected an error";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'bn'"), std::string::npos) << e.what();
  }
}

// Data-parallel training of the CNN with synchronized batch norms: N ranks, each on its
// block of the global batch, end where one process training on the whole batch ends.
TEST(SyncBatchNorm, DataParallelCnnEndsWhereOneProcessEnds) {
  static const train::dataset train_set = train::make_digits(256, 7);
  static const train::dataset test_set = train::make_digits(64, 8);
  fs::path dir;
  {
    // A directory every rank names alike.
    tensor name = host_tensor(dtype::u8, {512});
    std::fill_n(name.data<std::uint8_t>(), 512, std::uint8_t{0});
    if (w()->rank() == 0) {
      std::string pattern = (fs::temp_directory_path() / "loom-sbn-XXXXXX").string();
      ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
      std::copy(pattern.begin(), pattern.end(), name.data<std::uint8_t>());
    }
    w()->broadcast(name, 0)->wait();
    dir = reinterpret_cast<const char*>(name.data<std::uint8_t>());
  }
  train::train_options o;
  o.model = "cnn";
  o.batch_norm = true;
  o.sync_batch_norm = true;
  o.epochs = 1;
  o.batch = 16;
  o.max_steps_per_epoch = 4;
  o.optimizer = "sgd";
  o.lr = 0.005;
  o.threads = 1;
  o.seed = 5;
  const auto run = [&](const fs::path& at, bool parallel) {
    train::train_options p = o;
    p.checkpoint_dir = at;
    p.communicator = parallel ? w() : nullptr;
    const train::train_report r = train::train(train_set, test_set, p);
    w()->barrier()->wait();
    std::map<std::string, std::vector<float>> values;
    for (auto& [n, t] : checkpoint::load_safetensors(at / "checkpoint.safetensors").tensors) {
      if (t.type() == dtype::f32) values[n] = floats(t);
    }
    return std::pair{r, values};
  };
  const auto [dp, mine] = run(dir / "dp", true);
  const auto [one, ref] = run(dir / fmt::format("one{}", w()->rank()), false);
  EXPECT_EQ(mine.size(), ref.size());
  double largest = 0;
  for (const auto& [n, v] : ref) {
    ASSERT_TRUE(mine.contains(n)) << n;
    for (std::size_t i = 0; i < v.size(); ++i) {
      largest = std::max(largest, std::abs(static_cast<double>(mine.at(n)[i]) - v[i]));
    }
  }
  EXPECT_LT(largest, 1e-5) << "the parameters, the optimizer state and the running statistics";
  EXPECT_TRUE(mine.contains("conv1/bn/running_var"));
  EXPECT_NEAR(dp.epochs[0].loss, one.epochs[0].loss, 1e-5);
  EXPECT_LT(one.epochs[0].loss, 5.0) << "a run that diverges compares nothing";
  EXPECT_NEAR(dp.test_accuracy, one.test_accuracy, 1e-6);
  if (w()->size() > 1) {
    bool converted = false;
    for (const auto& r : dp.passes) converted = converted || r.pass == "sync_batch_norm";
    EXPECT_TRUE(converted) << "the explain log says what was converted";
  }
  w()->barrier()->wait();
  std::error_code ec;
  if (w()->rank() == 0) fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace loom
