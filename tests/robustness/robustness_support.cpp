#include "robustness/robustness_support.hpp"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <typeinfo>

#include "loom/core/error.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/memory/device_resources.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom::robustness {

const char* to_string(outcome o) {
  switch (o) {
    case outcome::parse_error: return "parse_error";
    case outcome::invalid_argument: return "invalid_argument";
    case outcome::unsupported: return "unsupported_error";
    case outcome::not_found: return "not_found";
    case outcome::node_error: return "node_error";
    case outcome::out_of_memory: return "out_of_memory";
    case outcome::error: return "error";
    case outcome::status: return "status";
  }
  return "?";
}

namespace {

// The kind an exception is, most derived first.
outcome kind_of(const std::exception& e) {
  if (dynamic_cast<const parse_error*>(&e)) return outcome::parse_error;
  if (dynamic_cast<const unsupported_error*>(&e)) return outcome::unsupported;
  if (dynamic_cast<const invalid_argument*>(&e)) return outcome::invalid_argument;
  if (dynamic_cast<const not_found*>(&e)) return outcome::not_found;
  if (dynamic_cast<const node_error*>(&e)) return outcome::node_error;
  if (dynamic_cast<const out_of_memory*>(&e)) return outcome::out_of_memory;
  if (dynamic_cast<const error*>(&e)) return outcome::error;
  return outcome::status;  // not one of loom's: reported as a failure below
}

bool is_loom_error(const std::exception& e) {
  return dynamic_cast<const error*>(&e) != nullptr ||
         dynamic_cast<const out_of_memory*>(&e) != nullptr;
}

}  // namespace

void expect_outcome(const bad_case& c) {
  std::string message;
  try {
    c.act();
    if (c.expect != outcome::status) {
      ADD_FAILURE() << c.name << ": accepted; expected " << to_string(c.expect);
    }
    return;
  } catch (const std::exception& e) {
    message = e.what();
    if (!is_loom_error(e)) {
      ADD_FAILURE() << c.name << ": threw " << typeid(e).name()
                    << ", not one of loom's errors: " << message;
      return;
    }
    EXPECT_EQ(to_string(kind_of(e)), std::string(to_string(c.expect))) << message;
  } catch (...) {
    ADD_FAILURE() << c.name << ": threw something that is not a std::exception";
    return;
  }
  for (const auto& part : c.message_parts) {
    EXPECT_NE(message.find(part), std::string::npos)
        << "'" << part << "' is not in the message: " << message;
  }
}

const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() /
             ("loom_robustness_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(std::filesystem::temp_directory_path() /
                                      ("loom_robustness_" + std::to_string(::getpid())),
                                  ec);
    });
    return d;
  }();
  return dir;
}

std::filesystem::path scratch_file(const std::string& name, const std::string& bytes) {
  const auto path = scratch_dir() / name;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

std::string npy_bytes(const std::string& header, const std::string& data, int major, int minor) {
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back(static_cast<char>(minor));
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  std::string h = header;
  while ((out.size() + len_bytes + h.size() + 1) % 64 != 0) h.push_back(' ');
  h.push_back('\n');
  for (std::size_t i = 0; i < len_bytes; ++i) {
    out.push_back(static_cast<char>((h.size() >> (8 * i)) & 0xff));
  }
  return out + h + data;
}

std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out;
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + header + data;
}

std::size_t cpu_bytes_in_use() {
  const auto s = memory::get_device_resource({device_type::cpu, 0}).stats();
  return s ? s->bytes_in_use : 0;
}

void expect_still_usable(std::size_t baseline_bytes) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {-1});
  (void)ops::add(x, x, {.name = "y"});
  session s(std::move(g));
  {
    const auto out = s.run({{"x", memory::host_tensor({3}, {1.5f, -2.0f, 0.25f})}}, {"y"});
    ASSERT_EQ(out.size(), 1u);
    const auto y = out[0].span<float>();
    EXPECT_EQ(y[0], 3.0f);
    EXPECT_EQ(y[1], -4.0f);
    EXPECT_EQ(y[2], 0.5f);
  }
  EXPECT_LE(cpu_bytes_in_use(), baseline_bytes) << "cpu:0 holds more bytes than before the case";
}

}  // namespace loom::robustness
