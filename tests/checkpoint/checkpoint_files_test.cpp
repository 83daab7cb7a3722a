// Checkpoint files on disk: a save killed at random moments (kill -9) never costs the
// checkpoint before it, and the temporary files it leaves are removed by the next save, or by
// remove_stale_temporaries (what a resume calls), and nothing else is; a write that fails
// midway removes its temporary file; a truncated or corrupt file is named with the offset at
// fault; a checkpoint directory that cannot be made is an error naming it before any work.
#include <gtest/gtest.h>

#include "checkpoint/checkpoint_test_support.hpp"
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "loom/checkpoint/safetensors.hpp"
#include "loom/core/error.hpp"
#include "loom/core/input.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::checkpoint {
namespace {

namespace fs = std::filesystem;
using named = std::vector<std::pair<std::string, tensor>>;

using loom::testing::temp_dir;
using loom::testing::temporaries;

// Version v of a checkpoint: `elements` floats, each v.
named version(int v, std::int64_t elements) {
  tensor t = memory::host_tensor(dtype::f32, {elements});
  std::fill_n(t.data<float>(), elements, static_cast<float>(v));
  return {{"w", t}};
}

void touch(const fs::path& p, const std::string& text = "x") {
  std::ofstream(p, std::ios::binary) << text;
}

std::string read_text(const fs::path& p) {
  return read_input_file(p, "test file");
}

// The checkpoint at `path` is whole: its metadata names a version and every element is it.
void expect_whole(const fs::path& path, std::int64_t elements) {
  const safetensors_file f = load_safetensors(path);
  const int v = parse_number<int>(f.metadata.at("version"), "version");
  ASSERT_EQ(f.tensors.size(), 1u);
  const tensor& t = f.tensors[0].second;
  ASSERT_EQ(t.num_elements(), elements);
  const float* p = t.data<float>();
  EXPECT_TRUE(std::all_of(p, p + elements, [v](float x) { return x == static_cast<float>(v); }))
      << "version " << v << " is not whole";
}

// The temporary files of saves of `path` in `dir` (Note [temporary file names]).
std::vector<std::string> save_temporaries(const temp_dir& dir, const fs::path& path) {
  const std::string prefix = path.filename().string() + ".tmp-";
  std::vector<std::string> out;
  for (const auto& name : dir.entries()) {
    if (name.size() == prefix.size() + 16 && name.starts_with(prefix) &&
        std::all_of(name.begin() + static_cast<std::ptrdiff_t>(prefix.size()), name.end(),
                    [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); })) {
      out.push_back(name);
    }
  }
  return out;
}

// Whether a save of `path` has made a temporary file that is not one of `before`.
bool saving(const temp_dir& dir, const fs::path& path, const std::vector<std::string>& before) {
  for (const auto& name : save_temporaries(dir, path)) {
    if (std::find(before.begin(), before.end(), name) == before.end()) return true;
  }
  return false;
}

// A child that saves new versions of `path` until it is killed; returns once it is writing
// (a temporary file of its save exists).
pid_t start_saving(const temp_dir& dir, const fs::path& path, int round, std::int64_t elements) {
  const std::vector<std::string> before = save_temporaries(dir, path);
  const pid_t child = ::fork();
  if (child == 0) {
    for (int v = 1;; ++v) {
      const int id = round * 100000 + v;
      try {
        save_safetensors(path, version(id, elements), {{"version", std::to_string(id)}});
      } catch (...) {
        ::_exit(3);
      }
    }
  }
  for (int i = 0; i < 20000 && !saving(dir, path, before); ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(250));
  }
  return child;
}

void kill_and_reap(pid_t child) {
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the saving child exited by itself: status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
}

