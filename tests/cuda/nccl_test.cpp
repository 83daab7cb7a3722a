// NCCL communicators (include/loom/distributed/nccl.hpp) and the collective ops on a GPU:
// without a GPU, the typed error; with one, a one-rank communicator (a world of one
// process) through graphs placed on the GPU, which exercises the stream handshake (Note
// [nccl stream handshake]): a kernel before the collective writes its input and a kernel
// after it reads its output, with no host wait between them.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <vector>

#include "cuda_test_support.hpp"
#include "loom/distributed/communicator.hpp"
#include "loom/distributed/nccl.hpp"
#include "loom/graph/ops/collective.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

using memory::host_tensor;

// A world of one process that needs no MPI (this test room does not start MPI: its
// sanitizer settings for Open MPI live with tests/distributed).
class alone final : public distributed::communicator {
 public:
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  std::string backend() const override { return "none"; }
  std::shared_ptr<communicator> split(int, int) override { return std::make_shared<alone>(); }
  std::unique_ptr<distributed::work> all_reduce(const tensor&, const tensor&, reduce_op) override { return none(); }
  std::unique_ptr<distributed::work> broadcast(const tensor&, int) override { return none(); }
  std::unique_ptr<distributed::work> all_gather(const tensor&, const tensor&) override { return none(); }
  std::unique_ptr<distributed::work> reduce_scatter(const tensor&, const tensor&, reduce_op) override {
    return none();
  }
  std::unique_ptr<distributed::work> barrier() override { return none(); }
  std::unique_ptr<distributed::work> send(const tensor&, int, int) override { return none(); }
  std::unique_ptr<distributed::work> recv(const tensor&, int, int) override { return none(); }

 private:
  // Fails the test: a one-rank bootstrap carries nothing.
  static std::unique_ptr<distributed::work> none() {
    ADD_FAILURE() << "a one-rank bootstrap was asked to exchange";
    throw error("unexpected exchange");
  }
};

TEST(Nccl, WithoutAGpuMakingOneIsATypedErrorNamingTheRank) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "checks the no-GPU error path";
  EXPECT_FALSE(distributed::nccl_availability().empty());
  try {
    (void)distributed::make_nccl_communicator(std::make_shared<alone>(), 0);
    FAIL() << "an NCCL communicator without a GPU";
  } catch (const distributed_error& e) {
    EXPECT_EQ(e.rank(), 0);
    EXPECT_NE(std::string(e.what()).find("rank 0 of 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
}

class NcclGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    LOOM_REQUIRE_GPU();
    ASSERT_EQ(distributed::nccl_availability(), "");
    comm_ = distributed::make_nccl_communicator(distributed::world(), 0);
    distributed::register_group("nccl_test", comm_);
  }
  void TearDown() override { distributed::unregister_group("nccl_test"); }
  std::shared_ptr<distributed::communicator> comm_;
};

TEST_F(NcclGpu, AOneRankCommunicator) {
  EXPECT_EQ(comm_->backend(), "nccl");
  EXPECT_EQ(comm_->size(), 1);
  comm_->barrier()->wait();
  // A host tensor is refused, naming the GPU.
  tensor host = host_tensor({2}, {1.0F, 2.0F});
  EXPECT_THROW((void)comm_->all_reduce(host, host, reduce_op::sum), distributed_error);
}

TEST_F(NcclGpu, CollectiveOpsOnTheGpuKeepStreamOrder) {
  // y = all_reduce(2x) + 1 on the GPU, through NCCL and, for comparison, through the world
  // (MPI, through host memory); every dtype NCCL carries.
  for (const dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64}) {
    graph g;
    graph_builder b(g);
    auto x = ops::placeholder(b, "x", dtype::f32, {1000});
    auto doubled = ops::cast(x * 2.0, t);
    auto nccl = ops::all_reduce(doubled, "sum", "nccl_test", {.name = "nccl", .device = "cuda:0"});
    auto mpi = ops::all_reduce(doubled, "max", "world", {.name = "mpi", .device = "cuda:0"});
    auto bcast = ops::broadcast(doubled, 0, "nccl_test", {.name = "bcast", .device = "cuda:0"});
    auto gather = ops::all_gather(doubled, 1, "nccl_test", {.name = "gather", .device = "cuda:0"});
    auto scatter = ops::reduce_scatter(doubled, "sum", 1, "nccl_test", {.name = "scatter", .device = "cuda:0"});
    for (const auto& [name, v] : {std::pair{"y_nccl", nccl}, std::pair{"y_mpi", mpi},
                                  std::pair{"y_bcast", bcast}, std::pair{"y_gather", gather},
                                  std::pair{"y_scatter", scatter}}) {
      ops::cast(ops::add(v, ops::cast(ops::scalar(b, 1.0, dtype::f32), t)), dtype::f32, {.name = name});
    }
    session s(std::move(g));
    std::vector<float> in(1000);
    for (int i = 0; i < 1000; ++i) in[static_cast<std::size_t>(i)] = static_cast<float>(i % 17);
    const auto out = s.run({{"x", host_tensor({1000}, in)}},
                           {"y_nccl", "y_mpi", "y_bcast", "y_gather", "y_scatter"});
    for (std::size_t k = 0; k < out.size(); ++k) {
      const tensor h = s.host_value(out[k]);
      for (int i = 0; i < 1000; ++i) {
        ASSERT_EQ(h.data<float>()[i], 2 * in[static_cast<std::size_t>(i)] + 1)
            << to_string(t) << " fetch " << k << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace loom
