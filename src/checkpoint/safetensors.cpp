// safetensors reading and writing: Note [safetensors format]
// (include/loom/checkpoint/safetensors.hpp).
#include "loom/core/input.hpp"
#include "loom/checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <system_error>
#include <unordered_set>
#include <utility>

#include "loom/core/error.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::checkpoint {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors I/O copies little-endian data as is");

using json = nlohmann::json;

constexpr std::string_view metadata_key = "__metadata__";
constexpr std::size_t length_bytes = 8;
// The top-level object, a tensor's entry, its "shape" / "data_offsets" arrays.
constexpr std::size_t max_json_depth = 3;

struct dtype_name {
  std::string_view name;
  dtype type;
};
constexpr dtype_name dtype_names[] = {
    {"F64", dtype::f64},   {"F32", dtype::f32}, {"F16", dtype::f16},
    {"BF16", dtype::bf16}, {"I64", dtype::i64}, {"I32", dtype::i32},
    {"I8", dtype::i8},     {"U8", dtype::u8},   {"BOOL", dtype::boolean},
};

std::string_view name_of(dtype t) {
  for (const auto& d : dtype_names) {
    if (d.type == t) return d.name;
  }
  return "?";
}

// `text` as a JSON string, for messages: quoted and escaped, so names with control
// characters or odd bytes print safely.
std::string json_quoted(std::string_view text) {
  return json(std::string(text)).dump(-1, ' ', true, json::error_handler_t::replace);
}

std::string errno_text(int err) {
  return std::system_category().message(err);
}

// ---- reading -----------------------------------------------------------------------------

// One tensor's entry in the header, checked against the size of the data.
struct entry {
  std::string name;
  dtype type = dtype::f32;
  shape dims;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

struct header {
  std::vector<entry> entries;  // in header order
  std::map<std::string, std::string> metadata;
};

class header_parser {
 public:
  // `data_start`: the offset of the data in the file (8 + the header length), so that
  // messages can name offsets in the file.
  header_parser(std::string_view what, std::uint64_t data_start, std::uint64_t data_size)
      : what_(what), data_start_(data_start), data_size_(data_size) {}

  [[noreturn]] void bad(const std::string& message) const {
    throw parse_error(fmt::format("{}: {}", what_, message), 0);
  }

  header run(std::string_view text) {
    const json root = parse_json(text);
    if (!root.is_object()) {
      bad(fmt::format("the header is a JSON {}, not an object", root.type_name()));
    }
    header h;
    for (const std::string& key : order_) {
      const json& value = root.find(key).value();
      if (key == metadata_key) {
        read_metadata(value, h.metadata);
      } else {
        h.entries.push_back(read_entry(key, value));
      }
    }
    check_overlaps(h.entries);
    return h;
  }

 private:
  // The header as JSON. nlohmann's object keeps the last of duplicate keys and sorts its
  // keys, so a parser callback sees each key as it comes: it refuses duplicates at any
  // level, records the tensors' order, and bounds the nesting (a hostile header could
  // otherwise nest arrays a million deep).
  json parse_json(std::string_view text) {
    std::vector<std::unordered_set<std::string>> stack;  // the keys of each open container
    std::string current;  // the top-level key whose value is being parsed
    auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
      switch (event) {
        case json::parse_event_t::object_start:
        case json::parse_event_t::array_start:
          if (stack.size() >= max_json_depth) {
            bad(fmt::format(
                "the header nests JSON deeper than a safetensors header does ({} "
                "levels){}",
                max_json_depth,
                order_.empty() ? "" : fmt::format(", in the entry of {}", json_quoted(current))));
          }
          stack.emplace_back();
          break;
        case json::parse_event_t::object_end:
        case json::parse_event_t::array_end:
          stack.pop_back();
          break;
        case json::parse_event_t::key: {
          const auto& key = parsed.get_ref<const std::string&>();
          if (stack.size() == 1) {
            if (!stack.back().insert(key).second) {
              bad(key == metadata_key ? "\"__metadata__\" appears twice"
                                      : fmt::format("tensor {} appears twice", json_quoted(key)));
            }
            current = key;
            order_.push_back(key);
          } else if (!stack.back().insert(key).second) {
            bad(fmt::format("key {} appears twice in the entry of {}", json_quoted(key),
                            json_quoted(current)));
          }
          break;
        }
        case json::parse_event_t::value:
          break;
      }
      return true;
    };
    try {
      return json::parse(text.begin(), text.end(), callback);
    } catch (const json::parse_error& e) {
      // e.byte counts from 1 within the header, which starts at offset 8 of the file.
      bad(fmt::format("the header is not valid JSON (at byte {} of the file): {}",
                      length_bytes + (e.byte > 0 ? e.byte - 1 : 0), e.what()));
    } catch (const json::exception& e) {
      bad(fmt::format("the header is not valid JSON: {}", e.what()));
    }
  }