TEST(CheckpointFiles, ASaveKilledAtRandomMomentsNeverCostsTheCheckpointBeforeIt) {
  temp_dir dir;
  const fs::path path = dir.path() / "big.safetensors";
  constexpr std::int64_t elements = std::int64_t{4} << 20;  // 16 MiB a version
  save_safetensors(path, version(0, elements), {{"version", "0"}});
  // Files that look alike but are not a save's temporaries of big.safetensors.
  touch(dir.path() / "big.safetensors.tmp-notes", "notes");
  touch(dir.path() / "big.safetensors.tmp-0123456789ABCDEF", "upper case");
  touch(dir.path() / "big.safetensors.tmp-0123456789abcdef0", "17 digits");
  touch(dir.path() / "other.safetensors.tmp-0123456789abcdef", "another checkpoint's");
  const std::vector<std::string> bystanders = {
      "big.safetensors.tmp-0123456789ABCDEF", "big.safetensors.tmp-0123456789abcdef0",
      "big.safetensors.tmp-notes", "other.safetensors.tmp-0123456789abcdef"};
  const auto stale = [&] {
    std::vector<std::string> out;
    for (const auto& name : temporaries(dir)) {
      if (std::find(bystanders.begin(), bystanders.end(), name) == bystanders.end()) {
        out.push_back(name);
      }
    }
    return out;
  };

  std::mt19937 rng(2024);
  std::size_t left_behind = 0;
  for (int round = 0; round < 20; ++round) {
    const pid_t child = start_saving(dir, path, round + 1, elements);
    ASSERT_GT(child, 0);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 20000));
    kill_and_reap(child);
    expect_whole(path, elements);  // the old checkpoint, or a newer one: never a mixture
    // A killed save leaves at most its own temporary (it removed those of the saves before).
    EXPECT_LE(stale().size(), 1u);
    left_behind += stale().size();
    for (const auto& name : bystanders) ASSERT_TRUE(fs::exists(dir.path() / name)) << name;
  }
  EXPECT_GT(left_behind, 0u) << "no kill came while a save was writing";

  // What a resume does: the stale temporaries go, and only they.
  const pid_t child = start_saving(dir, path, 99, elements);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  kill_and_reap(child);
  const std::vector<std::string> left = stale();
  std::vector<std::string> removed;
  for (const fs::path& p : remove_stale_temporaries(path)) {
    removed.push_back(p.filename().string());
  }
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, left);
  EXPECT_TRUE(stale().empty());
  std::vector<std::string> expected = bystanders;
  expected.push_back("big.safetensors");
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(dir.entries(), expected);
  expect_whole(path, elements);

  // What the next save does: the same.
  const pid_t again = start_saving(dir, path, 100, elements);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  kill_and_reap(again);
  save_safetensors(path, version(7, elements), {{"version", "7"}});
  EXPECT_EQ(dir.entries(), expected);
  expect_whole(path, elements);
  EXPECT_EQ(read_text(dir.path() / "big.safetensors.tmp-notes"), "notes");
}

TEST(CheckpointFiles, ALiveSavesTemporaryFileIsNotRemoved) {
  temp_dir dir;
  const fs::path path = dir.path() / "m.safetensors";
  // A save in progress holds its temporary file locked.
  const fs::path live = dir.path() / "m.safetensors.tmp-00000000deadbeef";
  const fs::path dead = dir.path() / "m.safetensors.tmp-00000000feedface";
  touch(live);
  touch(dead);
  const int fd = ::open(live.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  const auto removed = remove_stale_temporaries(path);
  EXPECT_EQ(removed, (std::vector<fs::path>{dead}));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_FALSE(fs::exists(dead));
  ::close(fd);  // the save died: its file is stale now
  EXPECT_EQ(remove_stale_temporaries(path), (std::vector<fs::path>{live}));
  EXPECT_FALSE(fs::exists(live));
  // A directory of that name, or a link, is not a temporary file; nor is anything at all in
  // a directory that does not exist.
  fs::create_directory(dir.path() / "m.safetensors.tmp-0000000000000001");
  fs::create_symlink(dir.path() / "elsewhere", dir.path() / "m.safetensors.tmp-0000000000000002");
  EXPECT_TRUE(remove_stale_temporaries(path).empty());
  EXPECT_TRUE(remove_stale_temporaries(dir.path() / "missing" / "m.safetensors").empty());
  EXPECT_EQ(dir.entries().size(), 2u);
}

TEST(CheckpointFiles, AWriteThatFailsMidwayRemovesItsTemporaryFile) {
  temp_dir dir;
  const fs::path path = dir.path() / "m.safetensors";
  save_safetensors(path, version(1, 16), {{"version", "1"}});
  const std::string before = read_text(path);
  // In a child, so the limit stays there: files may not grow past 64 KiB, so the write of a
  // 4 MiB checkpoint fails partway (EFBIG) after the temporary file has taken data.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{64 << 10, 64 << 10};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(10);
    try {
      save_safetensors(path, version(2, 1 << 20), {{"version", "2"}});
      ::_exit(11);  // no error
    } catch (const loom::error& e) {
      const std::string msg = e.what();
      if (msg.find("writing") == std::string::npos || msg.find(".tmp-") == std::string::npos ||
          msg.find("File too large") == std::string::npos) {
        ::_exit(12);
      }
    } catch (...) {
      ::_exit(13);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: setrlimit, 11: no error, 12: message, 13: type";
  EXPECT_EQ(read_text(path), before);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"m.safetensors"}));
}

