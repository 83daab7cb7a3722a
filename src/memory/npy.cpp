// .npy reading and writing: Note [npy format] (include/loom/memory/npy.hpp).
#include "loom/core/input.hpp"
#include "loom/memory/npy.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <string_view>
#include <system_error>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::memory {
namespace {

static_assert(std::endian::native == std::endian::little,
              ".npy I/O copies little-endian data as is");

constexpr std::string_view magic = "\x93NUMPY";
constexpr std::size_t array_align = 64;
// NumPy leaves room for the first dimension to grow to this many digits (format.py).
constexpr std::size_t growth_axis_max_digits = 21;

[[noreturn]] void bad(const std::string& what) {
  throw parse_error(fmt::format(".npy: {}", what), 0);
}

std::string quote(std::string_view text) {
  std::string out;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f || c == '\\' || c == '\'') {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  return "'" + out + "'";
}

// ---- dtypes ------------------------------------------------------------------------------

const char* descr_of(dtype t) {
  if (const char* d = numpy_typestr(t)) return d;
  throw invalid_argument(fmt::format(
      ".npy: {} is not a NumPy dtype; cast the tensor to float32 to save it", to_string(t)));
}

dtype parse_descr(std::string_view descr) {
  static constexpr std::string_view accepted =
      "(loom reads '<f4', '<f8', '<f2', '<i4', '<i8', '|i1', '|u1', '|b1')";
  std::string_view body = descr;
  char order = 0;
  if (!body.empty() && std::string_view("<>|=").find(body[0]) != std::string_view::npos) {
    order = body[0];
    body.remove_prefix(1);
  }
  struct entry {
    std::string_view code;
    dtype type;
  };
  static constexpr entry table[] = {
      {"f4", dtype::f32}, {"f8", dtype::f64},     {"f2", dtype::f16},
      {"i4", dtype::i32}, {"i8", dtype::i64},     {"i1", dtype::i8},
      {"u1", dtype::u8},  {"b1", dtype::boolean}, {"?", dtype::boolean},
  };
  for (const auto& e : table) {
    if (e.code != body) continue;
    if (size_of(e.type) == 1) return e.type;  // byte order is moot
    if (order == '>') {
      bad(
          fmt::format("big-endian data ({}) is not supported; save the array little-endian "
                      "(arr.astype('<{}'))",
                      quote(descr), body));
    }
    if (order == '|') bad(fmt::format("dtype {} has no byte order", quote(descr)));
    return e.type;  // '<', or '=' / none: native, which loom only builds for little-endian
  }
  bad(fmt::format("unsupported dtype {} {}", quote(descr), accepted));
}

// ---- the header ----------------------------------------------------------------------

struct npy_header {
  dtype type = dtype::f32;
  bool fortran_order = false;
  shape dims;
};

// A strict reader of the header's Python dict literal (Note [npy format]).
class header_parser {
 public:
  header_parser(std::string_view text, bool allow_long_suffix)
      : text_(text), allow_long_suffix_(allow_long_suffix) {}

  npy_header run() {
    npy_header h;
    bool seen_descr = false;
    bool seen_fortran = false;
    bool seen_shape = false;
    skip_space();
    expect('{', "the header must be a dict");
    for (;;) {
      skip_space();
      if (eat('}')) break;
      const std::string key = parse_string("a key");
      skip_space();
      expect(':', fmt::format("':' after key {}", quote(key)));
      skip_space();
      auto once = [&](bool& seen) {
        if (seen) bad(fmt::format("header has key {} twice", quote(key)));
        seen = true;
      };
      if (key == "descr") {
        once(seen_descr);
        if (peek() == '[') bad("structured dtypes (a list 'descr') are not supported");
        h.type = parse_descr(parse_string("'descr'"));
      } else if (key == "fortran_order") {
        once(seen_fortran);
        h.fortran_order = parse_bool();
      } else if (key == "shape") {
        once(seen_shape);
        h.dims = parse_shape();
      } else {
        bad(
            fmt::format("header has an unexpected key {} (expected 'descr', 'fortran_order', "
                        "'shape')",
                        quote(key)));
      }
      skip_space();
      if (eat(',')) continue;
      skip_space();
      expect('}', "',' or '}' after a value");
      break;
    }
    skip_space();
    if (pos_ != text_.size()) bad(fmt::format("text after the header dict at offset {}", pos_));
    if (!seen_descr) bad("header has no 'descr'");
    if (!seen_fortran) bad("header has no 'fortran_order'");
    if (!seen_shape) bad("header has no 'shape'");
    return h;
  }