  void read_metadata(const json& value, std::map<std::string, std::string>& out) const {
    if (!value.is_object()) {
      bad(fmt::format("\"__metadata__\" must be an object of strings, not a {}",
                      value.type_name()));
    }
    for (const auto& [k, v] : value.items()) {
      if (!v.is_string()) {
        bad(fmt::format("\"__metadata__\" must be an object of strings; {} is a {}", json_quoted(k),
                        v.type_name()));
      }
      out.emplace(k, v.get<std::string>());
    }
  }

  entry read_entry(const std::string& name, const json& value) const {
    const std::string who = fmt::format("tensor {}", json_quoted(name));
    if (!value.is_object()) {
      bad(fmt::format("{}: its entry must be an object, not a {}", who, value.type_name()));
    }
    for (const auto& [k, v] : value.items()) {
      if (k != "dtype" && k != "shape" && k != "data_offsets") {
        bad(
            fmt::format("{}: unexpected key {} (an entry has \"dtype\", \"shape\" and "
                        "\"data_offsets\")",
                        who, json_quoted(k)));
      }
    }
    auto field = [&](const char* key) -> const json& {
      auto it = value.find(key);
      if (it == value.end()) bad(fmt::format("{}: no \"{}\"", who, key));
      return *it;
    };
    entry e;
    e.name = name;

    const json& type = field("dtype");
    if (!type.is_string())
      bad(fmt::format("{}: \"dtype\" must be a string, not a {}", who, type.type_name()));
    const auto& type_text = type.get_ref<const std::string&>();
    const auto* known = std::find_if(std::begin(dtype_names), std::end(dtype_names),
                                     [&](const dtype_name& d) { return d.name == type_text; });
    if (known == std::end(dtype_names)) {
      bad(
          fmt::format("{}: dtype {} is not supported (loom reads F64, F32, F16, BF16, I64, I32, "
                      "I8, U8 and BOOL)",
                      who, json_quoted(type_text)));
    }
    e.type = known->type;

    const json& dims = field("shape");
    if (!dims.is_array())
      bad(fmt::format("{}: \"shape\" must be an array, not a {}", who, dims.type_name()));
    // The product of the non-zero dimensions times the element size must fit in an int64,
    // so that element counts, strides and byte offsets of the tensor do too.
    auto bytes = static_cast<std::int64_t>(size_of(e.type));
    for (std::size_t i = 0; i < dims.size(); ++i) {
      const json& d = dims[i];
      if (!d.is_number_integer()) {
        bad(fmt::format("{}: dimension {} of \"shape\" is {}, not an integer", who, i, d.dump()));
      }
      if (!d.is_number_unsigned()) {
        bad(fmt::format("{}: dimension {} of \"shape\" is negative ({})", who, i, d.dump()));
      }
      const auto u = d.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
          (u != 0 && __builtin_mul_overflow(bytes, static_cast<std::int64_t>(u), &bytes))) {
        bad(fmt::format("{}: shape {} is too large (its byte count overflows 64 bits)", who,
                        dims.dump()));
      }
      e.dims.push_back(static_cast<std::int64_t>(u));
    }
    const std::uint64_t need = e.dims.num_elements() == 0 ? 0 : static_cast<std::uint64_t>(bytes);

