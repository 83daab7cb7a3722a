// The robustness catalogue's C++ half: bad inputs and faults, one case each, with the
// outcome each must get (Note [the robustness catalogue], in inputs_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace loom::robustness {

/// What a bad input must get: a typed error of this kind, whose message names what was
/// wrong.
enum class outcome {
  parse_error,       // loom::parse_error: the input could not be read as what it claims to be
  invalid_argument,  // loom::invalid_argument (unsupported_error included)
  unsupported,       // loom::unsupported_error: well-formed, but loom has no support for it
  not_found,         // loom::not_found: a file, node, feed or variable that is not there
  node_error,        // loom::node_error: a node of the graph failed while running
  out_of_memory,     // loom::out_of_memory: a budget or a size that cannot exist
  error,             // any other loom::error (an I/O failure with the system's reason)
  status,            // a C ABI call: returns its documented status, never throws
};

const char* to_string(outcome o);

struct bad_case {
  std::string name;  // [A-Za-z0-9_]: the test's name
  outcome expect;
  std::vector<std::string> message_parts;  // each must appear in the message
  std::function<void()> act;               // does the bad thing; throws (or not, for status)
};

inline std::ostream& operator<<(std::ostream& os, const bad_case& c) { return os << c.name; }
inline std::string case_name(const ::testing::TestParamInfo<bad_case>& info) {
  return info.param.name;
}

/// Runs `c.act` and checks the exception's kind and message.
void expect_outcome(const bad_case& c);

/// A temporary directory, removed (with what is in it) when the process exits.
const std::filesystem::path& scratch_dir();
/// Writes `bytes` to a new file in scratch_dir() named `name`; returns its path.
std::filesystem::path scratch_file(const std::string& name, const std::string& bytes);

/// The bytes of an .npy file: magic, version (major, minor), the header padded as NumPy does
/// (to 64 bytes with spaces and a newline), then `data`.
std::string npy_bytes(const std::string& header, const std::string& data, int major = 1,
                      int minor = 0);
/// The bytes of a safetensors file: the 8-byte little-endian length of `header`, the
/// header, then `data`.
std::string safetensors_bytes(const std::string& header, const std::string& data);

/// A small graph run afterwards on a fresh session: the process is still usable. Also checks
/// that the CPU's default pool holds no more bytes than `baseline_bytes` once the run's
/// tensors are gone (nothing leaked by the case).
void expect_still_usable(std::size_t baseline_bytes);
/// Bytes in use in cpu:0's default resource now.
std::size_t cpu_bytes_in_use();

}  // namespace loom::robustness