 private:
  [[nodiscard]] char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool eat(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c, const std::string& what) {
    if (!eat(c)) {
      bad(fmt::format("header syntax error at offset {}: expected {}, found {}", pos_, what,
                      pos_ < text_.size() ? quote(text_.substr(pos_, 1)) : "the end"));
    }
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  std::string parse_string(const char* what) {
    const char q = peek();
    if (q != '\'' && q != '"') {
      bad(fmt::format("header syntax error at offset {}: expected {} (a quoted string)", pos_,
                      what));
    }
    const std::size_t start = ++pos_;
    while (pos_ < text_.size() && text_[pos_] != q) {
      if (text_[pos_] == '\n') break;
      if (text_[pos_] == '\\') {
        bad(fmt::format("header syntax error at offset {}: escapes in strings are not supported",
                        pos_));
      }
      ++pos_;
    }
    if (pos_ == text_.size() || text_[pos_] != q) {
      bad(fmt::format("header: unterminated string at offset {}", start - 1));
    }
    return std::string(text_.substr(start, pos_++ - start));
  }
  bool parse_bool() {
    for (const auto& [word, value] :
         {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}}) {
      if (text_.substr(pos_).starts_with(word)) {
        pos_ += word.size();
        return value;
      }
    }
    bad(fmt::format("header: 'fortran_order' must be True or False (offset {})", pos_));
  }
  std::int64_t parse_dim() {
    const std::size_t start = pos_;
    std::int64_t v = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, text_[pos_] - '0', &v)) {
        bad(fmt::format("header: dimension at offset {} is too large", start));
      }
      ++pos_;
    }
    if (pos_ == start) {
      bad(
          fmt::format("header syntax error at offset {}: expected a dimension (a non-negative "
                      "integer)",
                      pos_));
    }
    if (allow_long_suffix_) (void)eat('L');  // Python 2 wrote 3L
    return v;
  }
  // "()", "(3,)", "(2, 3)", "(2, 3,)".
  shape parse_shape() {
    expect('(', "'shape' as a tuple");
    std::vector<std::int64_t> dims;
    skip_space();
    if (eat(')')) return shape(dims);
    for (;;) {
      dims.push_back(parse_dim());
      skip_space();
      if (eat(')')) {
        if (dims.size() == 1) bad("header: 'shape' (n) is not a tuple; write (n,)");
        return shape(dims);
      }
      expect(',', "',' or ')' in 'shape'");
      skip_space();
      if (eat(')')) return shape(dims);
    }
  }

  std::string_view text_;
  bool allow_long_suffix_;
  std::size_t pos_ = 0;
};

// The bytes of the elements: the product of the non-zero dimensions times the element size
// must fit (as NumPy requires), so every stride and byte offset does too.
std::size_t data_bytes(const npy_header& h) {
  auto bytes = static_cast<std::int64_t>(size_of(h.type));
  for (auto d : h.dims.dims()) {
    if (d != 0 && __builtin_mul_overflow(bytes, d, &bytes)) {
      bad(fmt::format("shape {} is too large", to_string(h.dims)));
    }
  }
  return h.dims.num_elements() == 0 ? 0 : static_cast<std::size_t>(bytes);
}

// Where the reader takes bytes from: a span or a file.
class source {
 public:
  virtual ~source() = default;
  /// Bytes not read yet.
  [[nodiscard]] virtual std::size_t remaining() const = 0;
  /// Reads n <= remaining() bytes to dst.
  virtual void read(void* dst, std::size_t n) = 0;
};

