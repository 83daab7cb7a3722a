// fused_expr: the text form, its parser, validation, the unfused form (expand) and the
// builder of fused_elementwise (see loom/graph/fused_expr.hpp).
#include "loom/graph/fused_expr.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cmath>

#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/state.hpp"

namespace loom {

// ---- ops -------------------------------------------------------------------------------------

namespace {

// Indexed by ew_op; the order is the enum's.
constexpr std::array<ew_op_info, num_ew_ops> op_table{{
    {"neg", 1},       {"abs", 1},       {"exp", 1},     {"log", 1},        {"sqrt", 1},
    {"rsqrt", 1},     {"tanh", 1},      {"sigmoid", 1}, {"relu", 1},       {"gelu", 1},
    {"gelu_tanh", 1}, {"erf", 1},       {"square", 1},  {"reciprocal", 1}, {"add", 2},
    {"sub", 2},       {"mul", 2},       {"div", 2},     {"pow", 2},        {"maximum", 2},
    {"minimum", 2},   {"relu_grad", 2},
}};

bool valid_op(ew_op op) noexcept {
  return static_cast<int>(op) < num_ew_ops;
}

}  // namespace

const ew_op_info& info(ew_op op) noexcept {
  static constexpr ew_op_info unknown{"?", 0};
  return valid_op(op) ? op_table[static_cast<std::size_t>(op)] : unknown;
}

std::optional<ew_op> ew_op_from_name(std::string_view name) noexcept {
  for (std::size_t i = 0; i < op_table.size(); ++i) {
    if (op_table[i].name == name) return static_cast<ew_op>(i);
  }
  return std::nullopt;
}

std::optional<ew_op> fusable_op(const node& n) {
  const std::string& op = n.op();
  if (op == "gelu") {
    auto it = n.attrs.find("approximate");
    const bool tanh = it != n.attrs.end() && it->second.type() == attr_type::string &&
                      it->second.as<std::string>() == "tanh";
    return tanh ? ew_op::gelu_tanh : ew_op::gelu;
  }
  if (op == "gelu_tanh") return std::nullopt;  // a name of the text form, not an op
  return ew_op_from_name(op);
}

// ---- text form -------------------------------------------------------------------------------

namespace {

std::string operand_text(const fused_operand& a) {
  // fmt's "{}" for a double is the shortest text that reads back as the same double
  // (-0 as "-0"), which std::from_chars reads.
  return a.is_literal() ? fmt::format("{}", a.literal) : fmt::format("%{}", a.value);
}

}  // namespace

std::string fused_expr::to_string() const {
  std::string out;
  for (std::size_t k = 0; k < instrs.size(); ++k) {
    const fused_instr& in = instrs[k];
    if (k > 0) out += "; ";
    out += info(in.op).name;
    out += '(';
    const int arity = info(in.op).arity;
    for (int j = 0; j < arity; ++j) {
      if (j > 0) out += ", ";
      out += operand_text(in.args[static_cast<std::size_t>(j)]);
    }
    out += ')';
  }
  return out;
}

namespace {

class parser {
 public:
  parser(std::string_view text, std::int32_t num_inputs) : text_(text), num_inputs_(num_inputs) {}

  std::vector<fused_instr> parse() {
    std::vector<fused_instr> instrs;
    skip_space();
    if (pos_ == text_.size()) return instrs;
    for (;;) {
      instrs.push_back(instruction(static_cast<std::int32_t>(instrs.size())));
      skip_space();
      if (pos_ == text_.size()) return instrs;
      if (text_[pos_] != ';') fail(pos_, fmt::format("expected ';' or the end, got {}", here()));
      ++pos_;
      skip_space();
      if (pos_ == text_.size()) fail(pos_, "expected an instruction after ';'");
    }
  }

 private:
  static bool is_name_char(char c) noexcept {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  }

