#include "loom/core/input.hpp"
#include "loom/memory/allocation_log.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <fstream>
#include <functional>
#include <istream>
#include <unordered_map>

#include "loom/core/error.hpp"
#include "loom/memory/memory_resource.hpp"

namespace loom::memory {

const char* to_string(log_action a) noexcept {
  switch (a) {
    case log_action::allocate:
      return "allocate";
    case log_action::deallocate:
      return "deallocate";
  }
  return "unknown";
}

const char* to_string(log_outcome o) noexcept {
  switch (o) {
    case log_outcome::ok:
      return "ok";
    case log_outcome::out_of_memory:
      return "out_of_memory";
    case log_outcome::invalid_argument:
      return "invalid_argument";
  }
  return "unknown";
}

namespace {

constexpr std::string_view header_line =
    "seq,thread,time_ns,action,pointer,bytes,alignment,stream,tag,outcome";

enum field_index : std::size_t {
  f_seq,
  f_thread,
  f_time,
  f_action,
  f_pointer,
  f_bytes,
  f_alignment,
  f_stream,
  f_tag,
  f_outcome,
  field_count
};

constexpr std::array<std::string_view, field_count> field_names{
    "seq",   "thread",    "time_ns", "action", "pointer",
    "bytes", "alignment", "stream",  "tag",    "outcome"};

// A field's text: for a quoted field, what lies between the quotes, doubled quotes still
// doubled (only the tag is ever unescaped).
struct field {
  std::string_view text;
  bool has_doubled_quotes = false;
};

using record = std::array<field, field_count>;

bool is_blank(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\r';
}

struct string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

// A block live at the current point of the log.
struct live_block {
  std::uint32_t slot;
  std::size_t event;  // index of the allocate that returned it
};

}  // namespace

// Parses one log held in memory; used once. See allocation_log.hpp for what it checks.
class allocation_log_parser {
 public:
  // `source` names the input in error messages ("PATH:N: ..."); empty for a stream
  // ("line N: ...").
  allocation_log_parser(std::string_view text, std::string source)
      : text_(text), source_(std::move(source)) {}

  allocation_log run() && {
    if (!skip_ignored_lines()) fail(line_, fmt::format("missing header '{}'", header_line));
    const std::size_t header_at = line_;
    const std::string_view first = rest_of_line();
    if (first != header_line) {
      fail(header_at, fmt::format("missing header: expected '{}', found '{}'", header_line, first));
    }
    const auto newlines =
        static_cast<std::size_t>(std::count(text_.begin() + pos_, text_.end(), '\n'));
    log_.events_.reserve(newlines + 1);
    log_.origins_.reserve(newlines + 1);
    record fields;
    while (skip_ignored_lines()) {
      const std::size_t line = line_;
      read_record(fields);
      add_event(fields, line);
    }
    return std::move(log_);
  }

 private:
  [[noreturn]] void fail(std::size_t line, std::string_view what) const {
    throw parse_error(
        fmt::format("{}{}: {}", source_.empty() ? "line " : source_ + ":", line, what), line);
  }

  [[nodiscard]] bool at_end() const noexcept { return pos_ >= text_.size(); }
  [[nodiscard]] char peek() const noexcept { return text_[pos_]; }

  // Steps past the line break at pos_, if there is one.
  void consume_line_break() noexcept {
    if (!at_end() && peek() == '\n') {
      ++pos_;
      ++line_;
    }
  }

  // Skips comment and blank lines; false at the end of the input.
  bool skip_ignored_lines() {
    while (!at_end()) {
      const char c = peek();
      if (c != '#' && c != '\n' && !is_blank(c)) return true;
      std::size_t end = text_.find('\n', pos_);
      if (end == std::string_view::npos) end = text_.size();
      const std::string_view line = text_.substr(pos_, end - pos_);
      if (c != '#' && !std::all_of(line.begin(), line.end(), is_blank)) return true;
      pos_ = end;
      consume_line_break();
    }
    return false;
  }

  // The line at pos_ without its line break (and "\r"); moves past it.
  std::string_view rest_of_line() {
    std::size_t end = text_.find('\n', pos_);
    if (end == std::string_view::npos) end = text_.size();
    std::string_view line = text_.substr(pos_, end - pos_);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    pos_ = end;
    consume_line_break();
    return line;
  }