class span_source final : public source {
 public:
  explicit span_source(std::span<const std::byte> bytes) : bytes_(bytes) {}
  [[nodiscard]] std::size_t remaining() const override { return bytes_.size() - pos_; }
  void read(void* dst, std::size_t n) override {
    if (n != 0) std::memcpy(dst, bytes_.data() + pos_, n);
    pos_ += n;
  }

 private:
  std::span<const std::byte> bytes_;
  std::size_t pos_ = 0;
};

class file_source final : public source {
 public:
  file_source(std::ifstream& in, std::size_t size, const std::string& path)
      : in_(in), remaining_(size), path_(path) {}
  [[nodiscard]] std::size_t remaining() const override { return remaining_; }
  void read(void* dst, std::size_t n) override {
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    if (static_cast<std::size_t>(in_.gcount()) != n) {
      throw error(fmt::format("read_npy: reading '{}' failed", path_));
    }
    remaining_ -= n;
  }

 private:
  std::ifstream& in_;
  std::size_t remaining_;
  const std::string& path_;
};

std::uint32_t read_le(source& src, std::size_t n) {
  unsigned char b[4] = {};
  src.read(b, n);
  std::uint32_t v = 0;
  for (std::size_t i = n; i-- > 0;) v = (v << 8) | b[i];
  return v;
}

tensor load(source& src) {
  const std::size_t total = src.remaining();
  char start[8] = {};
  const std::size_t have = std::min<std::size_t>(total, 8);
  src.read(start, have);
  if (have < magic.size() || std::string_view(start, magic.size()) != magic) {
    bad("not a .npy file (it does not start with \"\\x93NUMPY\")");
  }
  if (have < 8) bad(fmt::format("truncated: {} bytes, too short for a .npy header", total));
  const int major = static_cast<unsigned char>(start[6]);
  const int minor = static_cast<unsigned char>(start[7]);
  if (minor != 0 || major < 1 || major > 3) {
    bad(fmt::format("unsupported format version {}.{} (loom reads 1.0, 2.0 and 3.0)", major,
                    minor));
  }
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  if (src.remaining() < length_bytes) bad("truncated: the file ends inside the header length");
  const std::size_t header_length = read_le(src, length_bytes);
  if (header_length > src.remaining()) {
    bad(fmt::format("truncated header: it says {} bytes, {} remain", header_length,
                    src.remaining()));
  }
  std::string header(header_length, '\0');
  src.read(header.data(), header_length);
  const npy_header h = header_parser(header, major <= 2).run();

  const std::size_t bytes = data_bytes(h);
  if (src.remaining() != bytes) {
    bad(fmt::format("a {} array of shape {} needs {} bytes of data, the file has {}{}",
                    to_string(h.type), to_string(h.dims), bytes, src.remaining(),
                    src.remaining() < bytes ? " (truncated)" : ""));
  }
  // Fortran order: the data is the C-order array of the reversed shape, transposed.
  shape stored = h.dims;
  if (h.fortran_order) std::reverse(stored.data(), stored.data() + stored.rank());
  tensor t = host_tensor(h.type, stored);
  src.read(t.raw_data(), bytes);
  if (h.type == dtype::boolean) {
    const auto* p = static_cast<const unsigned char*>(t.raw_data());
    for (std::size_t i = 0; i < bytes; ++i) {
      if (p[i] > 1) bad(fmt::format("bool element {} is {}, not 0 or 1", i, p[i]));
    }
  }
  if (!h.fortran_order || h.dims.rank() < 2) return t;
  shape strides = contiguous_strides(stored);
  std::reverse(strides.data(), strides.data() + strides.rank());
  const tensor view = tensor::strided(t.buf(), h.type, h.dims, strides, 0);
  tensor out = host_tensor(h.type, h.dims);
  copy_to_dense(view, out.raw_data());
  return out;
}

