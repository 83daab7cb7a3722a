#include "loom/core/device_id.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "loom/core/error.hpp"

namespace loom {
namespace {

constexpr std::string_view name_prefix = "/device:";

// The lower-case name of a type, as to_string(device_type) prints it; "gpu" is read as
// "cuda" too.
struct type_name {
  std::string_view name;
  device_type type;
};
constexpr type_name type_names[] = {
    {"cpu", device_type::cpu},         {"cuda", device_type::cuda},
    {"gpu", device_type::cuda},        {"cuda_host", device_type::cuda_host},
    {"opencl", device_type::opencl},   {"vulkan", device_type::vulkan},
    {"metal", device_type::metal},     {"vpi", device_type::vpi},
    {"rocm", device_type::rocm},       {"rocm_host", device_type::rocm_host},
    {"ext_dev", device_type::ext_dev}, {"cuda_managed", device_type::cuda_managed},
};

char ascii_lower(char c) noexcept {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}
char ascii_upper(char c) noexcept {
  return (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c;
}

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  }
  return true;
}

std::optional<device_type> lookup_type(std::string_view s) noexcept {
  for (const type_name& n : type_names) {
    if (iequals(s, n.name)) return n.type;
  }
  return std::nullopt;
}

// Decimal digits that fit std::int32_t; nullopt otherwise (empty, a sign, other characters,
// overflow).
std::optional<std::int32_t> parse_index(std::string_view s) noexcept {
  if (s.empty()) return std::nullopt;
  std::int64_t value = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
    if (value > std::numeric_limits<std::int32_t>::max()) return std::nullopt;
  }
  return static_cast<std::int32_t>(value);
}

constexpr const char* id_expected =
    "expected \"/device:<TYPE>:<index>\" or \"<type>:<index>\", with <type> one of cpu, "
    "cuda (or gpu), cuda_host, cuda_managed, opencl, vulkan, metal, vpi, rocm, rocm_host, "
    "ext_dev in any case, and <index> a non-negative integer below 2^31";
constexpr const char* spec_expected =
    "expected a device name (\"/device:<TYPE>:<index>\" or \"<type>:<index>\"), a type alone "
    "(\"cpu\", \"/device:CPU\", \"/device:CPU:*\"), \"*:<index>\", or \"\" or \"*\" for any "
    "device, with <type> one of cpu, cuda (or gpu), cuda_host, cuda_managed, opencl, vulkan, "
    "metal, vpi, rocm, rocm_host, ext_dev in any case, and <index> a non-negative integer "
    "below 2^31";

// `text` as it can be quoted in a message: printable ASCII as is, `"` and `\` escaped, and
// every other byte (a NUL would cut the message short) as \xNN.
std::string quotable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u >= 0x20 && u < 0x7f) {
      out += c;
    } else {
      out += fmt::format("\\x{:02x}", u);
    }
  }
  return out;
}

[[noreturn]] void reject(std::string_view text, bool partial, std::string_view reason) {
  throw invalid_argument(fmt::format("invalid device {} \"{}\": {}; {}", partial ? "spec" : "name",
                                     quotable(text), reason,
                                     partial ? spec_expected : id_expected));
}

// The one parser behind parse_device_id (partial == false: type and index required) and
// parse_device_spec (partial == true: either may be "*" or missing).
device_spec parse(std::string_view text, bool partial) {
  device_spec spec;
  std::string_view s = text;
  if (s.empty()) {
    if (partial) return spec;
    reject(text, partial, "it is empty");
  }
  if (s == "*" && partial) return spec;
  if (s.substr(0, name_prefix.size()) == name_prefix) s.remove_prefix(name_prefix.size());

  const std::size_t colon = s.find(':');
  const std::string_view type_text = s.substr(0, colon);
  if (type_text.empty()) reject(text, partial, "the device type is missing");
  if (type_text == "*") {
    if (!partial) reject(text, partial, "the device type must be given");
  } else {
    spec.type = lookup_type(type_text);
    if (!spec.type) {
      reject(text, partial, fmt::format("unknown device type \"{}\"", quotable(type_text)));
    }
  }

  if (colon == std::string_view::npos) {
    if (!partial) reject(text, partial, "the device index is missing");
    return spec;
  }
  const std::string_view index_text = s.substr(colon + 1);
  if (index_text.find(':') != std::string_view::npos) {
    reject(text, partial, "it has more than two fields");
  }
  if (index_text.empty()) reject(text, partial, "the device index is missing after ':'");
  if (index_text == "*") {
    if (!partial) reject(text, partial, "the device index must be given");
    return spec;
  }
  spec.index = parse_index(index_text);
  if (!spec.index) {
    reject(text, partial,
           fmt::format("the device index \"{}\" is not a non-negative integer below 2^31",
                       quotable(index_text)));
  }
  return spec;
}

}  // namespace