  // Splits the record at pos_ into fields and moves past it. A quoted field may span
  // lines; the record ends at the first line break outside quotes.
  void read_record(record& out) {
    const std::size_t first_line = line_;
    std::size_t count = 0;
    for (;;) {
      field f;
      if (!at_end() && peek() == '"') {
        f = read_quoted_field(count);
      } else {
        const std::size_t begin = pos_;
        while (!at_end() && peek() != ',' && peek() != '\n') ++pos_;
        f.text = text_.substr(begin, pos_ - begin);
        if (!f.text.empty() && f.text.back() == '\r' && (at_end() || peek() == '\n')) {
          f.text.remove_suffix(1);
        }
      }
      if (count < field_count) out[count] = f;
      ++count;
      if (at_end() || peek() == '\n') break;
      ++pos_;  // the comma
    }
    consume_line_break();
    if (count != field_count) {
      fail(first_line,
           fmt::format("expected {} fields, found {}", std::size_t{field_count}, count));
    }
  }

  // Reads the quoted field at pos_ (the `index`th of its record).
  field read_quoted_field(std::size_t index) {
    const std::size_t open_line = line_;
    field f;
    const std::size_t begin = ++pos_;
    for (;;) {
      if (at_end()) {
        fail(open_line, fmt::format("unterminated quote in field {}", field_label(index)));
      }
      const char c = text_[pos_++];
      if (c == '\n') {
        ++line_;
      } else if (c == '"') {
        if (at_end() || peek() != '"') break;
        f.has_doubled_quotes = true;
        ++pos_;
      }
    }
    f.text = text_.substr(begin, pos_ - 1 - begin);
    if (!at_end() && peek() == '\r' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '\n') {
      ++pos_;
    }
    if (!at_end() && peek() != ',' && peek() != '\n') {
      fail(line_, fmt::format("unexpected '{}' after the closing quote of field {}", peek(),
                              field_label(index)));
    }
    return f;
  }

  static std::string field_label(std::size_t index) {
    return index < field_count ? fmt::format("'{}'", field_names[index])
                               : fmt::format("{}", index + 1);
  }

  template <typename T>
  T decimal(const record& r, field_index i, std::size_t line) const {
    return number<T>(r, i, line, 10);
  }

  template <typename T>
  T hexadecimal(const record& r, field_index i, std::size_t line) const {
    return number<T>(r, i, line, 16);
  }

  // Field i as an unsigned number: decimal (base 10) or hexadecimal with a 0x prefix.
  template <typename T>
  T number(const record& r, field_index i, std::size_t line, int base) const {
    const std::string_view text = r[i].text;
    std::string_view digits = text;
    if (base == 16) {
      const bool prefixed = text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
      digits.remove_prefix(prefixed ? 2 : digits.size());
    }
    T value{};
    const char* end = digits.data() + digits.size();
    const auto [ptr, ec] = std::from_chars(digits.data(), end, value, base);
    if (ec == std::errc::result_out_of_range) {
      fail(line, fmt::format("field '{}': '{}' is out of range", field_names[i], text));
    }
    if (ec != std::errc{} || ptr != end) {
      fail(line, fmt::format("field '{}': '{}' is not {}", field_names[i], text,
                             base == 10 ? "an unsigned decimal number"
                                        : "a hexadecimal number with a 0x prefix"));
    }
    return value;
  }

  void check_alignment(std::size_t alignment, std::size_t line) const {
    if (!is_valid_alignment(alignment)) {
      fail(line, fmt::format("field 'alignment': {} is not a power of two", alignment));
    }
  }

  std::uint32_t intern(const field& f) {
    std::string_view tag = f.text;
    if (f.has_doubled_quotes) {
      scratch_.clear();
      for (std::size_t i = 0; i < tag.size(); ++i) {
        scratch_ += tag[i];
        if (tag[i] == '"') ++i;  // the second quote of a pair
      }
      tag = scratch_;
    }
    auto& tags = log_.tags_;
    if (!tags.empty() && tags[last_tag_] == tag) return last_tag_;
    auto it = tag_ids_.find(tag);
    if (it == tag_ids_.end()) {
      it = tag_ids_.emplace(std::string(tag), static_cast<std::uint32_t>(tags.size())).first;
      tags.emplace_back(tag);
    }
    last_tag_ = it->second;
    return last_tag_;
  }

  std::uint32_t take_slot(std::size_t line) {
    if (!free_slots_.empty()) {
      const std::uint32_t slot = free_slots_.back();
      free_slots_.pop_back();
      return slot;
    }
    if (log_.slot_count_ == log_event::no_slot) fail(line, "too many blocks live at once");
    return log_.slot_count_++;
  }

  log_action action(const record& r, std::size_t line) const {
    const std::string_view text = r[f_action].text;
    if (text == "allocate") return log_action::allocate;
    if (text == "deallocate") return log_action::deallocate;
    fail(line, fmt::format("field 'action': unknown action '{}' (expected allocate or "
                           "deallocate)",
                           text));
  }

