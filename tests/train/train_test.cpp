// loom::train: the digits dataset, CSV loading, splitting, and end-to-end training: the MLP
// and the CNN learn, fused and per-tensor updates give the same model, and a run resumed
// from a checkpoint ends where an uninterrupted one does.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "loom/core/error.hpp"
#include "loom/train/dataset.hpp"
#include "loom/train/trainer.hpp"
#include "train/train_test_support.hpp"

namespace loom::train {
namespace {

TEST(Digits, AreDeterministicBalancedAndInRange) {
  const dataset a = make_digits(200, 7);
  const dataset b = make_digits(200, 7);
  const dataset c = make_digits(200, 8);
  EXPECT_EQ(a.features, b.features);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_NE(a.features, c.features);
  EXPECT_EQ(a.example_shape, (shape{1, 28, 28}));
  ASSERT_EQ(a.features.size(), 200u * 784u);
  std::vector<int> counts(10, 0);
  for (auto l : a.labels) ++counts[static_cast<std::size_t>(l)];
  for (int k : counts) EXPECT_EQ(k, 20);
  for (float v : a.features) {
    ASSERT_GE(v, 0.0f);
    ASSERT_LE(v, 1.0f);
  }
  // Every image has ink: its brightest pixels are well above the noise.
  for (std::int64_t i = 0; i < a.size(); ++i) {
    const auto* img = a.features.data() + i * 784;
    EXPECT_GT(*std::max_element(img, img + 784), 0.5f) << "image " << i;
  }
}

TEST(Digits, ClassesDifferOnAverage) {
  // The mean image of each class differs from every other's (a sanity check that labels
  // and pictures go together: a 1 has far less ink than an 8).
  const dataset d = make_digits(1000, 3);
  std::vector<double> ink(10, 0.0);
  for (std::int64_t i = 0; i < d.size(); ++i) {
    double s = 0;
    for (int k = 0; k < 784; ++k) s += d.features[static_cast<std::size_t>(i * 784 + k)];
    ink[static_cast<std::size_t>(d.labels[static_cast<std::size_t>(i)])] += s / 100.0;
  }
  EXPECT_LT(ink[1], ink[8] * 0.5);  // two segments against seven
  EXPECT_LT(ink[7], ink[0]);
}

TEST(Csv, LoadsLabelsAndFeaturesAndNamesErrors) {
  const auto dir = temp_dir("csv");
  const auto good = dir / "good.csv";
  std::ofstream(good) << "label,a,b,c\n1,0.5,1,2\n\n0, 3,4 ,5\r\n2,6,7,8\n";
  const dataset d = load_csv(good);
  EXPECT_EQ(d.labels, (std::vector<std::int32_t>{1, 0, 2}));
  EXPECT_EQ(d.features, (std::vector<float>{0.5f, 1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(d.num_classes, 3);
  EXPECT_EQ(d.example_shape, (shape{3}));

  const auto expect_error = [&](const std::string& text, const std::string& part,
                                std::size_t line) {
    const auto bad = dir / "bad.csv";
    std::ofstream(bad) << text;
    try {
      (void)load_csv(bad);
      ADD_FAILURE() << "no error for: " << text;
    } catch (const parse_error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      EXPECT_EQ(e.line(), line) << e.what();
    }
  };
  expect_error("1,2,3\n1,2\n", "the row has 2 columns, but the first row (line 1) has 3", 2);
  expect_error("1,2,x\n", "column 3 ('x') is not a number", 1);
  expect_error("-1,2\n", "the label -1 is negative", 1);
  expect_error("1.5,2\n", "the label 1.5 is not an integer", 1);
  expect_error("", "no data rows", 0);
  expect_error("3\n", "needs a label and at least one feature", 1);
  EXPECT_THROW((void)load_csv(dir / "missing.csv"), not_found);
}

TEST(Split, IsADeterministicPartition) {
  const dataset d = make_digits(100, 1);
  const auto [train_a, test_a] = split(d, 0.2, 5);
  const auto [train_b, test_b] = split(d, 0.2, 5);
  EXPECT_EQ(train_a.size(), 80);
  EXPECT_EQ(test_a.size(), 20);
  EXPECT_EQ(train_a.features, train_b.features);
  EXPECT_EQ(test_a.labels, test_b.labels);
  // Every example lands in exactly one part: compare multisets of first pixels + labels.
  std::multiset<std::pair<float, int>> all;
  std::multiset<std::pair<float, int>> parts;
  for (std::int64_t i = 0; i < d.size(); ++i)
    all.insert({d.features[static_cast<std::size_t>(i * 784 + 300)],
                d.labels[static_cast<std::size_t>(i)]});
  for (const dataset* p : {&train_a, &test_a}) {
    for (std::int64_t i = 0; i < p->size(); ++i) {
      parts.insert({p->features[static_cast<std::size_t>(i * 784 + 300)],
                    p->labels[static_cast<std::size_t>(i)]});
    }
  }
  EXPECT_EQ(all, parts);
  EXPECT_THROW((void)split(d, 1.0, 1), invalid_argument);
}

TEST(Train, AnMlpLearnsTheDigits) {
  const auto [tr, te] = split(make_digits(3000, 11), 0.2, 11);
  const auto report = train(tr, te, small_mlp());
  ASSERT_EQ(report.epochs.size(), 2u);
  EXPECT_LT(report.epochs[1].loss, report.epochs[0].loss);
  EXPECT_GT(report.test_accuracy, 0.7) << "chance is 0.10";
  EXPECT_GT(report.samples_per_second, 0.0);
  EXPECT_GT(report.peak_bytes, 0u);
  EXPECT_EQ(report.steps, 2 * (2400 / 32));
}

TEST(Train, ACnnLearnsTheDigits) {
  const auto [tr, te] = split(make_digits(1200, 12), 0.2, 12);
  train_options o = small_mlp();
  o.model = "cnn";
  o.epochs = 2;
  const auto report = train(tr, te, o);
  EXPECT_GT(report.test_accuracy, 0.6) << "chance is 0.10";
}

TEST(Train, ProfileReportsEveryNodeSlowestFirst) {
  const auto [tr, te] = split(make_digits(600, 14), 0.2, 14);
  train_options o = small_mlp();
  o.epochs = 1;
  EXPECT_TRUE(train(tr, te, o).profile.empty()) << "only with profile";
  o.profile = true;
  const auto report = train(tr, te, o);
  ASSERT_FALSE(report.profile.empty());
  std::set<std::string> ops;
  double total = 0;
  for (std::size_t i = 0; i < report.profile.size(); ++i) {
    const node_time& n = report.profile[i];
    EXPECT_FALSE(n.node.empty());
    EXPECT_GE(n.seconds_per_step, 0.0) << n.node;
    if (i > 0) {
      EXPECT_LE(n.seconds_per_step, report.profile[i - 1].seconds_per_step) << n.node;
    }
    ops.insert(n.op);
    total += n.seconds_per_step;
  }
  // The forward matmuls, their gradients and the fused update are all there.
  for (const char* op : {"matmul", "relu_grad", "fused_adam"}) EXPECT_TRUE(ops.contains(op)) << op;
  // Two threads can overlap nodes, but no more than two steps' worth of node time per step.
  const double step = report.train_seconds / static_cast<double>(report.steps);
  EXPECT_LE(total, 2.0 * step + 1e-3);
}

TEST(Train, FusedAndPerTensorUpdatesTrainTheSameModel) {
  const auto [tr, te] = split(make_digits(600, 13), 0.2, 13);
  for (const char* opt : {"adam", "adamw", "sgd"}) {
    train_options o = small_mlp();
    o.optimizer = opt;
    o.epochs = 1;
    o.fused = true;
    const auto fused = train(tr, te, o);
    o.fused = false;
    const auto unfused = train(tr, te, o);
    // The element math is shared, so the losses agree exactly step for step.
    EXPECT_EQ(fused.epochs[0].loss, unfused.epochs[0].loss) << opt;
    EXPECT_EQ(fused.test_accuracy, unfused.test_accuracy) << opt;
  }
}

TEST(Train, AResumedRunEndsWhereAnUninterruptedOneDoes) {
  const auto [tr, te] = split(make_digits(600, 14), 0.2, 14);
  train_options o = small_mlp();
  o.epochs = 2;
  const auto straight = train(tr, te, o);
  o.checkpoint_dir = temp_dir("resume");
  o.epochs = 1;
  (void)train(tr, te, o);
  EXPECT_TRUE(std::filesystem::exists(o.checkpoint_dir / "checkpoint.safetensors"));
  o.epochs = 2;
  o.resume = true;
  const auto resumed = train(tr, te, o);
  EXPECT_EQ(resumed.resumed_epoch, 1);
  ASSERT_EQ(resumed.epochs.size(), 1u);
  EXPECT_EQ(resumed.epochs[0].epoch, 2);
  EXPECT_EQ(resumed.epochs[0].loss, straight.epochs[1].loss);
  EXPECT_EQ(resumed.test_accuracy, straight.test_accuracy);
}

TEST(Train, BadOptionsAreClearErrors) {
  const dataset d = make_digits(100, 1);
  train_options o = small_mlp();
  o.model = "transformer";
  EXPECT_THROW((void)train(d, d, o), invalid_argument);
  o = small_mlp();
  o.optimizer = "lion";
  EXPECT_THROW((void)train(d, d, o), invalid_argument);
  o = small_mlp();
  o.batch = 1000;
  EXPECT_THROW((void)train(d, d, o), invalid_argument);
  o = small_mlp();
  o.resume = true;
  EXPECT_THROW((void)train(d, d, o), invalid_argument);
  dataset flat = d;
  flat.example_shape = {784};
  o = small_mlp();
  o.model = "cnn";
  try {
    (void)train(flat, flat, o);
    FAIL() << "expected invalid_argument";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("1x28x28"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::train