  void skip_space() noexcept {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  // What is at the current position, for messages.
  [[nodiscard]] std::string here() const {
    if (pos_ >= text_.size()) return "the end";
    return fmt::format("'{}'", text_.substr(pos_, std::min<std::size_t>(12, text_.size() - pos_)));
  }

  [[noreturn]] void fail(std::size_t at, const std::string& message) const {
    throw invalid_argument(
        fmt::format("fused expression \"{}\": at position {}: {}", text_, at, message));
  }

  void expect(char c) {
    skip_space();
    if (pos_ >= text_.size() || text_[pos_] != c) {
      fail(pos_, fmt::format("expected '{}', got {}", c, here()));
    }
    ++pos_;
  }

  fused_instr instruction(std::int32_t k) {
    const std::size_t start = pos_;
    while (pos_ < text_.size() && is_name_char(text_[pos_])) ++pos_;
    const std::string_view name = text_.substr(start, pos_ - start);
    if (name.empty()) fail(start, fmt::format("expected an op name, got {}", here()));
    const auto op = ew_op_from_name(name);
    if (!op) fail(start, fmt::format("unknown op '{}'", name));
    fused_instr in;
    in.op = *op;
    expect('(');
    int count = 0;
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == ')') {
      ++pos_;
    } else {
      for (;;) {
        skip_space();
        const fused_operand a = operand(k);
        if (count < 2) in.args[static_cast<std::size_t>(count)] = a;
        ++count;
        skip_space();
        if (pos_ < text_.size() && text_[pos_] == ',') {
          ++pos_;
          continue;
        }
        expect(')');
        break;
      }
    }
    const int arity = info(in.op).arity;
    if (count != arity) {
      fail(start,
           fmt::format("{} takes {} operand{}, got {}", name, arity, arity == 1 ? "" : "s", count));
    }
    return in;
  }

  fused_operand operand(std::int32_t k) {
    const std::size_t start = pos_;
    const char* first = text_.data() + pos_;
    const char* last = text_.data() + text_.size();
    fused_operand a;
    if (pos_ < text_.size() && text_[pos_] == '%') {
      if (pos_ + 1 >= text_.size() || text_[pos_ + 1] < '0' || text_[pos_ + 1] > '9') {
        fail(start, "expected a value number after '%'");
      }
      std::int64_t v = -1;
      auto [p, ec] = std::from_chars(first + 1, last, v);
      if (ec == std::errc::result_out_of_range) fail(start, "value number out of range");
      if (ec != std::errc()) fail(start, "expected a value number after '%'");
      pos_ += static_cast<std::size_t>(p - first);
      const std::int64_t defined = std::int64_t{num_inputs_} + k;
      if (v >= defined) {
        fail(start,
             fmt::format(
                 "%{} is used before it is defined (instruction {} may use {})", v, k,
                 defined == 0 ? std::string("no values") : fmt::format("%0 .. %{}", defined - 1)));
      }
      a.value = static_cast<std::int32_t>(v);
      return a;
    }
    double x = 0.0;
    auto [p, ec] = std::from_chars(first, last, x);
    if (ec == std::errc::result_out_of_range) {
      fail(start, fmt::format("literal {} is out of a double's range",
                              text_.substr(start, static_cast<std::size_t>(p - first))));
    }
    if (ec != std::errc())
      fail(start, fmt::format("expected a value (%k) or a number, got {}", here()));
    if (!std::isfinite(x)) {
      fail(start, fmt::format("literal '{}' is not finite",
                              text_.substr(start, static_cast<std::size_t>(p - first))));
    }
    pos_ += static_cast<std::size_t>(p - first);
    a.literal = x;
    return a;
  }