  log_outcome outcome(const record& r, std::size_t line) const {
    const std::string_view text = r[f_outcome].text;
    if (text == "ok") return log_outcome::ok;
    if (text == "out_of_memory") return log_outcome::out_of_memory;
    if (text == "invalid_argument") return log_outcome::invalid_argument;
    fail(line, fmt::format("field 'outcome': unknown outcome '{}' (expected ok, out_of_memory "
                           "or invalid_argument)",
                           text));
  }

  void add_event(const record& r, std::size_t line) {
    const log_origin origin{decimal<std::uint64_t>(r, f_seq, line),
                            decimal<std::uint64_t>(r, f_time, line), line,
                            decimal<std::uint32_t>(r, f_thread, line), intern(r[f_tag])};
    const auto pointer = hexadecimal<std::uintptr_t>(r, f_pointer, line);
    log_event e{decimal<std::size_t>(r, f_bytes, line),
                decimal<std::size_t>(r, f_alignment, line),
                stream{reinterpret_cast<void*>(hexadecimal<std::uintptr_t>(r, f_stream, line))},
                log_event::no_slot,
                action(r, line),
                outcome(r, line)};
    if (e.action == log_action::allocate) {
      resolve_allocate(e, pointer, line);
    } else {
      resolve_deallocate(e, pointer, line);
    }
    log_.events_.push_back(e);
    log_.origins_.push_back(origin);
  }

  void resolve_allocate(log_event& e, std::uintptr_t pointer, std::size_t line) {
    if (e.outcome != log_outcome::ok) {
      if (pointer != 0) {
        fail(line, fmt::format("a failed allocate must have pointer 0x0, not {:#x}", pointer));
      }
      if (e.outcome == log_outcome::out_of_memory) check_alignment(e.alignment, line);
      return;
    }
    check_alignment(e.alignment, line);
    if (pointer == 0) fail(line, "an allocate that succeeded cannot have returned 0x0");
    const auto [it, inserted] = live_.try_emplace(pointer, live_block{0, log_.events_.size()});
    if (!inserted) {
      fail(line, fmt::format("allocate returned {:#x}, which is still live (allocated on line "
                             "{})",
                             pointer, log_.origins_[it->second.event].line));
    }
    e.slot = it->second.slot = take_slot(line);
  }

  void resolve_deallocate(log_event& e, std::uintptr_t pointer, std::size_t line) {
    if (e.outcome != log_outcome::ok) {
      fail(line, fmt::format("a deallocate cannot have outcome '{}'", to_string(e.outcome)));
    }
    check_alignment(e.alignment, line);
    const auto it = live_.find(pointer);
    if (it == live_.end()) {
      fail(line,
           fmt::format("deallocate of {:#x}, which is not live at this point in the log", pointer));
    }
    const std::size_t allocated_by = it->second.event;
    const log_event& a = log_.events_[allocated_by];
    if (a.bytes != e.bytes || a.alignment != e.alignment) {
      fail(line, fmt::format("deallocate of {:#x} with {} bytes, alignment {}, but it was "
                             "allocated with {} bytes, alignment {} on line {}",
                             pointer, e.bytes, e.alignment, a.bytes, a.alignment,
                             log_.origins_[allocated_by].line));
    }
    e.slot = it->second.slot;
    free_slots_.push_back(e.slot);
    live_.erase(it);
  }

  std::string_view text_;
  std::string source_;
  std::size_t pos_ = 0;
  std::size_t line_ = 1;
  allocation_log log_;
  std::unordered_map<std::uintptr_t, live_block> live_;
  std::vector<std::uint32_t> free_slots_;
  std::unordered_map<std::string, std::uint32_t, string_hash, std::equal_to<>> tag_ids_;
  std::uint32_t last_tag_ = 0;
  std::string scratch_;  // an unescaped tag
};

namespace {

std::string read_all(std::istream& in, std::string_view what) {
  std::string text;
  std::array<char, std::size_t{1} << 16> buffer{};
  while (in.read(buffer.data(), buffer.size()) || in.gcount() > 0) {
    text.append(buffer.data(), static_cast<std::size_t>(in.gcount()));
  }
  if (in.bad()) throw error(fmt::format("reading {} failed", what));
  return text;
}

}  // namespace

allocation_log parse_allocation_log(std::istream& in) {
  const std::string text = read_all(in, "the allocation log");
  return allocation_log_parser(text, "").run();
}

allocation_log parse_allocation_log(const std::filesystem::path& path) {
  std::ifstream in = open_input_file(path, "allocation log");
  const std::string text = read_all(in, fmt::format("allocation log '{}'", path.string()));
  return allocation_log_parser(text, path.string()).run();
}

}  // namespace loom::memory