    const json& offsets = field("data_offsets");
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      bad(fmt::format("{}: \"data_offsets\" must be two non-negative integers [begin, end], not {}",
                      who, offsets.dump()));
    }
    e.begin = offsets[0].get<std::uint64_t>();
    e.end = offsets[1].get<std::uint64_t>();
    if (e.end < e.begin)
      bad(fmt::format("{}: data_offsets [{}, {}] end before they begin", who, e.begin, e.end));
    if (e.end > data_size_) {
      bad(fmt::format(
          "{}: data_offsets [{}, {}] are outside the data ({} bytes): the tensor would end at "
          "byte {} of the file, which ends at byte {} (truncated or corrupt)",
          who, e.begin, e.end, data_size_, data_start_ + e.end, data_start_ + data_size_));
    }
    if (e.end - e.begin != need) {
      bad(fmt::format(
          "{}: a {} tensor of shape {} takes {} bytes, but data_offsets [{}, {}] hold {}", who,
          to_string(e.type), to_string(e.dims), need, e.begin, e.end, e.end - e.begin));
    }
    return e;
  }

  // No byte belongs to two tensors (empty tensors own no bytes).
  void check_overlaps(const std::vector<entry>& entries) const {
    std::vector<const entry*> sorted;
    for (const auto& e : entries) {
      if (e.end > e.begin) sorted.push_back(&e);
    }
    std::sort(sorted.begin(), sorted.end(),
              [](const entry* a, const entry* b) { return a->begin < b->begin; });
    for (std::size_t i = 1; i < sorted.size(); ++i) {
      const entry& a = *sorted[i - 1];
      const entry& b = *sorted[i];
      if (b.begin < a.end) {
        bad(fmt::format("tensors {} (data_offsets [{}, {}]) and {} (data_offsets [{}, {}]) overlap",
                        json_quoted(a.name), a.begin, a.end, json_quoted(b.name), b.begin, b.end));
      }
    }
  }

  std::string_view what_;
  std::uint64_t data_start_;
  std::uint64_t data_size_;
  std::vector<std::string> order_;
};

[[noreturn]] void bad(std::string_view what, const std::string& message) {
  throw parse_error(fmt::format("{}: {}", what, message), 0);
}

// The header length from the file's first 8 bytes, checked against the file's size.
std::uint64_t header_length(const unsigned char (&first)[length_bytes], std::uint64_t file_size,
                            std::string_view what) {
  std::uint64_t n = 0;
  for (std::size_t i = length_bytes; i-- > 0;) n = (n << 8) | first[i];
  if (n > file_size - length_bytes) {
    bad(what, fmt::format("the header length is {} bytes (read from bytes 0 to 7), past the "
                          "end of the file ({} bytes follow the length; truncated or corrupt)",
                          n, file_size - length_bytes));
  }
  return n;
}

void require_length(std::uint64_t file_size, std::string_view what) {
  if (file_size < length_bytes) {
    bad(what,
        fmt::format("truncated: {} bytes, too short for the 8-byte header length", file_size));
  }
}

// `data_start`: the offset of the data in the file, for the message.
void check_bools(const tensor& t, const entry& e, std::uint64_t data_start, std::string_view what) {
  if (t.type() != dtype::boolean) return;
  const auto* p = static_cast<const unsigned char*>(t.raw_data());
  for (std::size_t i = 0; i < t.nbytes(); ++i) {
    if (p[i] > 1) {
      bad(what, fmt::format("tensor {}: bool element {} is {}, not 0 or 1 (byte {} of the file)",
                            json_quoted(e.name), i, p[i], data_start + e.begin + i));
    }
  }
}

// ---- writing -----------------------------------------------------------------------------

std::string json_string(std::string_view text, const std::string& who) {
  try {
    return json(std::string(text)).dump(-1, ' ', false, json::error_handler_t::strict);
  } catch (const json::exception&) {
    throw invalid_argument(fmt::format("safetensors: {} is not valid UTF-8", who));
  }
}

