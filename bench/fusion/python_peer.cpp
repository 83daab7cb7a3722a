// The PyTorch peers (fusion/python_peer.hpp).
#include "fusion/python_peer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <vector>

namespace loom::bench {
namespace {

constexpr const char* python = "/usr/bin/python3";

// Where python/bench/`script` is: beside the source tree's bench/ directory (__FILE__, when
// the compiler wrote it absolute), beside the build directory holding this executable, or
// under the working directory.
std::filesystem::path script_path(const std::string& script) {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  const fs::path source(__FILE__);
  if (source.is_absolute()) candidates.push_back(source.parent_path().parent_path().parent_path());
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(exe.parent_path().parent_path());
  candidates.push_back(fs::current_path(ec));
  for (const fs::path& root : candidates) {
    const fs::path p = root / "python" / "bench" / script;
    if (fs::exists(p, ec)) return p;
  }
  return fs::path("python") / "bench" / script;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (const char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

}  // namespace

peer_answer run_python_peer(const std::string& script, const std::vector<std::string>& args,
                            const std::vector<std::string>& required) {
  peer_answer r;
  const auto path = script_path(script);
  if (!std::filesystem::exists(python)) {
    r.unavailable_reason = fmt::format("{} not found", python);
    return r;
  }
  if (!std::filesystem::exists(path)) {
    r.unavailable_reason = fmt::format("{} not found", path.string());
    return r;
  }
  std::vector<std::string> words{python, shell_quote(path.string())};
  for (const std::string& a : args) words.push_back(shell_quote(a));
  const std::string command = fmt::format("{} --json 2>&1", fmt::join(words, " "));
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    r.unavailable_reason = fmt::format("could not start: {}", command);
    return r;
  }
  std::string out;
  std::array<char, 4096> buf{};
  std::size_t got = 0;
  while ((got = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), got);
  const int status = ::pclose(pipe);
  // The last line that parses as a JSON object is the script's answer.
  nlohmann::json answer;
  std::size_t end = out.size();
  while (end > 0) {
    const std::size_t begin = out.rfind('\n', end - 1);
    const std::size_t from = begin == std::string::npos ? 0 : begin + 1;
    const std::string line = out.substr(from, end - from);
    if (!line.empty() && line.front() == '{') {
      answer = nlohmann::json::parse(line, nullptr, false);
      if (!answer.is_discarded()) break;
    }
    if (begin == std::string::npos) break;
    end = begin;
  }
  if (answer.is_object() && answer.contains("error")) {
    r.unavailable_reason = answer["error"].get<std::string>();
    return r;
  }
  bool complete = answer.is_object();
  for (const std::string& k : required) complete = complete && answer.contains(k);
  if (!complete) {
    const std::string tail = out.size() > 400 ? out.substr(out.size() - 400) : out;
    r.unavailable_reason =
        fmt::format("{} exited with status {} and no result: {}", script,
                    WIFEXITED(status) ? WEXITSTATUS(status) : -1, tail);
    return r;
  }
  r.json = std::move(answer);
  return r;
}

}  // namespace loom::bench
