// Test support for the training tests (train_test, amp_train_test): a small MLP's options
// and a fresh scratch directory. Header-only.
#pragma once

#include <filesystem>
#include <string>

#include "loom/train/trainer.hpp"

namespace loom::train {

/// A 784-64-10 MLP, 2 epochs, batch 32, lr 3e-3, 2 threads: learns the digits in a second.
inline train_options small_mlp() {
  train_options o;
  o.model = "mlp";
  o.hidden = {64};
  o.epochs = 2;
  o.batch = 32;
  o.lr = 3e-3;
  o.threads = 2;
  return o;
}

/// An empty directory <temp>/loom_train_test_<name> (emptied if it was there).
inline std::filesystem::path temp_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("loom_train_test_" + name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

}  // namespace loom::train