// The padded header of `tensors` (Note [safetensors format]), after checking them.
std::string header_text(const std::vector<std::pair<std::string, tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::string out = "{";
  if (!metadata.empty()) {
    out += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) out += ',';
      first = false;
      out += json_string(k, fmt::format("metadata key {}", json_quoted(k)));
      out += ':';
      out += json_string(v, fmt::format("the metadata value of {}", json_quoted(k)));
    }
    out += '}';
  }
  std::unordered_set<std::string_view> seen;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const std::string who = fmt::format("tensor {}", json_quoted(name));
    if (name == metadata_key) {
      throw invalid_argument("safetensors: a tensor cannot be called \"__metadata__\"");
    }
    if (!seen.insert(name).second) {
      throw invalid_argument(fmt::format("safetensors: {} is given twice", who));
    }
    if (!t.defined()) throw invalid_argument(fmt::format("safetensors: {} is undefined", who));
    if (!is_host_accessible(t.device().type)) {
      throw invalid_argument(fmt::format(
          "safetensors: {} ({}) is not in host-accessible memory; copy it to the CPU first", who,
          t.describe()));
    }
    std::string dims;
    for (std::size_t i = 0; i < t.rank(); ++i) dims += fmt::format("{}{}", i ? "," : "", t.dim(i));
    if (out.size() > 1) out += ',';
    out +=
        fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                    json_string(name, who), name_of(t.type()), dims, offset, offset + t.nbytes());
    offset += t.nbytes();
  }
  out += '}';
  out.append((length_bytes - out.size() % length_bytes) % length_bytes, ' ');
  return out;
}