std::string header_text(const tensor& t) {
  std::string dims;
  for (std::size_t i = 0; i < t.rank(); ++i) dims += fmt::format("{}, ", t.dim(i));
  if (t.rank() > 1) dims.resize(dims.size() - 2);  // (2, 3); a 1-tuple keeps its comma: (3,)
  if (t.rank() == 1) dims.pop_back();
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}",
                                 descr_of(t.type()), dims);
  if (t.rank() > 0) {
    const std::size_t first = fmt::formatted_size("{}", t.dim(0));
    dict.append(growth_axis_max_digits > first ? growth_axis_max_digits - first : 0, ' ');
  }
  return dict;
}

// The magic, version, header length and padded header of `t`.
std::string preamble(const tensor& t) {
  if (!t.defined()) throw invalid_argument(".npy: cannot write an undefined tensor");
  const std::string dict = header_text(t);
  if (!is_host_accessible(t.device().type)) {
    throw invalid_argument(
        fmt::format(".npy: {} is not in host-accessible memory; copy it to "
                    "the CPU first",
                    t.describe()));
  }
  for (int major : {1, 2}) {
    const std::size_t length_bytes = major == 1 ? 2 : 4;
    const std::size_t prefix = magic.size() + 2 + length_bytes;
    const std::size_t unpadded = dict.size() + 1;  // + '\n'
    const std::size_t pad = array_align - (prefix + unpadded) % array_align;
    const std::size_t length = unpadded + pad;
    if (major == 1 && length > 0xffff) continue;
    std::string out(magic);
    out += static_cast<char>(major);
    out += '\0';
    for (std::size_t i = 0; i < length_bytes; ++i)
      out += static_cast<char>((length >> (8 * i)) & 0xff);
    out += dict;
    out.append(pad, ' ');
    out += '\n';
    return out;
  }
  throw invalid_argument(fmt::format(".npy: the header of {} is too large", t.describe()));
}

}  // namespace

tensor parse_npy(std::span<const std::byte> bytes) {
  span_source src(bytes);
  return load(src);
}

tensor read_npy(const std::string& path) {
  std::ifstream in = open_input_file(path, "read_npy: .npy file");
  in.seekg(0, std::ios::end);
  const auto size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size < 0 || !in) throw error(fmt::format("read_npy: cannot read '{}'", path));
  file_source src(in, static_cast<std::size_t>(size), path);
  try {
    return load(src);
  } catch (const parse_error& e) {
    throw parse_error(fmt::format("{}: {}", path, e.what()), 0);
  }
}

std::vector<std::byte> to_npy(const tensor& t) {
  const std::string head = preamble(t);
  std::vector<std::byte> out(head.size() + t.nbytes());
  std::memcpy(out.data(), head.data(), head.size());
  copy_to_dense(t, out.data() + head.size());
  return out;
}

void write_npy(const tensor& t, const std::string& path) {
  const std::string head = preamble(t);
  std::vector<std::byte> dense;
  const void* data = t.raw_data();
  if (!t.is_contiguous()) {
    dense.resize(t.nbytes());
    copy_to_dense(t, dense.data());
    data = dense.data();
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    throw error(fmt::format("write_npy: cannot open '{}' for writing: {}", path,
                            std::generic_category().message(errno)));
  }
  out.write(head.data(), static_cast<std::streamsize>(head.size()));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(t.nbytes()));
  out.close();
  if (!out) throw error(fmt::format("write_npy: writing '{}' failed", path));
}

const char* numpy_typestr(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return "<f4";
    case dtype::f64:
      return "<f8";
    case dtype::f16:
      return "<f2";
    case dtype::i32:
      return "<i4";
    case dtype::i64:
      return "<i8";
    case dtype::i8:
      return "|i1";
    case dtype::u8:
      return "|u1";
    case dtype::boolean:
      return "|b1";
    case dtype::bf16:
      break;
  }
  return nullptr;
}

}  // namespace loom::memory
