// train() never goes silently wrong: NaN or Inf in the data or in resumed weights is refused
// (naming the row or the tensor) unless allowed; a non-finite loss or gradient stops training
// with the epoch, the step and the loss, or is skipped and counted when asked; resuming
// checks the checkpoint's metadata, shapes, names and dtypes, says when there is nothing to
// resume from, and removes the temporary files of a killed save; a checkpoint directory or
// trace file that cannot be written fails before any work.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "loom/checkpoint/safetensors.hpp"
#include "loom/core/error.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/train/dataset.hpp"
#include "loom/train/trainer.hpp"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

class TrainRobustness : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("loom_train_robustness_" + std::to_string(::getpid()) + "_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

// A small problem that trains in milliseconds: 96 examples of 8 features, 3 classes.
dataset small_data() {
  dataset d;
  d.name = "small";
  d.num_features = 8;
  d.num_classes = 3;
  d.example_shape = {8};
  for (int i = 0; i < 96; ++i) {
    const int label = i % 3;
    d.labels.push_back(label);
    for (int k = 0; k < 8; ++k) {
      d.features.push_back(static_cast<float>(std::sin(0.7 * i + k)) + (k == label ? 1.5f : 0.0f));
    }
  }
  return d;
}

train_options small_options() {
  train_options o;
  o.hidden = {16};
  o.epochs = 2;
  o.batch = 16;
  o.lr = 1e-2;
  o.threads = 1;
  o.sample_optimizer_time = false;
  return o;
}

template <class E>
std::string failure(const dataset& tr, const dataset& te, const train_options& o,
                    int* steps_seen = nullptr) {
  try {
    (void)train(tr, te, o, [&](const step_progress&) {
      if (steps_seen != nullptr) ++*steps_seen;
    });
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

TEST_F(TrainRobustness, NonFiniteFeaturesAreRefusedNamingTheRow) {
  const fs::path csv = dir_ / "nan.csv";
  {
    std::ofstream out(csv);
    out << "label,a,b\n";
    for (int i = 0; i < 40; ++i) out << i % 2 << "," << i << "," << (i == 17 ? "nan" : "1") << "\n";
  }
  const dataset d = load_csv(csv);
  train_options o = small_options();
  o.batch = 8;
  int steps = 0;
  const std::string msg = failure<invalid_argument>(d, d, o, &steps);
  expect_has(msg, csv.string() + ":19: column 3 (feature 1) is nan");
  EXPECT_EQ(steps, 0) << "refused before any step";

  // Allowed, the NaN reaches the gradients: the fused update's found_inf stops training...
  o.allow_nonfinite = true;
  const std::string stopped = failure<error>(d, d, o);
  EXPECT_TRUE(stopped.find("the gradients hold NaN or Inf") != std::string::npos ||
              stopped.find("the loss is nan") != std::string::npos)
      << stopped;
  expect_has(stopped, "the fused update skipped the step; training stopped");
  expect_has(stopped, "--skip-nonfinite-steps");
  // ... or, when asked, those steps are skipped and counted.
  o.skip_nonfinite_steps = true;
  const train_report r = train(d, d, o);
  EXPECT_GT(r.skipped_steps, 0);
  EXPECT_LT(r.skipped_steps, r.steps);  // the batches without the NaN row trained
  std::int64_t per_epoch = 0;
  for (const auto& e : r.epochs) {
    per_epoch += e.skipped_steps;
    EXPECT_TRUE(std::isfinite(e.loss));
  }
  EXPECT_EQ(per_epoch, r.skipped_steps);
}

TEST_F(TrainRobustness, ANonFiniteLossStopsTrainingNamingEpochStepAndLoss) {
  // A learning rate so large that the first step sends the weights to 1e30: from the second
  // step on the logits overflow and the loss is not finite.
  const dataset d = small_data();
  train_options o = small_options();
  o.lr = 1e30;
  int steps = 0;
  const std::string msg = failure<error>(d, d, o, &steps);
  expect_has(msg, "epoch 1, step 2 of 6 (examples 16 to 31 of the epoch's shuffled order)");
  EXPECT_TRUE(msg.find("the loss is nan") != std::string::npos ||
              msg.find("the loss is inf") != std::string::npos)
      << msg;
  expect_has(msg, "training stopped");
  EXPECT_EQ(steps, 1);

  // Skipped when asked, and counted.
  o.skip_nonfinite_steps = true;
  const train_report r = train(d, d, o);
  EXPECT_EQ(r.steps, 12);
  EXPECT_EQ(r.skipped_steps, 11);
  ASSERT_EQ(r.epochs.size(), 2u);
  EXPECT_EQ(r.epochs[0].skipped_steps, 5);
  EXPECT_EQ(r.epochs[1].skipped_steps, 6);
  EXPECT_TRUE(std::isnan(r.epochs[1].loss));  // no step of the epoch counted

  // Per-tensor updates cannot undo a step: skipping needs the fused one.
  o.fused = false;
  expect_has(failure<invalid_argument>(d, d, o), "needs the fused update");
}

TEST_F(TrainRobustness, ASkippedStepChangesNoVariable) {
  // NaN in every example (allowed): every step's gradients hold NaN, every step is skipped,
  // and the fused update never ran: it made no optimizer state.
  dataset d = small_data();
  for (std::int64_t i = 0; i < d.size(); ++i) d.features[static_cast<std::size_t>(i * 8)] = NAN;
  train_options o = small_options();
  o.allow_nonfinite = true;
  o.skip_nonfinite_steps = true;
  o.checkpoint_dir = dir_ / "skipped";
  const train_report r = train(d, d, o);
  EXPECT_EQ(r.skipped_steps, r.steps);
  const auto file = checkpoint::load_safetensors(checkpoint_file(o));
  for (const auto& [name, t] : file.tensors) {
    EXPECT_EQ(name.find("adam"), std::string::npos) << name;
  }
}

TEST_F(TrainRobustness, SkippingChangesNothingOnGoodData) {
  const dataset d = small_data();
  train_options o = small_options();
  const train_report plain = train(d, d, o);
  o.skip_nonfinite_steps = true;
  const train_report skipping = train(d, d, o);
  EXPECT_EQ(skipping.skipped_steps, 0);
  ASSERT_EQ(plain.epochs.size(), skipping.epochs.size());
  for (std::size_t i = 0; i < plain.epochs.size(); ++i) {
    EXPECT_EQ(plain.epochs[i].loss, skipping.epochs[i].loss);
  }
  EXPECT_EQ(plain.test_accuracy, skipping.test_accuracy);
}

TEST_F(TrainRobustness, BadOptionsAreRefusedBeforeAnyStep) {
  const dataset d = small_data();
  for (const double lr : {0.0, -1e-3, std::numeric_limits<double>::quiet_NaN(),
                          std::numeric_limits<double>::infinity()}) {
    train_options o = small_options();
    o.lr = lr;
    expect_has(failure<invalid_argument>(d, d, o), "must be a finite number > 0");
  }
  train_options o = small_options();
  o.threads = -1;
  EXPECT_THROW((void)train(d, d, o), invalid_argument);
  o = small_options();
  o.hidden = {0};
  EXPECT_THROW((void)train(d, d, o), invalid_argument);
  // A test set that does not fit the model.
  dataset other = small_data();
  other.num_features = 4;
  other.features.resize(other.features.size() / 2);
  o = small_options();
  expect_has(failure<invalid_argument>(d, other, o), "the test set has 4 features");
  // Labels outside the classes.
  dataset bad = small_data();
  bad.labels[5] = 3;
  expect_has(failure<invalid_argument>(bad, d, o), "example 5: label 3 is outside the 3 classes");
}

TEST_F(TrainRobustness, OutputPathsThatCannotBeWrittenFailBeforeAnyWork) {
  const dataset d = small_data();
  const fs::path file = dir_ / "a_file";
  std::ofstream(file) << "x";
  train_options o = small_options();
  o.checkpoint_dir = file / "ckpt";
  int steps = 0;
  expect_has(failure<invalid_argument>(d, d, o, &steps),
             "checkpoint directory '" + (file / "ckpt").string() + "': '" + file.string() +
                 "' is a file, not a directory");
  o.checkpoint_dir = "/proc/loom-checkpoint";
  expect_has(failure<error>(d, d, o, &steps),
             "checkpoint directory '/proc/loom-checkpoint': cannot create it");
  o.checkpoint_dir.clear();
  o.trace_path = dir_ / "missing" / "trace.json";
  expect_has(failure<not_found>(d, d, o, &steps), "does not exist");
  o.trace_path = dir_;
  expect_has(failure<invalid_argument>(d, d, o, &steps), "is a directory");
  EXPECT_EQ(steps, 0);
}

TEST_F(TrainRobustness, ATraceIsWrittenEvenWhenTheRunHasFewerThanFiveSteps) {
  const dataset d = small_data();
  train_options o = small_options();
  o.epochs = 1;
  o.max_steps_per_epoch = 2;
  o.trace_path = dir_ / "trace.json";
  const train_report r = train(d, d, o);
  EXPECT_TRUE(r.trace_written);
  EXPECT_GT(fs::file_size(o.trace_path), 0u);
}

class Resume : public TrainRobustness {
 protected:
  // A checkpoint after one epoch, in dir_/ckpt.
  train_options first_epoch() {
    train_options o = small_options();
    o.epochs = 1;
    o.checkpoint_dir = dir_ / "ckpt";
    (void)train(data_, data_, o);
    o.epochs = 2;
    o.resume = true;
    return o;
  }
  // Rewrites the checkpoint with `edit` applied to its contents.
  template <class Edit>
  void edit(const train_options& o, Edit&& change) {
    auto file = checkpoint::load_safetensors(checkpoint_file(o));
    change(file);
    checkpoint::save_safetensors(checkpoint_file(o), file.tensors, file.metadata);
  }
  dataset data_ = small_data();
};

TEST_F(Resume, NothingToResumeFromStartsFreshOrFailsWhenRequired) {
  train_options o = small_options();
  o.checkpoint_dir = dir_ / "empty";
  o.resume = true;
  const train_report r = train(data_, data_, o);
  EXPECT_EQ(r.resumed_epoch, 0);
  EXPECT_EQ(r.epochs.size(), 2u);
  fs::remove_all(o.checkpoint_dir);
  o.require_checkpoint = true;
  int steps = 0;
  expect_has(failure<not_found>(data_, data_, o, &steps),
             "nothing to resume from in '" + o.checkpoint_dir.string() + "'");
  EXPECT_EQ(steps, 0);
}

TEST_F(Resume, MetadataMustParse) {
  const train_options o = first_epoch();
  const fs::path path = checkpoint_file(o);
  const struct {
    std::string key;
    std::string value;
    std::string part;
  } cases[] = {
      {"epoch", "x", "the epoch in checkpoint '" + path.string() + "': 'x' is not a non-negative"},
      {"epoch", "-1",
       "the epoch in checkpoint '" + path.string() + "': '-1' is not a non-negative"},
      {"epoch", "1.5", "'1.5' is not a non-negative integer"},
      {"epoch", "", "the epoch in checkpoint"},
      {"epoch", "99999999999", "'99999999999' is not a non-negative integer in range"},
      {"epoch", "4000000000", "is out of range"},
      {"step", "many", "the step in checkpoint '" + path.string() + "': 'many' is not"},
      {"step", "-5", "'-5' is not a non-negative integer"},
  };
  for (const auto& c : cases) {
    const train_options fresh = first_epoch();
    edit(fresh, [&](checkpoint::safetensors_file& f) { f.metadata[c.key] = c.value; });
    expect_has(failure<parse_error>(data_, data_, fresh), c.part);
  }
  const train_options fresh = first_epoch();
  edit(fresh, [](checkpoint::safetensors_file& f) { f.metadata.erase("epoch"); });
  expect_has(failure<parse_error>(data_, data_, fresh), "has no \"epoch\" in its metadata");
}

TEST_F(Resume, AnotherModelOrOptimizerIsNamed) {
  train_options o = first_epoch();
  o.optimizer = "sgd";
  expect_has(failure<invalid_argument>(data_, data_, o),
             "was written by a run with the adam optimizer; this run uses sgd");
  o = first_epoch();
  o.hidden = {32};
  expect_has(failure<invalid_argument>(data_, data_, o),
             "holds the model mlp 8-16-3; this run builds mlp 8-32-3");
}

TEST_F(Resume, ShapesDtypesAndNamesAreCheckedNamingTheTensorAndTheFile) {
  const train_options o = first_epoch();
  const std::string path = checkpoint_file(o).string();
  // A tensor of another shape (the metadata does not say so): both shapes and the file.
  edit(o, [](checkpoint::safetensors_file& f) {
    for (auto& [name, t] : f.tensors) {
      if (name == "fc1/b") t = memory::host_tensor(dtype::f32, {17});
    }
  });
  std::string msg = failure<invalid_argument>(data_, data_, o);
  expect_has(msg, "variable 'fc1/b': the graph declares float32[16], the file holds float32[17]");
  expect_has(msg, path);
  // Optimizer state of the wrong shape.
  const train_options again = first_epoch();
  edit(again, [](checkpoint::safetensors_file& f) {
    for (auto& [name, t] : f.tensors) {
      if (name == "fc2/w/adam_v") t = memory::host_tensor(dtype::f32, {3, 16});
    }
  });
  expect_has(failure<invalid_argument>(data_, data_, again),
             "state 'fc2/w/adam_v': the session expects float32[16, 3], the file holds "
             "float32[3, 16]");
  // A dtype.
  const train_options dtyped = first_epoch();
  edit(dtyped, [](checkpoint::safetensors_file& f) {
    for (auto& [name, t] : f.tensors) {
      if (name == "fc2/b") t = memory::host_tensor(dtype::f64, {3});
    }
  });
  expect_has(failure<invalid_argument>(data_, data_, dtyped),
             "variable 'fc2/b': the graph declares float32[3], the file holds float64[3]");
  // A tensor the model does not know.
  const train_options extra = first_epoch();
  edit(extra, [](checkpoint::safetensors_file& f) {
    f.tensors.emplace_back("fc3/w", memory::host_tensor(dtype::f32, {2}));
  });
  expect_has(failure<invalid_argument>(data_, data_, extra),
             "tensor 'fc3/w' (float32[2]) is no variable of the session");
  // A variable of the model missing.
  const train_options missing = first_epoch();
  edit(missing, [](checkpoint::safetensors_file& f) {
    std::erase_if(f.tensors, [](const auto& e) { return e.first == "fc1/w"; });
  });
  msg = failure<not_found>(data_, data_, missing);
  expect_has(msg, "'fc1/w' (float32[8, 16])");
  expect_has(msg, path);
  // A truncated file: named with the offset.
  const train_options truncated = first_epoch();
  fs::resize_file(checkpoint_file(truncated), fs::file_size(checkpoint_file(truncated)) - 7);
  msg = failure<parse_error>(data_, data_, truncated);
  expect_has(msg, path);
  expect_has(msg, "truncated or corrupt");
}

TEST_F(Resume, NonFiniteWeightsAreRefusedUnlessAllowed) {
  train_options o = first_epoch();
  edit(o, [](checkpoint::safetensors_file& f) {
    for (auto& [name, t] : f.tensors) {
      if (name == "fc2/w") t.data<float>()[4] = std::numeric_limits<float>::infinity();
    }
  });
  int steps = 0;
  const std::string msg = failure<invalid_argument>(data_, data_, o, &steps);
  expect_has(msg, "tensor 'fc2/w' (float32[16, 3]) holds inf at element 4");
  expect_has(msg, checkpoint_file(o).string());
  EXPECT_EQ(steps, 0);
  // Allowed: restored, and the first step shows what it does to the loss.
  o.allow_nonfinite = true;
  expect_has(failure<error>(data_, data_, o), "epoch 2, step 1 of 6");
}

TEST_F(Resume, ResumingRemovesTheTemporaryFilesOfAKilledSaveAndNothingElse) {
  const train_options o = first_epoch();
  const fs::path dir = o.checkpoint_dir;
  const std::vector<std::string> keep = {"checkpoint.safetensors.tmp-notes",
                                         "checkpoint.safetensors.tmp-0123456789ABCDEF",
                                         "other.safetensors.tmp-0123456789abcdef", "notes.txt"};
  for (const auto& name : keep) std::ofstream(dir / name) << "keep";
  std::ofstream(dir / "checkpoint.safetensors.tmp-0123456789abcdef") << "half a save";
  std::ofstream(dir / "checkpoint.safetensors.tmp-fedcba9876543210") << "another";
  train_options resume = o;
  resume.epochs = 1;  // nothing to train: the resume alone
  const train_report r = train(data_, data_, resume);
  EXPECT_EQ(r.resumed_epoch, 1);
  EXPECT_TRUE(r.epochs.empty());
  EXPECT_TRUE(std::isnan(r.test_accuracy));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  std::vector<std::string> expected = keep;
  expected.push_back("checkpoint.safetensors");
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(left, expected);
}

TEST_F(Resume, AResumedRunWritesItsStepCount) {
  const train_options o = first_epoch();
  EXPECT_EQ(checkpoint::load_safetensors(checkpoint_file(o)).metadata.at("step"), "6");
  (void)train(data_, data_, o);
  const auto meta = checkpoint::load_safetensors(checkpoint_file(o)).metadata;
  EXPECT_EQ(meta.at("epoch"), "2");
  EXPECT_EQ(meta.at("step"), "12");
}

}  // namespace
}  // namespace loom::train