void put_length(std::byte* dst, std::uint64_t n) {
  for (std::size_t i = 0; i < length_bytes; ++i) {
    dst[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  }
}

// ---- files -------------------------------------------------------------------------------

// Closes the descriptor, and removes the temporary file unless it was renamed into place.
class temp_file {
 public:
  temp_file(std::filesystem::path path, int fd) : path_(std::move(path)), fd_(fd) {}
  temp_file(temp_file&& other) noexcept
      : path_(std::move(other.path_)),
        fd_(std::exchange(other.fd_, -1)),
        kept_(std::exchange(other.kept_, true)) {}
  temp_file(const temp_file&) = delete;
  temp_file& operator=(const temp_file&) = delete;
  ~temp_file() {
    if (fd_ >= 0) ::close(fd_);
    if (!kept_) ::unlink(path_.c_str());
  }
  [[nodiscard]] int fd() const noexcept { return fd_; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// Closes the descriptor; returns close's result (errno set on failure).
  int close() noexcept { return ::close(std::exchange(fd_, -1)); }
  void keep() noexcept { kept_ = true; }

 private:
  std::filesystem::path path_;
  int fd_;
  bool kept_ = false;
};

void write_all(const temp_file& f, const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ::ssize_t w = ::write(f.fd(), p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw error(fmt::format("save_safetensors: writing '{}' failed: {}", f.path().string(),
                              errno_text(errno)));
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

// Note [temporary file names]
// A save writes `<path>.tmp-<16 lowercase hex digits>` and holds an exclusive flock(2) on it
// until the rename. A save killed midway (kill -9, a power cut) leaves that file behind with
// no lock, since the lock goes with the process. remove_stale_temporaries removes exactly the
// files of this pattern that it can lock: never another file, never a live save's. A writer
// takes its lock right after creating the file and then checks that the name still leads to
// its file, so a cleaner that locked the new file in between (and removed it) only makes
// the writer try another name.
constexpr std::string_view temp_infix = ".tmp-";
constexpr std::size_t temp_digits = 16;

bool is_temp_name(std::string_view name, std::string_view prefix) {
  if (name.size() != prefix.size() + temp_digits || !name.starts_with(prefix)) return false;
  return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(prefix.size()), name.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string random_suffix() {
  std::random_device rd;
  const std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  return fmt::format("{:0{}x}", v, temp_digits);
}

// Whether `fd` is the file that `path` names.
bool names_file(const std::filesystem::path& path, int fd) {
  struct stat by_name {};
  struct stat by_fd {};
  return ::stat(path.c_str(), &by_name) == 0 && ::fstat(fd, &by_fd) == 0 &&
         by_name.st_dev == by_fd.st_dev && by_name.st_ino == by_fd.st_ino;
}

temp_file create_temp(const std::filesystem::path& path) {
  for (int attempt = 0;; ++attempt) {
    std::filesystem::path tmp = path;
    tmp += std::string(temp_infix) + random_suffix();
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      temp_file file(std::move(tmp), fd);
      int locked = 0;
      while ((locked = ::flock(fd, LOCK_EX)) != 0 && errno == EINTR) {
      }
      // A file system without flock (some network ones): the file is unprotected against
      // remove_stale_temporaries, but saving works.
      if (locked != 0 || names_file(file.path(), fd)) return file;
      file.keep();  // removed by a cleaner: the name is not ours to unlink any more
      if (attempt < 8) continue;
      throw error(fmt::format(
          "save_safetensors: cannot keep a temporary file next to '{}': it was removed as "
          "soon as it was made",
          path.string()));
    }
    if (errno == EEXIST && attempt < 8) continue;
    throw error(
        fmt::format("save_safetensors: cannot create a temporary file next to '{}' ({}): {}",
                    path.string(), tmp.string(), errno_text(errno)));
  }
}

// Flushes the directory holding `path`, so that the rename survives a crash.
void sync_directory(const std::filesystem::path& path) {
  std::filesystem::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int err = 0;
  if (fd < 0) {
    err = errno;
  } else {
    if (::fsync(fd) != 0) err = errno;
    ::close(fd);
  }
  // Some file systems cannot sync a directory (EINVAL): nothing more can be done there.
  if (err != 0 && err != EINVAL) {
    throw error(
        fmt::format("save_safetensors: '{}' was replaced, but flushing its directory "
                    "'{}' failed: {}",
                    path.string(), dir.string(), errno_text(err)));
  }
}

// Reads n bytes at `offset` of the file.
void read_at(int fd, void* dst, std::size_t n, std::uint64_t offset,
             const std::filesystem::path& path) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ::ssize_t r = ::pread(fd, p, n, static_cast<::off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      throw error(fmt::format("load_safetensors: reading '{}' at byte {} failed: {}", path.string(),
                              offset,
                              r < 0 ? errno_text(errno) : "the file ended early (did it shrink?)"));
    }
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
}

class file_descriptor {
 public:
  explicit file_descriptor(int fd) : fd_(fd) {}
  file_descriptor(const file_descriptor&) = delete;
  file_descriptor& operator=(const file_descriptor&) = delete;
  ~file_descriptor() { ::close(fd_); }
  [[nodiscard]] int get() const noexcept { return fd_; }

 private:
  int fd_;
};

}  // namespace

safetensors_file parse_safetensors(std::span<const std::byte> bytes, std::string_view what) {
  require_length(bytes.size(), what);
  unsigned char first[length_bytes];
  std::memcpy(first, bytes.data(), length_bytes);
  const std::uint64_t n = header_length(first, bytes.size(), what);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + length_bytes, n);
  const std::span<const std::byte> data = bytes.subspan(length_bytes + n);
  header h = header_parser(what, length_bytes + n, data.size()).run(text);

  safetensors_file out;
  out.metadata = std::move(h.metadata);
  out.tensors.reserve(h.entries.size());
  for (auto& e : h.entries) {
    tensor t = memory::host_tensor(e.type, e.dims);
    if (t.nbytes() != 0) std::memcpy(t.raw_data(), data.data() + e.begin, t.nbytes());
    check_bools(t, e, length_bytes + n, what);
    out.tensors.emplace_back(std::move(e.name), std::move(t));
  }
  return out;
}

std::vector<std::byte> to_safetensors(const std::vector<std::pair<std::string, tensor>>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  const std::string head = header_text(tensors, metadata);
  std::size_t total = length_bytes + head.size();
  for (const auto& item : tensors) total += item.second.nbytes();
  std::vector<std::byte> out(total);
  put_length(out.data(), head.size());
  std::memcpy(out.data() + length_bytes, head.data(), head.size());
  std::byte* p = out.data() + length_bytes + head.size();
  for (const auto& item : tensors) {
    copy_to_dense(item.second, p);
    p += item.second.nbytes();
  }
  return out;
}

// Note [atomic file replacement]
// A checkpoint replaces the previous one, and a crash or a full disk in the middle must not
// cost both. So the new bytes go to a fresh file in the same directory (same file system,
// so rename is atomic), which is fsync'ed before rename(2) puts it in place: a reader sees
// the whole old file or the whole new one, and after a crash the name holds one of them.
// The directory is fsync'ed last so the rename itself is durable. Any failure before the
// rename removes the temporary file and leaves the old one as it was.
void save_safetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string head = header_text(tensors, metadata);  // checks before touching the disk
  (void)remove_stale_temporaries(path);
  temp_file tmp = create_temp(path);
  std::byte length[length_bytes];
  put_length(length, head.size());
  write_all(tmp, length, sizeof length);
  write_all(tmp, head.data(), head.size());
  std::vector<std::byte> dense;
  for (const auto& item : tensors) {
    const tensor& t = item.second;
    if (t.nbytes() == 0) continue;
    if (t.is_contiguous()) {
      write_all(tmp, t.raw_data(), t.nbytes());
    } else {
      dense.resize(t.nbytes());
      copy_to_dense(t, dense.data());
      write_all(tmp, dense.data(), dense.size());
    }
  }
  if (::fsync(tmp.fd()) != 0) {
    throw error(fmt::format("save_safetensors: flushing '{}' to disk failed: {}",
                            tmp.path().string(), errno_text(errno)));
  }
  if (tmp.close() != 0) {
    throw error(fmt::format("save_safetensors: closing '{}' failed: {}", tmp.path().string(),
                            errno_text(errno)));
  }
  if (::rename(tmp.path().c_str(), path.c_str()) != 0) {
    throw error(fmt::format("save_safetensors: cannot replace '{}' (renaming '{}' failed): {}",
                            path.string(), tmp.path().string(), errno_text(errno)));
  }
  tmp.keep();
  sync_directory(path);
}