const char* to_string(device_type t) noexcept {
  switch (t) {
    case device_type::cpu:
      return "cpu";
    case device_type::cuda:
      return "cuda";
    case device_type::cuda_host:
      return "cuda_host";
    case device_type::opencl:
      return "opencl";
    case device_type::vulkan:
      return "vulkan";
    case device_type::metal:
      return "metal";
    case device_type::vpi:
      return "vpi";
    case device_type::rocm:
      return "rocm";
    case device_type::rocm_host:
      return "rocm_host";
    case device_type::ext_dev:
      return "ext_dev";
    case device_type::cuda_managed:
      return "cuda_managed";
  }
  return "unknown";
}

std::string to_string(device_id d) {
  return fmt::format("{}:{}", to_string(d.type), d.index);
}

std::string full_name(device_id d) {
  if (!is_valid_device_type(static_cast<std::int32_t>(d.type))) {
    return fmt::format("{}UNKNOWN({}):{}", name_prefix, static_cast<std::int32_t>(d.type), d.index);
  }
  std::string type = to_string(d.type);
  for (char& c : type) c = ascii_upper(c);
  return fmt::format("{}{}:{}", name_prefix, type, d.index);
}

device_id parse_device_id(std::string_view text) {
  const device_spec spec = parse(text, /*partial=*/false);
  return device_id{*spec.type, *spec.index};
}

bool device_spec::matches(device_id d) const noexcept {
  return (!type || *type == d.type) && (!index || *index == d.index);
}

std::string device_spec::to_string() const {
  if (!type && !index) return "*";
  const std::string t = type ? loom::to_string(*type) : "*";
  return index ? fmt::format("{}:{}", t, *index) : t;
}

device_spec parse_device_spec(std::string_view text) {
  return parse(text, /*partial=*/true);
}

task_request parse_task_request(std::string_view text) {
  task_request r;
  std::string_view s = text;
  const auto bad = [&](std::string_view why) {
    throw invalid_argument(fmt::format("device request \"{}\": {}", quotable(text), why));
  };
  // One "/<key>:<value>" field at the front of s, when it is there.
  const auto field = [&](std::string_view key) -> std::optional<std::string_view> {
    const std::string prefix = fmt::format("/{}:", key);
    if (!s.starts_with(prefix)) return std::nullopt;
    s.remove_prefix(prefix.size());
    const std::size_t end = std::min(s.find('/'), s.size());
    const std::string_view value = s.substr(0, end);
    s.remove_prefix(end);
    return value;
  };
  if (const auto job = field("job")) {
    if (*job != "worker") {
      bad(fmt::format("unknown job \"{}\" (loom's processes are one job: "
                      "/job:worker/task:0, /job:worker/task:1, ...)",
                      quotable(*job)));
    }
  }
  if (const auto replica = field("replica"); replica && *replica != "0") {
    bad(fmt::format("replica \"{}\": only replica 0 exists", quotable(*replica)));
  }
  if (const auto task = field("task")) {
    r.task = parse_index(*task);
    if (!r.task) {
      bad(fmt::format("the task \"{}\" is not a non-negative integer below 2^31",
                      quotable(*task)));
    }
  }
  if (s.size() != text.size() && !s.empty()) {
    // What follows the process part: "/device:CPU:0" or "/cpu:0".
    if (!s.starts_with(name_prefix)) s.remove_prefix(1);
  }
  r.device = parse_device_spec(s);
  return r;
}

std::string task_device_name(std::int32_t task, device_id d) {
  return fmt::format("/job:worker/task:{}{}", task, full_name(d));
}

}  // namespace loom