  std::string_view text_;
  std::int32_t num_inputs_;
  std::size_t pos_ = 0;
};

}  // namespace

fused_expr fused_expr::parse(std::string_view text, std::int32_t num_inputs,
                             const std::vector<std::int64_t>& results) {
  if (num_inputs < 0) {
    throw invalid_argument(fmt::format("fused expression: num_inputs {} is negative", num_inputs));
  }
  fused_expr e;
  e.num_inputs = num_inputs;
  e.instrs = parser(text, num_inputs).parse();
  const std::int64_t values = std::int64_t{num_inputs} + static_cast<std::int64_t>(e.instrs.size());
  for (std::size_t j = 0; j < results.size(); ++j) {
    if (results[j] < 0 || results[j] >= values) {
      throw invalid_argument(
          fmt::format("fused expression \"{}\": result {} is %{}, but the values are %0 .. %{}",
                      text, j, results[j], values - 1));
    }
    e.results.push_back(static_cast<std::int32_t>(results[j]));
  }
  e.validate();
  return e;
}

void fused_expr::validate() const {
  auto fail = [](const std::string& message) {
    throw invalid_argument("fused expression: " + message);
  };
  if (num_inputs < 0) fail(fmt::format("num_inputs {} is negative", num_inputs));
  for (std::size_t k = 0; k < instrs.size(); ++k) {
    const fused_instr& in = instrs[k];
    if (!valid_op(in.op)) {
      fail(fmt::format("instruction {} has an unknown op ({})", k, static_cast<int>(in.op)));
    }
    const std::int64_t defined = std::int64_t{num_inputs} + static_cast<std::int64_t>(k);
    for (int j = 0; j < info(in.op).arity; ++j) {
      const fused_operand& a = in.args[static_cast<std::size_t>(j)];
      if (a.is_literal()) {
        if (a.value != -1) {
          fail(fmt::format("instruction {} ({}): operand {} has value number {}", k,
                           info(in.op).name, j, a.value));
        }
        if (!std::isfinite(a.literal)) {
          fail(fmt::format("instruction {} ({}): literal {} is not finite", k, info(in.op).name,
                           a.literal));
        }
      } else if (a.value >= defined) {
        fail(fmt::format("instruction {} ({}): operand {} is %{}, which is not defined before it",
                         k, info(in.op).name, j, a.value));
      }
    }
  }
  if (results.empty()) fail("there are no results");
  for (std::size_t j = 0; j < results.size(); ++j) {
    if (results[j] < 0 || results[j] >= num_values()) {
      fail(fmt::format("result {} is %{}, but the values are %0 .. %{}", j, results[j],
                       num_values() - 1));
    }
  }
}

// ---- the unfused form ------------------------------------------------------------------------

std::vector<output> expand_values(const fused_expr& e, const std::vector<output>& inputs,
                                  const node_options& options) {
  e.validate();
  if (inputs.empty()) throw invalid_argument("expand: a fused expression needs an input");
  if (inputs.size() != static_cast<std::size_t>(e.num_inputs)) {
    throw invalid_argument(
        fmt::format("expand: the expression takes {} inputs, got {}", e.num_inputs, inputs.size()));
  }
  graph_builder& b = inputs[0].builder();
  const dtype t = inputs[0].dtype_of();
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].valid() || &inputs[i].builder().g() != &b.g()) {
      throw invalid_argument(fmt::format("expand: input {} is not in the first input's graph", i));
    }
    if (inputs[i].dtype_of() != t) {
      throw invalid_argument(fmt::format("expand: input {} is {} but input 0 is {}", i,
                                         loom::to_string(inputs[i].dtype_of()),
                                         loom::to_string(t)));
    }
  }
  auto opts = [&](std::string_view what) {
    node_options o;
    o.device = options.device;
    if (!options.name.empty()) o.name = b.g().unique_name(fmt::format("{}/{}", options.name, what));
    return o;
  };
  std::vector<output> values(inputs);
  values.reserve(static_cast<std::size_t>(e.num_values()));
  for (const fused_instr& in : e.instrs) {
    const ew_op_info& oi = info(in.op);
    std::vector<output> args;
    for (int j = 0; j < oi.arity; ++j) {
      const fused_operand& a = in.args[static_cast<std::size_t>(j)];
      args.push_back(a.is_literal() ? ops::scalar(b, a.literal, t, opts("literal"))
                                    : values[static_cast<std::size_t>(a.value)]);
    }
    if (in.op == ew_op::gelu_tanh) {
      values.push_back(b.add1("gelu", args, {{"approximate", "tanh"}}, opts("gelu")));
    } else {
      values.push_back(b.add1(oi.name, args, {}, opts(oi.name)));
    }
  }
  return values;
}

std::vector<output> expand(const fused_expr& e, const std::vector<output>& inputs,
                           const node_options& options) {
  const std::vector<output> values = expand_values(e, inputs, options);
  // The fused node's output shape: the broadcast shape of all the inputs, when known.
  std::optional<shape> full = shape{};
  for (const output& in : inputs) {
    const auto& s = in.type().shape;
    if (!s || !s->is_fully_defined()) {
      full.reset();
      break;
    }
    full = broadcast_shapes(*full, *s);  // the instructions broadcast them already
  }
  std::vector<output> out;
  out.reserve(e.results.size());
  for (std::int32_t r : e.results) {
    output v = values[static_cast<std::size_t>(r)];
    const auto& vs = v.type().shape;
    if (full && vs && *vs != *full) {
      node_options o;
      o.device = options.device;
      if (!options.name.empty()) {
        o.name = v.builder().g().unique_name(fmt::format("{}/broadcast_to", options.name));
      }
      v = ops::broadcast_to(v, *full, o);
    }
    out.push_back(v);
  }
  return out;
}

// ---- the builder -----------------------------------------------------------------------------

namespace ops {

std::vector<output> fused_elementwise(const std::vector<output>& inputs, const fused_expr& e,
                                      const node_options& options) {
  if (inputs.empty()) throw invalid_argument("ops::fused_elementwise: needs at least one input");
  e.validate();
  if (inputs.size() != static_cast<std::size_t>(e.num_inputs)) {
    throw invalid_argument(
        fmt::format("ops::fused_elementwise: the expression takes {} inputs, got {}", e.num_inputs,
                    inputs.size()));
  }
  std::vector<std::int64_t> results(e.results.begin(), e.results.end());
  attr_map attrs{{"M", static_cast<std::int64_t>(results.size())},
                 {"expr", e.to_string()},
                 {"results", std::move(results)}};
  return inputs[0].builder().add("fused_elementwise", inputs, std::move(attrs), options);
}

}  // namespace ops

}  // namespace loom
