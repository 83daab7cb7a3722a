// The kernels every device shares (src/kernel/common/neutral_kernels.cpp): registered once
// for each device type, with that backend's label, and still the only kernel of their op on
// it.
#include <gtest/gtest.h>

#include <string>

#include "loom/kernel/kernel_registry.hpp"

namespace loom {
namespace {

TEST(NeutralKernels, OneKernelPerDeviceTypeWithTheBackendsLabel) {
  for (const char* op : {"placeholder", "_arg", "identity", "no_op", "_recv", "squeeze",
                         "expand_dims", "broadcast_to"}) {
    int cpu = 0;
    int cuda = 0;
    for (const kernel_def* k : kernel_registry::global().kernels_for(op)) {
      if (k->device == device_type::cpu) {
        ++cpu;
        EXPECT_EQ(k->label, "reference") << op;
      } else if (k->device == device_type::cuda) {
        ++cuda;
        EXPECT_EQ(k->label, "cuda") << op;
      }
    }
    EXPECT_EQ(cpu, 1) << op;
    EXPECT_EQ(cuda, 1) << op;
  }
}

}  // namespace
}  // namespace loom
