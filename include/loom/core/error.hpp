// loom's error hierarchy.
//
// Every error loom throws derives from loom::error (a std::runtime_error), except
// loom::out_of_memory, which derives from std::bad_alloc so that code written for the
// standard library's allocators catches it. Messages name what was wrong: the resource,
// the request, the node, op, device, dtype or shape involved.
#pragma once

#include <cstddef>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

#include "loom/core/memory_stats.hpp"

namespace loom {

/// Base of loom's errors other than out_of_memory.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An argument broke a documented precondition (bad alignment, malformed name, ...).
class invalid_argument : public error {
 public:
  using error::error;
};

/// A well-formed request for something loom does not support: a dtype it has no type for
/// (a DLPack int16, an Arrow decimal), a device it cannot reach. Python raises TypeError.
class unsupported_error : public invalid_argument {
 public:
  using invalid_argument::invalid_argument;
};

/// Something looked up by name or key does not exist.
class not_found : public error {
 public:
  using error::error;
};

/// Input that could not be parsed (a replay log, a serialized graph, ...). Carries the
/// 1-based line number when the input is line-oriented (0 when not).
class parse_error : public error {
 public:
  parse_error(const std::string& what, std::size_t line) : error(what), line_(line) {}
  [[nodiscard]] std::size_t line() const noexcept { return line_; }

 private:
  std::size_t line_;
};

/// A memory request could not be satisfied: a resource ran out, a budget would be
/// exceeded, or the size cannot exist (close to 2^64). Carries the request, the name of
/// whatever refused it, and the statistics of that resource at the time when known.
class out_of_memory : public std::bad_alloc {
 public:
  out_of_memory(std::string message, std::size_t requested_bytes, std::string refused_by,
                std::optional<memory_stats> stats = std::nullopt)
      : message_(std::move(message)),
        requested_bytes_(requested_bytes),
        refused_by_(std::move(refused_by)),
        stats_(stats) {}

  [[nodiscard]] const char* what() const noexcept override { return message_.c_str(); }
  /// Bytes that were asked for.
  [[nodiscard]] std::size_t requested_bytes() const noexcept { return requested_bytes_; }
  /// Name of the resource or budget that refused the request.
  [[nodiscard]] const std::string& refused_by() const noexcept { return refused_by_; }
  /// Statistics of the refusing resource at the moment it refused, when it keeps them.
  [[nodiscard]] const std::optional<memory_stats>& stats() const noexcept { return stats_; }

 private:
  std::string message_;
  std::size_t requested_bytes_;
  std::string refused_by_;
  std::optional<memory_stats> stats_;
};

}  // namespace loom

namespace loom {

/// A node failed while a graph ran: its kernel reported an error (bad input values, a
/// missing variable, ...), or it could not be given a kernel or a device. Names the node and
/// its op; the message says the rest.
class node_error : public error {
 public:
  node_error(const std::string& what, std::string node_name, std::string op)
      : error(what), node_name_(std::move(node_name)), op_(std::move(op)) {}
  [[nodiscard]] const std::string& node_name() const noexcept { return node_name_; }
  [[nodiscard]] const std::string& op() const noexcept { return op_; }

 private:
  std::string node_name_;
  std::string op_;
};

/// A collective or point-to-point operation between processes failed or timed out
/// (loom::distributed, include/loom/distributed/communicator.hpp). Carries the rank that
/// reports it; the message names the operation, the tensors, the rank and the reason (and,
/// from a graph's collective node, the node).
class distributed_error : public error {
 public:
  distributed_error(const std::string& what, int rank) : error(what), rank_(rank) {}
  [[nodiscard]] int rank() const noexcept { return rank_; }

 private:
  int rank_;
};

/// A run was cancelled (session::cancel, from another thread).
class cancelled_error : public error {
 public:
  using error::error;
};

}  // namespace loom
