// The PyTorch peers of the fusion suite's benchmarks: a script of python/bench run by
// /usr/bin/python3 as a subprocess, answering one JSON object on its last line.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::bench {

/// A peer's answer: its JSON object, or why there is none.
struct peer_answer {
  nlohmann::json json;
  std::string unavailable_reason;
  [[nodiscard]] bool available() const { return unavailable_reason.empty(); }
};

/// Runs python/bench/`script` with `args` (each shell-quoted here) and --json. The last line
/// that parses as a JSON object is the answer; one holding "error" (the script could not
/// import torch), one lacking any of `required` keys, no answer at all, or no python or
/// script, make the peer unavailable, with the reason.
peer_answer run_python_peer(const std::string& script, const std::vector<std::string>& args,
                            const std::vector<std::string>& required);

}  // namespace loom::bench
