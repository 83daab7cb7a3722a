// A scratch directory for the checkpoint tests, removed with what is in it (read-only
// entries included) when it goes.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace loom::testing {

class temp_dir {
 public:
  explicit temp_dir(const std::string& prefix = "loom_checkpoint_test") {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  [[nodiscard]] std::filesystem::path operator/(const std::string& name) const {
    return path_ / name;
  }
  /// The names of the entries, sorted.
  [[nodiscard]] std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_)) {
      out.push_back(e.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::filesystem::path path_;
};

/// The temporary files of saves in `dir` (a save writes '<file>.tmp-<random>' first).
inline std::vector<std::string> temporaries(const temp_dir& dir) {
  std::vector<std::string> out;
  for (const auto& name : dir.entries()) {
    if (name.find(".tmp-") != std::string::npos) out.push_back(name);
  }
  return out;
}

}  // namespace loom::testing