std::vector<std::filesystem::path> remove_stale_temporaries(const std::filesystem::path& path) {
  std::vector<std::filesystem::path> removed;
  std::filesystem::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  const std::string prefix = path.filename().string() + std::string(temp_infix);
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  for (const std::filesystem::directory_iterator end; !ec && it != end; it.increment(ec)) {
    const std::filesystem::path& candidate = it->path();
    if (!is_temp_name(candidate.filename().string(), prefix)) continue;
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec) || it->is_symlink(type_ec)) continue;
    const int fd = ::open(candidate.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    // Locked: a live save's (Note [temporary file names]).
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && names_file(candidate, fd) &&
        ::unlink(candidate.c_str()) == 0) {
      removed.push_back(candidate);
    }
    ::close(fd);
  }
  return removed;
}

safetensors_file load_safetensors(const std::filesystem::path& path) {
  check_input_file(path, "load_safetensors: checkpoint file");
  const int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw < 0) {
    const int err = errno;
    if (err == ENOENT) {
      throw not_found(fmt::format("load_safetensors: '{}' does not exist", path.string()));
    }
    throw error(
        fmt::format("load_safetensors: cannot open '{}': {}", path.string(), errno_text(err)));
  }
  const file_descriptor fd(raw);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw error(
        fmt::format("load_safetensors: cannot read '{}': {}", path.string(), errno_text(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    throw error(fmt::format("load_safetensors: '{}' is not a regular file", path.string()));
  }
  // Read piece by piece (length, header, then each tensor straight into its buffer), so a
  // large checkpoint is never held twice in memory.
  const std::string what = path.string();
  const auto size = static_cast<std::uint64_t>(st.st_size);
  require_length(size, what);
  unsigned char first[length_bytes];
  read_at(fd.get(), first, length_bytes, 0, path);
  const std::uint64_t n = header_length(first, size, what);
  std::string text(n, '\0');
  read_at(fd.get(), text.data(), n, length_bytes, path);
  const std::uint64_t data_start = length_bytes + n;
  header h = header_parser(what, data_start, size - data_start).run(text);

  safetensors_file out;
  out.metadata = std::move(h.metadata);
  out.tensors.reserve(h.entries.size());
  for (auto& e : h.entries) {
    tensor t = memory::host_tensor(e.type, e.dims);
    read_at(fd.get(), t.raw_data(), t.nbytes(), data_start + e.begin, path);
    check_bools(t, e, data_start, what);
    out.tensors.emplace_back(std::move(e.name), std::move(t));
  }
  return out;
}

}  // namespace loom::checkpoint
