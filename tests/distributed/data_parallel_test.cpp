// Data-parallel training (train_options::communicator, docs/distributed.md): N ranks that
// each train on their block of the global batch end where one process training on the whole
// batch ends; checkpoints resume on another number of ranks; bad configurations are errors
// naming the rank. Run as one process (N = 1: the same paths with one rank) and under
// mpirun -np 2 / -np 4 (tests/CMakeLists.txt).
//
// Tolerances: the ranks' gradients are means over their blocks, averaged by all_reduce; one
// process takes the mean over the whole batch. The two sum the same float32 products in
// other orders (the matmul's reduction over the batch is split in N), so a gradient element
// differs by a few float32 roundings (about 1e-7 relative), and each SGD step carries that
// into the parameters times the learning rate: 12 steps at lr 0.05 stay far below 1e-6
// (measured on 2 and 4 ranks: at most 2.3e-8 for the MLP, 4.5e-8 for the CNN; one rank
// gives the same bits). Adam divides by sqrt(v), so an element whose gradient were as small
// as the rounding difference could move by up to lr a step either way; these models have no
// such element, and Adam is held to 1e-5 (measured: 1.3e-7). Overlap on or off reduces the
// same buckets alike: the same bits.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include "loom/checkpoint/safetensors.hpp"
#include "loom/distributed/communicator.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/train/trainer.hpp"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<distributed::communicator> w() { return distributed::world(); }

// A directory every rank names alike: made by rank 0, its name broadcast.
fs::path shared_directory() {
  constexpr std::int64_t room = 512;
  tensor name = memory::host_tensor(dtype::u8, {room});
  std::fill_n(name.data<std::uint8_t>(), room, std::uint8_t{0});
  if (w()->rank() == 0) {
    std::string pattern = (fs::temp_directory_path() / "loom-dp-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw error("mkdtemp failed");
    std::copy(pattern.begin(), pattern.end(), name.data<std::uint8_t>());
  }
  w()->broadcast(name, 0)->wait();
  return {reinterpret_cast<const char*>(name.data<std::uint8_t>())};
}

class DataParallel : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = shared_directory(); }
  void TearDown() override {
    w()->barrier()->wait();
    std::error_code ec;
    if (w()->rank() == 0) fs::remove_all(dir_, ec);
  }

  static const dataset& train_set() {
    static const dataset d = make_digits(512, 7);
    return d;
  }
  static const dataset& test_set() {
    static const dataset d = make_digits(128, 8);
    return d;
  }

  // Options every run shares: a small MLP, 2 epochs of 6 steps of 32 examples.
  static train_options base(const std::string& optimizer, double lr) {
    train_options o;
    o.hidden = {48};
    o.epochs = 2;
    o.batch = 32;
    o.max_steps_per_epoch = 6;
    o.optimizer = optimizer;
    o.lr = lr;
    o.threads = 1;
    o.seed = 3;
    return o;
  }

  // Trains with `o` into `dir`'s checkpoint; returns the report and the parameters.
  std::pair<train_report, std::map<std::string, std::vector<float>>> run(train_options o,
                                                                         const fs::path& dir) {
    o.checkpoint_dir = dir;
    const train_report r = train(train_set(), test_set(), o);
    w()->barrier()->wait();  // rank 0's checkpoint is written
    return {r, parameters(dir)};
  }

  static std::map<std::string, std::vector<float>> parameters(const fs::path& dir) {
    std::map<std::string, std::vector<float>> out;
    for (auto& [name, t] : checkpoint::load_safetensors(dir / "checkpoint.safetensors").tensors) {
      if (t.type() != dtype::f32) continue;  // the step counter
      const auto s = t.span<float>();
      out[name] = {s.begin(), s.end()};
    }
    return out;
  }

  // The largest |a - b| over every parameter and optimizer state, and the relative distance
  // ||a - b|| / ||b|| of the parameters.
  static std::pair<double, double> difference(const std::map<std::string, std::vector<float>>& a,
                                              const std::map<std::string, std::vector<float>>& b) {
    EXPECT_EQ(a.size(), b.size());
    double largest = 0;
    double diff2 = 0;
    double norm2 = 0;
    for (const auto& [name, va] : a) {
      const auto it = b.find(name);
      if (it == b.end()) {
        ADD_FAILURE() << name << " is missing";
        continue;
      }
      EXPECT_EQ(va.size(), it->second.size()) << name;
      for (std::size_t i = 0; i < va.size() && i < it->second.size(); ++i) {
        const double d = static_cast<double>(va[i]) - it->second[i];
        largest = std::max(largest, std::abs(d));
        if (name.find('/', name.find('/') + 1) == std::string::npos) {  // "fc1/w", not state
          diff2 += d * d;
          norm2 += static_cast<double>(it->second[i]) * it->second[i];
        }
      }
    }
    return {largest, std::sqrt(diff2 / norm2)};
  }

  fs::path dir_;
};

