#include "loom/memory/logging_adaptor.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <iterator>
#include <system_error>

#include "loom/core/error.hpp"
#include "loom/memory/allocation_tag.hpp"
#include "loom/memory/detail/instance_id.hpp"

namespace loom::memory {
namespace {

constexpr std::string_view log_header =
    "# loom allocation log v1\n"
    "seq,thread,time_ns,action,pointer,bytes,alignment,stream,tag,outcome\n";

std::unique_ptr<std::ofstream> open_log(const std::filesystem::path& path) {
  auto file = std::make_unique<std::ofstream>(path, std::ios::binary | std::ios::trunc);
  if (!*file) {
    throw error(fmt::format("logging_adaptor: cannot open '{}' for writing: {}", path.string(),
                            std::generic_category().message(errno)));
  }
  return file;
}

// Appends `field` to a CSV line, quoted per RFC 4180 when it needs to be.
void append_csv_field(fmt::memory_buffer& line, std::string_view field) {
  if (field.find_first_of(",\"\r\n") == std::string_view::npos) {
    line.append(field);
    return;
  }
  line.push_back('"');
  for (const char c : field) {
    if (c == '"') line.push_back('"');
    line.push_back(c);
  }
  line.push_back('"');
}

}  // namespace

logging_adaptor::logging_adaptor(memory_resource& upstream, std::ostream& out)
    : upstream_(upstream), out_(out), id_(detail::next_instance_id()), buffer_(log_header) {}

logging_adaptor::logging_adaptor(memory_resource& upstream, const std::filesystem::path& path)
    : upstream_(upstream),
      file_(open_log(path)),
      out_(*file_),
      id_(detail::next_instance_id()),
      buffer_(log_header) {}

logging_adaptor::~logging_adaptor() {
  // A destructor lets nothing escape: what the last block could not write is reported.
  try {
    flush();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: %s\n", e.what());
  } catch (...) {
    std::fputs("loom: logging_adaptor: writing the allocation log failed\n", stderr);
  }
}

void logging_adaptor::flush() {
  write_out(std::unique_lock(buffer_mutex_));
  std::lock_guard io(io_mutex_);
  out_.flush();
  if (!out_) throw error("logging_adaptor: writing the allocation log failed");
}

void* logging_adaptor::do_allocate(std::size_t bytes, std::size_t alignment, stream s) {
  void* p = nullptr;
  try {
    p = upstream_.allocate(bytes, alignment, s);
  } catch (const std::bad_alloc&) {
    log("allocate", nullptr, bytes, alignment, s, "out_of_memory");
    throw;
  } catch (const invalid_argument&) {
    log("allocate", nullptr, bytes, alignment, s, "invalid_argument");
    throw;
  }
  try {
    log("allocate", p, bytes, alignment, s, "ok");
  } catch (...) {
    upstream_.deallocate(p, bytes, alignment, s);  // the log shows neither call
    throw;
  }
  return p;
}

void logging_adaptor::do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                                    stream s) noexcept {
  try {
    log("deallocate", p, bytes, alignment, s, "ok");
  } catch (...) {
    // Out of memory for the line: the event is left out (see the header).
  }
  upstream_.deallocate(p, bytes, alignment, s);
}

void logging_adaptor::log(std::string_view action, const void* p, std::size_t bytes,
                          std::size_t alignment, stream s, std::string_view outcome) {
  // Everything but seq, thread and time_ns, formatted before taking the lock.
  fmt::memory_buffer line;
  fmt::format_to(std::back_inserter(line), ",{},{:#x},{},{},{:#x},", action,
                 reinterpret_cast<std::uintptr_t>(p), bytes, alignment, s.value());
  append_csv_field(line, current_tag());
  fmt::format_to(std::back_inserter(line), ",{}\n", outcome);

  std::unique_lock lock(buffer_mutex_);
  const std::uint32_t thread = thread_index();
  const auto time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - start_)
                           .count();
  fmt::memory_buffer head;  // fits its inline storage: formatting it cannot throw
  fmt::format_to(std::back_inserter(head), "{},{},{}", next_seq_, thread, time_ns);
  buffer_.reserve(buffer_.size() + head.size() + line.size());  // the last step that can throw
  buffer_.append(head.data(), head.size()).append(line.data(), line.size());
  ++next_seq_;
  if (buffer_.size() >= flush_threshold) write_out(std::move(lock));
}

std::uint32_t logging_adaptor::thread_index() {
  struct last_log {
    std::uint64_t id = 0;  // instance ids start at 1
    std::uint32_t index = 0;
  };
  thread_local last_log t_last;
  if (t_last.id != id_) {
    const auto next = static_cast<std::uint32_t>(thread_indices_.size());
    t_last = {id_, thread_indices_.try_emplace(std::this_thread::get_id(), next).first->second};
  }
  return t_last.index;
}

void logging_adaptor::write_out(std::unique_lock<std::mutex> buffer_lock) {
  std::lock_guard io(io_mutex_);  // waits until the previous block is written
  buffer_.swap(spare_);           // spare_ is empty and keeps an earlier block's capacity
  buffer_lock.unlock();
  try {
    out_.write(spare_.data(), static_cast<std::streamsize>(spare_.size()));
  } catch (...) {  // a stream set to throw: the block is lost either way
    spare_.clear();
    throw;
  }
  spare_.clear();
}

}  // namespace loom::memory