TEST(CheckpointFiles, TruncatedAndCorruptFilesNameTheFileAndTheOffset) {
  temp_dir dir;
  const fs::path path = dir.path() / "m.safetensors";
  save_safetensors(path, version(3, 1000), {{"version", "3"}});
  const std::string whole = read_text(path);
  const auto failure = [&](const std::string& bytes) -> std::string {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    try {
      (void)load_safetensors(path);
    } catch (const parse_error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path.string() + ": ", 0), 0u) << msg;
      return msg;
    }
    ADD_FAILURE() << "no error for " << bytes.size() << " bytes";
    return {};
  };
  // Cut in the data: the tensor's end against the file's.
  const std::size_t data_start = whole.size() - 4000;
  std::string msg = failure(whole.substr(0, whole.size() - 10));
  EXPECT_NE(msg.find("the tensor would end at byte " + std::to_string(whole.size()) +
                     " of the file, which ends at byte " + std::to_string(whole.size() - 10)),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  // Cut in the header.
  msg = failure(whole.substr(0, data_start / 2));
  EXPECT_NE(msg.find("the header length is"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated or corrupt"), std::string::npos) << msg;
  // A byte of the header's JSON overwritten: the offset of the byte.
  std::string corrupt = whole;
  const std::size_t at = corrupt.find("\"dtype\"");
  corrupt[at] = '#';
  msg = failure(corrupt);
  EXPECT_NE(msg.find("not valid JSON (at byte " + std::to_string(at) + " of the file)"),
            std::string::npos)
      << msg;
}

TEST(OutputPaths, ADirectoryThatCannotBeMadeIsNamedWithTheReason) {
  temp_dir dir;
  // Made, with its parents; an existing one is fine.
  const fs::path nested = dir.path() / "a" / "b" / "c";
  create_output_directory(nested, "checkpoint directory");
  EXPECT_TRUE(fs::is_directory(nested));
  EXPECT_TRUE(fs::is_empty(nested));  // the write probe is gone
  create_output_directory(nested, "checkpoint directory");

  const fs::path file = dir.path() / "file";
  touch(file);
  const auto failure = [](const fs::path& p) -> std::pair<std::string, bool> {
    try {
      create_output_directory(p, "checkpoint directory");
    } catch (const invalid_argument& e) {
      return {e.what(), true};
    } catch (const loom::error& e) {
      return {e.what(), false};
    }
    ADD_FAILURE() << "no error for " << p;
    return {};
  };
  auto [msg, usage] = failure(file / "sub");
  EXPECT_TRUE(usage);
  EXPECT_NE(msg.find("checkpoint directory '" + (file / "sub").string() + "': '" + file.string() +
                     "' is a file, not a directory"),
            std::string::npos)
      << msg;
  std::tie(msg, usage) = failure(file);
  EXPECT_TRUE(usage);
  EXPECT_NE(msg.find("'" + file.string() + "' is a file, not a directory"), std::string::npos)
      << msg;
  // /proc takes no directories of ours, nor files: the system's reason.
  std::tie(msg, usage) = failure("/proc/loom-checkpoints/x");
  EXPECT_FALSE(usage);
  EXPECT_NE(msg.find("checkpoint directory '/proc/loom-checkpoints/x': cannot create it: "),
            std::string::npos)
      << msg;
  std::tie(msg, usage) = failure("/proc");
  EXPECT_FALSE(usage);
  EXPECT_NE(msg.find("checkpoint directory '/proc': cannot write in it: "), std::string::npos)
      << msg;
  EXPECT_THROW(create_output_directory("", "checkpoint directory"), invalid_argument);
}

TEST(OutputPaths, AnOutputFileIsCheckedWithoutBeingChanged) {
  temp_dir dir;
  const fs::path existing = dir.path() / "trace.json";
  touch(existing, "keep me");
  check_output_file(existing, "trace file");
  EXPECT_EQ(read_text(existing), "keep me");
  const fs::path absent = dir.path() / "new.json";
  check_output_file(absent, "trace file");
  EXPECT_FALSE(fs::exists(absent));  // checked, and not left behind

  EXPECT_THROW(check_output_file(dir.path(), "trace file"), invalid_argument);
  EXPECT_THROW(check_output_file(existing / "t.json", "trace file"), invalid_argument);
  try {
    check_output_file(dir.path() / "missing" / "t.json", "trace file");
    ADD_FAILURE() << "no error";
  } catch (const not_found& e) {
    EXPECT_NE(std::string(e.what()).find("its directory '" + (dir.path() / "missing").string() +
                                         "' does not exist"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(check_output_file("/proc/loom-trace.json", "trace file"), loom::error);
}

}  // namespace
}  // namespace loom::checkpoint