TEST_F(DataParallel, SgdOnEveryRankCountEndsWhereOneProcessEnds) {
  train_options o = base("sgd", 0.05);
  o.bucket_bytes = 8 << 10;  // several buckets
  o.communicator = w();
  const auto [dp, mine] = run(o, dir_ / "dp");
  o.communicator = nullptr;
  const auto [one, ref] = run(o, dir_ / fmt::format("one{}", w()->rank()));
  EXPECT_EQ(dp.ranks, w()->size());
  EXPECT_EQ(dp.steps, one.steps);
  const auto [largest, relative] = difference(mine, ref);
  EXPECT_LT(largest, 1e-6) << "largest difference";
  EXPECT_LT(relative, 1e-6);
  // The reported loss and accuracy are the global batch's.
  for (std::size_t e = 0; e < dp.epochs.size(); ++e) {
    EXPECT_NEAR(dp.epochs[e].loss, one.epochs[e].loss, 1e-5) << "epoch " << e + 1;
    EXPECT_NEAR(dp.epochs[e].train_accuracy, one.epochs[e].train_accuracy, 1e-6);
    EXPECT_NEAR(dp.epochs[e].test_accuracy, one.epochs[e].test_accuracy, 1e-6);
  }
  if (w()->size() > 1) {
    EXPECT_GT(dp.buckets, 1u);
    EXPECT_GT(dp.communication_seconds, 0.0);
    EXPECT_GT(dp.compute_seconds, 0.0);
    EXPECT_LE(dp.overlapped_seconds, dp.communication_seconds);
  }
}

TEST_F(DataParallel, AdamOnEveryRankCountEndsWhereOneProcessEnds) {
  train_options o = base("adam", 1e-3);
  o.communicator = w();
  const auto [dp, mine] = run(o, dir_ / "dp");
  o.communicator = nullptr;
  const auto [one, ref] = run(o, dir_ / fmt::format("one{}", w()->rank()));
  const auto [largest, relative] = difference(mine, ref);
  EXPECT_LT(largest, 1e-5);
  EXPECT_LT(relative, 1e-6);
  for (std::size_t e = 0; e < dp.epochs.size(); ++e) {
    EXPECT_NEAR(dp.epochs[e].loss, one.epochs[e].loss, 1e-4) << "epoch " << e + 1;
  }
}

TEST_F(DataParallel, TheCnnToo) {
  train_options o = base("sgd", 0.02);
  o.model = "cnn";
  o.epochs = 1;
  o.max_steps_per_epoch = 3;
  o.batch = 8;
  o.evaluate = false;
  o.communicator = w();
  const auto [dp, mine] = run(o, dir_ / "dp");
  o.communicator = nullptr;
  const auto [one, ref] = run(o, dir_ / fmt::format("one{}", w()->rank()));
  const auto [largest, relative] = difference(mine, ref);
  EXPECT_LT(largest, 1e-6);
  EXPECT_LT(relative, 1e-6);
}

TEST_F(DataParallel, OverlapAndBucketSizeChangeNoAnswer) {
  // Overlap or not, the same buckets are reduced alike: the same bits. Other bucket sizes
  // reduce the same values in other messages: the same up to MPI's summation order.
  train_options o = base("sgd", 0.05);
  o.communicator = w();
  o.bucket_bytes = 16 << 10;
  const auto [a, overlapped] = run(o, dir_ / "a");
  o.overlap = false;
  const auto [b, serial] = run(o, dir_ / "b");
  EXPECT_EQ(overlapped, serial);
  o.overlap = true;
  o.bucket_bytes = 1;  // one bucket a parameter
  const auto [c, per_tensor] = run(o, dir_ / "c");
  EXPECT_LT(difference(per_tensor, overlapped).first, 1e-6);
  if (w()->size() > 1) {
    EXPECT_EQ(c.buckets, 4u);  // fc1/w, fc1/b, fc2/w, fc2/b
  }
}

TEST_F(DataParallel, ACheckpointResumesOnAnotherNumberOfRanks) {
  // Epoch 1 on rank 0 alone, epoch 2 on every rank: where 2 epochs in one process end.
  train_options o = base("sgd", 0.05);
  const fs::path resumed = dir_ / "resumed";
  if (w()->rank() == 0) {
    train_options first = o;
    first.epochs = 1;
    first.checkpoint_dir = resumed;
    (void)train(train_set(), test_set(), first);
  }
  w()->barrier()->wait();
  o.communicator = w();
  o.resume = true;
  o.require_checkpoint = true;
  const auto [r, mine] = run(o, resumed);
  EXPECT_EQ(r.resumed_epoch, 1);
  ASSERT_EQ(r.epochs.size(), 1u);
  o.communicator = nullptr;
  o.resume = false;
  const auto [one, ref] = run(o, dir_ / fmt::format("one{}", w()->rank()));
  EXPECT_LT(difference(mine, ref).first, 1e-6);
}

TEST_F(DataParallel, ABatchTheRanksDoNotDivideIsAnErrorOnEveryRank) {
  if (w()->size() < 2) GTEST_SKIP() << "needs two ranks (mpirun -np 2)";
  train_options o = base("sgd", 0.05);
  o.batch = 32 * w()->size() + 1;
  o.communicator = w();
  try {
    (void)train(train_set(), test_set(), o);
    FAIL() << "trained";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("rank {}", w()->rank())), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("does not split over"), std::string::npos) << e.what();
  }
}

TEST_F(DataParallel, RanksWithOtherOptionsAreAnErrorOnEveryRank) {
  if (w()->size() < 2) GTEST_SKIP() << "needs two ranks (mpirun -np 2)";
  train_options o = base("sgd", 0.05);
  if (w()->rank() == 1) o.lr = 0.01;
  o.communicator = w();
  try {
    (void)train(train_set(), test_set(), o);
    FAIL() << "trained";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 has other options or data than rank 0"),
              std::string::npos)
        << e.what();
  }
  // The ranks are still in step: a good run follows.
  o.lr = 0.05;
  const auto [r, params] = run(o, dir_ / "after");
  EXPECT_EQ(r.ranks, w()->size());
}

}  // namespace
}  // namespace loom::train
