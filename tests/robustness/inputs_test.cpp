// Note [the robustness catalogue]: bad inputs and faults a user can give loom, each with the
// outcome it must get. The C++ half is here, one GoogleTest case each (so ctest counts them
// by surface): graph JSON and graph files, .npy files, safetensors files and checkpoints,
// CSV datasets, allocation logs, the C ABI, session feeds and fetches, memory budgets and
// many threads. The command-line tool, the Python package, signals, `kill -9` mid-save and
// interpreter exit are in tests/robustness/test_sweep.py. Each case asserts: a typed loom
// error (never an abort, never a foreign exception), a message naming what was wrong (the
// file, offset or line, node, op, dtype, shape, option), the process still usable after it,
// and nothing held by cpu:0's pool (LeakSanitizer checks the rest in the ASan build).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "loom/checkpoint/checkpoint.hpp"
#include "loom/checkpoint/safetensors.hpp"
#include "loom/core/input.hpp"
#include "loom/graph/graph.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/graph/serialization.hpp"
#include "loom/memory/allocation_log.hpp"
#include "loom/memory/c_api.h"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/limiting_adaptor.hpp"
#include "loom/memory/npy.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"
#include "loom/train/dataset.hpp"
#include "robustness/robustness_support.hpp"

namespace loom::robustness {
namespace {

using memory::host_tensor;
using o = outcome;

// Each surface's cases run through one fixture: outcome, then the process still usable and
// cpu:0's pool back where it was.
class Catalogue : public ::testing::TestWithParam<bad_case> {
 protected:
  void SetUp() override {
    expect_still_usable(std::numeric_limits<std::size_t>::max());  // warm cpu:0 up once
    baseline_ = cpu_bytes_in_use();
  }
  void check() {
    expect_outcome(GetParam());
    expect_still_usable(baseline_);
  }
  std::size_t baseline_ = 0;
};

// ---- graph JSON ---------------------------------------------------------------------------

std::string doc(const std::string& nodes) {
  return R"({"format": "loom.graph", "version": 1, "nodes": [)" + nodes + "]}";
}
const std::string ph_x =
    R"({"name": "x", "op": "placeholder", "attrs": {"dtype": {"dtype": "float32"}, "shape": {"shape": [2]}}})";

bad_case json_case(std::string name, o expect, std::vector<std::string> parts, std::string text) {
  return {std::move(name), expect, std::move(parts),
          [text = std::move(text)] { (void)graph_from_json(text); }};
}

std::vector<bad_case> graph_json_cases() {
  std::string deep(100000, '[');
  return {
      json_case("EmptyText", o::parse_error, {"graph json"}, ""),
      json_case("NotJson", o::parse_error, {"graph json"}, "this is not json"),
      json_case("Truncated", o::parse_error, {"graph json"}, doc(ph_x).substr(0, 40)),
      json_case("TopLevelArray", o::parse_error, {"object"}, "[1, 2, 3]"),
      json_case("WrongFormat", o::parse_error, {"format"},
                R"({"format": "onnx", "version": 1, "nodes": []})"),
      json_case("FutureVersion", o::parse_error, {"version"},
                R"({"format": "loom.graph", "version": 99, "nodes": []})"),
      json_case("NodesNotArray", o::parse_error, {"nodes"},
                R"({"format": "loom.graph", "version": 1, "nodes": {}})"),
      json_case("NodeNotObject", o::parse_error, {"node #0"}, doc("42")),
      json_case("NodeWithoutName", o::parse_error, {"\"name\""}, doc(R"({"op": "no_op"})")),
      json_case("NameNotString", o::parse_error, {"\"name\" must be a string"},
                doc(R"({"name": 7, "op": "no_op"})")),
      json_case("EmptyName", o::parse_error, {"may not be empty"},
                doc(R"({"name": "", "op": "no_op"})")),
      json_case("NameWithColon", o::parse_error, {"'a:1'", "':'"},
                doc(R"({"name": "a:1", "op": "no_op"})")),
      json_case("NameWithNewline", o::parse_error, {"white space"},
                doc(R"({"name": "a\nb", "op": "no_op"})")),
      json_case("NameWithCaret", o::parse_error, {"'^'"}, doc(R"({"name": "^a", "op": "no_op"})")),
      json_case("DuplicateName", o::invalid_argument, {"'x'"}, doc(ph_x + "," + ph_x)),
      json_case("UnknownOp", o::not_found, {"'n'", "frobnicate"},
                doc(R"({"name": "n", "op": "frobnicate"})")),
      json_case("UnknownKey", o::parse_error, {"unknown key 'colour'"},
                doc(R"({"name": "n", "op": "no_op", "colour": "red"})")),
      json_case("InputToMissingNode", o::not_found, {"'y'", "'nope'"},
                doc(ph_x + R"(, {"name": "y", "op": "identity", "inputs": ["nope"]})")),
      json_case("InputIndexNotANumber", o::parse_error, {"'x:abc'", "not a tensor name"},
                doc(ph_x + R"(, {"name": "y", "op": "identity", "inputs": ["x:abc"]})")),
      json_case("InputIndexNegative", o::parse_error, {"'x:-1'"},
                doc(ph_x + R"(, {"name": "y", "op": "identity", "inputs": ["x:-1"]})")),
      json_case("InputIndexHuge", o::parse_error, {"'x:99999999999'"},
                doc(ph_x + R"(, {"name": "y", "op": "identity", "inputs": ["x:99999999999"]})")),
      json_case("InputIndexPastOutputs", o::not_found, {"'y'", "output 3"},
                doc(ph_x + R"(, {"name": "y", "op": "identity", "inputs": ["x:3"]})")),
      json_case("ControlInputWithIndex", o::parse_error, {"'^x:1'"},
                doc(ph_x + R"(, {"name": "y", "op": "no_op", "inputs": ["^x:1"]})")),
      json_case("DataInputAfterControl", o::parse_error, {"comes after a control input"},
                doc(ph_x + R"(, {"name": "y", "op": "identity", "inputs": ["^x", "x"]})")),
      json_case("Cycle", o::invalid_argument, {"cycle", "a -> b -> a"},
                doc(R"({"name": "a", "op": "identity", "inputs": ["b"]},
                       {"name": "b", "op": "identity", "inputs": ["a"]})")),
      json_case("WrongInputCount", o::invalid_argument, {"'y'", "expects 1 input"},
                doc(ph_x + R"(, {"name": "y", "op": "identity", "inputs": ["x", "x"]})")),
      json_case("UnknownDtype", o::parse_error, {"'x'", "float128"},
                doc(R"({"name": "x", "op": "placeholder", "attrs": {"dtype": {"dtype": "float128"}, "shape": {"shape": [2]}}})")),
      json_case("AttrOfWrongType", o::invalid_argument, {"'x'", "'dtype'"},
                doc(R"({"name": "x", "op": "placeholder", "attrs": {"dtype": {"int": 3}, "shape": {"shape": [2]}}})")),
      json_case("UnknownAttr", o::invalid_argument, {"'x'", "'colour'"},
                doc(R"({"name": "x", "op": "placeholder", "attrs": {"dtype": {"dtype": "float32"}, "shape": {"shape": [2]}, "colour": {"int": 1}}})")),
      json_case("MissingAttr", o::invalid_argument, {"'x'", "'dtype'"},
                doc(R"({"name": "x", "op": "placeholder", "attrs": {"shape": {"shape": [2]}}})")),
      json_case("ShapeDimBelowMinusOne", o::invalid_argument, {"'x'", "dimension 0 is -5"},
                doc(R"({"name": "x", "op": "placeholder", "attrs": {"dtype": {"dtype": "float32"}, "shape": {"shape": [-5]}}})")),
      json_case("ShapeProductOverflows", o::invalid_argument, {"'x'", "2^63"},
                doc(R"({"name": "x", "op": "placeholder", "attrs": {"dtype": {"dtype": "float32"}, "shape": {"shape": [4611686018427387904, 4]}}})")),
      json_case("ShapeDimNotInteger", o::parse_error, {"'x'", "integer"},
                doc(R"({"name": "x", "op": "placeholder", "attrs": {"dtype": {"dtype": "float32"}, "shape": {"shape": [2.5]}}})")),
      json_case("TensorDataShort", o::parse_error, {"'c'"},
                doc(R"({"name": "c", "op": "const", "attrs": {"value": {"tensor": {"dtype": "float32", "shape": [3], "data": [1, 2]}}}})")),
      json_case("TensorValueOutOfRange", o::parse_error, {"'c'", "out of range"},
                doc(R"({"name": "c", "op": "const", "attrs": {"value": {"tensor": {"dtype": "int8", "shape": [1], "data": [300]}}}})")),
      json_case("TensorShapeTooLarge", o::parse_error, {"'c'", "too large"},
                doc(R"({"name": "c", "op": "const", "attrs": {"value": {"tensor": {"dtype": "float32", "shape": [4611686018427387904, 4], "data": []}}}})")),
      json_case("ListLengthHuge", o::invalid_argument, {"'c'", "N"},
                doc(ph_x + R"(, {"name": "c", "op": "concat", "inputs": ["x"], "attrs": {"N": {"int": 4611686018427387904}, "axis": {"int": 0}}})")),
      json_case("BadDeviceString", o::invalid_argument, {"'x'", "TPU"},
                doc(R"({"name": "x", "op": "placeholder", "device": "/device:TPU:0", "attrs": {"dtype": {"dtype": "float32"}, "shape": {"shape": [2]}}})")),
      json_case("DeepNesting", o::parse_error, {"graph json"}, deep),
      json_case("InvalidUtf8", o::parse_error, {"graph json"},
                doc("{\"name\": \"\xff\xfe\", \"op\": \"no_op\"}")),
      json_case("NumberTooLargeForInt", o::parse_error, {"1e400"},
                doc(R"({"name": "c", "op": "concat", "inputs": [], "attrs": {"N": {"int": 1e400}}})")),
  };
}

class GraphJson : public Catalogue {};
TEST_P(GraphJson, RefusedWithATypedErrorNamingIt) { check(); }
INSTANTIATE_TEST_SUITE_P(Robustness, GraphJson, ::testing::ValuesIn(graph_json_cases()), case_name);

// ---- files by path: graph files, .npy, safetensors, allocation logs, datasets ----------------

std::vector<bad_case> file_cases() {
  const auto dir = scratch_dir();
  const auto missing = (dir / "no_such_file").string();
  auto both = [&](const std::string& surface, std::function<void(const std::string&)> open) {
    return std::vector<bad_case>{
        {surface + "Missing", o::not_found, {"no_such_file", "no such file"},
         [=] { open(missing); }},
        {surface + "IsADirectory", o::invalid_argument, {dir.string(), "is a directory"},
         [=] { open(dir.string()); }},
        {surface + "Empty", o::parse_error, {"empty_" + surface},
         [=] { open(scratch_file("empty_" + surface, "").string()); }},
        {surface + "BinaryGarbage", o::parse_error, {"garbage_" + surface},
         [=] { open(scratch_file("garbage_" + surface, std::string("\x00\x01\xff\xfe\x93", 5)).string()); }},
    };
  };
  std::vector<bad_case> out;
  for (auto& v : {both("Graph", [](const std::string& p) { (void)load_graph(p); }),
                  both("Npy", [](const std::string& p) { (void)memory::read_npy(p); }),
                  both("Safetensors",
                       [](const std::string& p) { (void)checkpoint::load_safetensors(p); }),
                  both("AllocationLog",
                       [](const std::string& p) { (void)memory::parse_allocation_log(std::filesystem::path(p)); }),
                  both("Dataset", [](const std::string& p) { (void)train::load_csv(p); })}) {
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

class Files : public Catalogue {};
TEST_P(Files, RefusedWithATypedErrorNamingTheFile) { check(); }
INSTANTIATE_TEST_SUITE_P(Robustness, Files, ::testing::ValuesIn(file_cases()), case_name);

// ---- .npy contents --------------------------------------------------------------------------

bad_case npy_case(std::string name, std::vector<std::string> parts, std::string bytes,
                  o expect = o::parse_error) {
  return {std::move(name), expect, std::move(parts), [bytes = std::move(bytes)] {
            (void)memory::parse_npy(std::as_bytes(std::span(bytes.data(), bytes.size())));
          }};
}

std::vector<bad_case> npy_cases() {
  const std::string f4 = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  const std::string two_floats(8, '\0');
  return {
      npy_case("BadMagic", {"not a .npy file"}, "NUMPY\x01\x00" + std::string(60, ' ')),
      npy_case("TooShort", {}, "\x93NUM"),
      npy_case("UnknownVersion", {"version"}, npy_bytes(f4, two_floats, 9, 0)),
      npy_case("HeaderPastEnd", {}, std::string("\x93NUMPY\x01\x00\xff\xff", 10) + "{'descr'"),
      npy_case("HeaderNotADict", {"header"}, npy_bytes("[1, 2, 3]", two_floats)),
      npy_case("MissingShape", {"shape"}, npy_bytes("{'descr': '<f4', 'fortran_order': False, }", two_floats)),
      npy_case("MissingDescr", {"descr"}, npy_bytes("{'fortran_order': False, 'shape': (2,), }", two_floats)),
      npy_case("DuplicateKey", {"twice"}, npy_bytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", two_floats)),
      npy_case("UnknownKey", {"colour"}, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'colour': 1, }", two_floats)),
      npy_case("ComplexDtype", {"'<c8'"}, npy_bytes("{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", std::string(16, '\0'))),
      npy_case("ObjectDtype", {"'|O'"}, npy_bytes("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", std::string(16, '\0'))),
      npy_case("StructuredDtype", {"descr"}, npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", two_floats)),
      npy_case("NegativeDimension", {"expected a dimension"}, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", two_floats)),
      npy_case("ShapeOverflows", {"shape"}, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 8), }", two_floats)),
      npy_case("DataTruncated", {"data"}, npy_bytes(f4, std::string(4, '\0'))),
      npy_case("FortranOrderNotBool", {"fortran_order"}, npy_bytes("{'descr': '<f4', 'fortran_order': 3, 'shape': (2,), }", two_floats)),
      npy_case("UnterminatedString", {}, npy_bytes("{'descr': '<f4, 'fortran_order': False, 'shape': (2,), }", two_floats)),
      npy_case("ShapeNotATuple", {"shape"}, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': 'two', }", two_floats)),
  };
}

class Npy : public Catalogue {};
TEST_P(Npy, RefusedWithAParseError) { check(); }
INSTANTIATE_TEST_SUITE_P(Robustness, Npy, ::testing::ValuesIn(npy_cases()), case_name);

// ---- safetensors contents -------------------------------------------------------------------

bad_case st_case(std::string name, std::vector<std::string> parts, std::string bytes) {
  return {std::move(name), o::parse_error, std::move(parts), [bytes = std::move(bytes)] {
            (void)checkpoint::parse_safetensors(std::as_bytes(std::span(bytes.data(), bytes.size())));
          }};
}

std::vector<bad_case> safetensors_cases() {
  const std::string eight(8, '\0');
  return {
      st_case("ShorterThanItsLength", {"safetensors"}, std::string("\x05\x00", 2)),
      st_case("HeaderLengthPastEnd", {"safetensors"}, std::string("\xff\xff\xff\xff\x00\x00\x00\x00{}", 10)),
      st_case("HeaderLengthHuge", {"safetensors"}, std::string(8, '\xff') + "{}"),
      st_case("HeaderNotJson", {"safetensors"}, safetensors_bytes("{not json", "")),
      st_case("HeaderNotObject", {"safetensors"}, safetensors_bytes("[1]", "")),
      st_case("UnknownDtype", {"\"w\"", "Q7"}, safetensors_bytes(R"({"w": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}})", eight)),
      st_case("MissingOffsets", {"\"w\"", "data_offsets"}, safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [2]}})", eight)),
      st_case("OffsetsPastData", {"\"w\""}, safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 80]}})", eight)),
      st_case("OffsetsReversed", {"\"w\""}, safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", eight)),
      st_case("BytesNotShapeTimesSize", {"\"w\""}, safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", eight)),
      st_case("NegativeDimension", {"\"w\""}, safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", eight)),
      st_case("ShapeOverflows", {"\"w\""}, safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 8], "data_offsets": [0, 8]}})", eight)),
      st_case("Overlapping", {"overlap"}, safetensors_bytes(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", eight)),
      st_case("DuplicateName", {"\"w\""}, safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", eight)),
      st_case("MetadataNotStrings", {"__metadata__"}, safetensors_bytes(R"({"__metadata__": {"epoch": 3}})", "")),
      st_case("BoolNotZeroOrOne", {"\"b\""}, safetensors_bytes(R"({"b": {"dtype": "BOOL", "shape": [1], "data_offsets": [0, 1]}})", "\x07")),
  };
}

class Safetensors : public Catalogue {};
TEST_P(Safetensors, RefusedWithAParseError) { check(); }
INSTANTIATE_TEST_SUITE_P(Robustness, Safetensors, ::testing::ValuesIn(safetensors_cases()), case_name);

// ---- checkpoints restored into a session ----------------------------------------------------

// A session with one variable w: f32 [2, 3].
std::unique_ptr<session> model_session() {
  graph g;
  graph_builder b(g);
  (void)ops::variable(b, "w", host_tensor({2, 3}, {1, 2, 3, 4, 5, 6}));
  return std::make_unique<session>(std::move(g));
}

bad_case restore_case(std::string name, o expect, std::vector<std::string> parts,
                      std::vector<std::pair<std::string, tensor>> tensors) {
  return {std::move(name), expect, std::move(parts), [name, tensors = std::move(tensors)] {
            const auto path = scratch_dir() / (name + ".safetensors");
            checkpoint::save_safetensors(path, tensors);
            auto s = model_session();
            try {
              (void)checkpoint::restore_checkpoint(*s, path);
            } catch (...) {
              // The session is unchanged and still runs.
              const auto w = s->run({}, {"w"}).at(0);
              EXPECT_EQ(w.span<float>()[5], 6.0f);
              throw;
            }
          }};
}

std::vector<bad_case> checkpoint_cases() {
  return {
      restore_case("ShapeDiffers", o::invalid_argument, {"'w'", "[3, 2]", "[2, 3]"},
                   {{"w", host_tensor({3, 2}, {1, 2, 3, 4, 5, 6})}}),
      restore_case("DtypeDiffers", o::invalid_argument, {"'w'", "float64"},
                   {{"w", host_tensor<double>({2, 3}, std::vector<double>(6, 1.0))}}),
      restore_case("VariableMissing", o::not_found, {"'w'"},
                   {{"other", host_tensor({1}, {1})}}),
      restore_case("RankDiffers", o::invalid_argument, {"'w'"}, {{"w", host_tensor({6}, {1, 2, 3, 4, 5, 6})}}),
      {"FileMissing", o::not_found, {"absent.safetensors"}, [] {
         auto s = model_session();
         (void)checkpoint::restore_checkpoint(*s, scratch_dir() / "absent.safetensors");
       }},
      {"FileIsADirectory", o::invalid_argument, {"is a directory"}, [] {
         auto s = model_session();
         (void)checkpoint::restore_checkpoint(*s, scratch_dir());
       }},
      {"FileCorrupt", o::parse_error, {"corrupt.safetensors"}, [] {
         const auto path = scratch_file("corrupt.safetensors", safetensors_bytes("{\"w\": 1", ""));
         auto s = model_session();
         (void)checkpoint::restore_checkpoint(*s, path);
       }},
      {"SaveIntoMissingDirectory", o::error, {"no_dir"}, [] {
         auto s = model_session();
         (void)s->run({}, {"w"});
         checkpoint::save_checkpoint(*s, scratch_dir() / "no_dir" / "c.safetensors");
       }},
      {"SaveUnderARegularFile", o::error, {"a_file"}, [] {
         const auto file = scratch_file("a_file", "x");
         auto s = model_session();
         (void)s->run({}, {"w"});
         checkpoint::save_checkpoint(*s, file / "c.safetensors");
       }},
  };
}

class Checkpoints : public Catalogue {};
TEST_P(Checkpoints, RefusedLeavingTheSessionAsItWas) { check(); }
INSTANTIATE_TEST_SUITE_P(Robustness, Checkpoints, ::testing::ValuesIn(checkpoint_cases()), case_name);

// ---- CSV datasets ---------------------------------------------------------------------------

bad_case csv_case(std::string name, std::vector<std::string> parts, std::string text) {
  return {name, o::parse_error, std::move(parts), [name, text = std::move(text)] {
            (void)train::load_csv(scratch_file(name + ".csv", text));
          }};
}

std::vector<bad_case> csv_cases() {
  return {
      csv_case("HeaderOnly", {"HeaderOnly.csv"}, "label,a,b\n"),
      csv_case("BlankLinesOnly", {"BlankLinesOnly.csv"}, "\n\n  \n"),
      csv_case("FeatureNotANumber", {"FeatureNotANumber.csv:2:"}, "0,1,2\n1,x,3\n"),
      csv_case("RowOfAnotherWidth", {"RowOfAnotherWidth.csv:3:"}, "0,1,2\n1,2,3\n1,2\n"),
      csv_case("NegativeLabel", {"NegativeLabel.csv:2:"}, "0,1,2\n-1,2,3\n"),
      csv_case("LabelNotAnInteger", {"LabelNotAnInteger.csv:2:"}, "0,1,2\n1.5,2,3\n"),
      csv_case("LabelNotANumberAfterTheFirstLine", {"LabelNotANumberAfterTheFirstLine.csv:3:"},
               "0,1,2\n1,2,3\ncat,4,5\n"),
      csv_case("LabelTooLarge", {"LabelTooLarge.csv:2:", "99999999999"}, "0,1,2\n99999999999,2,3\n"),
      csv_case("NoFeatures", {"NoFeatures.csv"}, "0\n1\n"),
      csv_case("TrailingComma", {"TrailingComma.csv:1:"}, "0,1,2,\n"),
  };
}

class Datasets : public Catalogue {};
TEST_P(Datasets, RefusedNamingTheFileAndLine) { check(); }
INSTANTIATE_TEST_SUITE_P(Robustness, Datasets, ::testing::ValuesIn(csv_cases()), case_name);

// ---- allocation logs ------------------------------------------------------------------------

const std::string log_header =
    "# loom allocation log v1\nseq,thread,time_ns,action,pointer,bytes,alignment,stream,tag,outcome\n";

bad_case log_case(std::string name, std::vector<std::string> parts, std::string text) {
  return {std::move(name), o::parse_error, std::move(parts), [text = std::move(text)] {
            std::istringstream in(text);
            (void)memory::parse_allocation_log(in);
          }};
}

std::vector<bad_case> allocation_log_cases() {
  const std::string h = log_header;
  return {
      log_case("NoHeader", {"line 1"}, "0,0,1,allocate,0x10,64,64,0x0,t,ok\n"),
      log_case("WrongFieldCount", {"line 3"}, h + "0,0,1,allocate,0x10,64\n"),
      log_case("UnknownAction", {"line 3", "reallocate"}, h + "0,0,1,reallocate,0x10,64,64,0x0,t,ok\n"),
      log_case("UnknownOutcome", {"line 3", "maybe"}, h + "0,0,1,allocate,0x10,64,64,0x0,t,maybe\n"),
      log_case("BytesNotANumber", {"line 3"}, h + "0,0,1,allocate,0x10,lots,64,0x0,t,ok\n"),
      log_case("BytesNegative", {"line 3"}, h + "0,0,1,allocate,0x10,-64,64,0x0,t,ok\n"),
      log_case("BytesOverflow", {"line 3"}, h + "0,0,1,allocate,0x10,99999999999999999999999,64,0x0,t,ok\n"),
      log_case("AlignmentNotPowerOfTwo", {"line 3", "alignment"}, h + "0,0,1,allocate,0x10,64,48,0x0,t,ok\n"),
      log_case("PointerNotHex", {"line 3"}, h + "0,0,1,allocate,10,64,64,0x0,t,ok\n"),
      log_case("FreeOfUnknownBlock", {"line 3"}, h + "0,0,1,deallocate,0x10,64,64,0x0,t,ok\n"),
      log_case("FreeWithWrongSize", {"line 4"}, h + "0,0,1,allocate,0x10,64,64,0x0,t,ok\n1,0,2,deallocate,0x10,32,64,0x0,t,ok\n"),
      log_case("LiveBlockReturnedAgain", {"line 4"}, h + "0,0,1,allocate,0x10,64,64,0x0,t,ok\n1,0,2,allocate,0x10,64,64,0x0,t,ok\n"),
      log_case("UnterminatedQuote", {"line 3"}, h + "0,0,1,allocate,0x10,64,64,0x0,\"tag,ok\n"),
  };
}

class AllocationLogs : public Catalogue {};
TEST_P(AllocationLogs, RefusedNamingTheLine) { check(); }
INSTANTIATE_TEST_SUITE_P(Robustness, AllocationLogs, ::testing::ValuesIn(allocation_log_cases()), case_name);

// ---- the C ABI ------------------------------------------------------------------------------

// A C ABI call must return its documented status and message, and never throw.
bad_case abi_case(std::string name, int status, std::string part, std::function<void()> call) {
  return {std::move(name), o::status, {}, [status, part = std::move(part), call = std::move(call)] {
            call();
            EXPECT_EQ(loom_last_error(), status);
            EXPECT_NE(std::string(loom_last_error_message()).find(part), std::string::npos)
                << loom_last_error_message();
          }};
}

std::vector<bad_case> c_abi_cases() {
  const loom_device cpu{LOOM_DEVICE_CPU, 0};
  return {
      abi_case("AlignmentNotPowerOfTwo", LOOM_ERROR_INVALID_ARGUMENT, "alignment",
               [=] { EXPECT_EQ(loom_allocate(64, 48, cpu, nullptr), nullptr); }),
      abi_case("AlignmentHuge", LOOM_ERROR_OUT_OF_MEMORY, "",
               [=] { EXPECT_EQ(loom_allocate(64, std::size_t{1} << 62, cpu, nullptr), nullptr); }),
      abi_case("SizeCannotExist", LOOM_ERROR_OUT_OF_MEMORY, "",
               [=] { EXPECT_EQ(loom_allocate(std::numeric_limits<std::size_t>::max() - 8, 64, cpu, nullptr), nullptr); }),
      abi_case("UnknownDeviceType", LOOM_ERROR_NO_DEVICE, "",
               [] { EXPECT_EQ(loom_allocate(64, 64, loom_device{77, 0}, nullptr), nullptr); }),
      abi_case("NegativeDeviceIndex", LOOM_ERROR_NO_DEVICE, "",
               [] { EXPECT_EQ(loom_allocate(64, 64, loom_device{LOOM_DEVICE_CPU, -3}, nullptr), nullptr); }),
      abi_case("StatsIntoNull", LOOM_ERROR_INVALID_ARGUMENT, "",
               [=] { EXPECT_EQ(loom_memory_stats(cpu, nullptr), LOOM_ERROR_INVALID_ARGUMENT); }),
      abi_case("LibraryNameNull", LOOM_ERROR_INVALID_ARGUMENT, "",
               [=] { EXPECT_EQ(loom_allocate_for(nullptr, 64, 64, cpu, nullptr), nullptr); }),
      abi_case("LibraryNameTooLong", LOOM_ERROR_INVALID_ARGUMENT, "",
               [=] { EXPECT_EQ(loom_allocate_for(std::string(200, 'a').c_str(), 64, 64, cpu, nullptr), nullptr); }),
      abi_case("LibraryNameNotPrintable", LOOM_ERROR_INVALID_ARGUMENT, "",
               [=] { EXPECT_EQ(loom_allocate_for("to\x01rch", 64, 64, cpu, nullptr), nullptr); }),
      abi_case("DeallocateForUnknownLibrary", LOOM_ERROR_INVALID_ARGUMENT, "",
               [=] {
                 void* p = loom_allocate(64, 64, cpu, nullptr);
                 loom_deallocate_for("never_allocated", p, 64, 64, cpu, nullptr);
                 const int status = loom_last_error();
                 loom_deallocate(p, 64, 64, cpu, nullptr);
                 EXPECT_EQ(loom_last_error(), LOOM_OK);
                 // Leaves the status of the call under test for the check.
                 loom_deallocate_for("never_allocated", reinterpret_cast<void*>(64), 64, 64, cpu, nullptr);
                 EXPECT_EQ(status, LOOM_ERROR_INVALID_ARGUMENT);
               }),
      abi_case("StatsForBadLibraryName", LOOM_ERROR_INVALID_ARGUMENT, "",
               [=] {
                 loom_memory_statistics st{};
                 EXPECT_EQ(loom_memory_stats_for(cpu, "bad name\n", &st), LOOM_ERROR_INVALID_ARGUMENT);
               }),
      abi_case("DeallocateNullIsNothing", LOOM_OK, "",
               [=] { loom_deallocate(nullptr, 64, 64, cpu, nullptr); }),
  };
}

class CAbi : public Catalogue {};
TEST_P(CAbi, ReturnsItsDocumentedStatus) { check(); }
INSTANTIATE_TEST_SUITE_P(Robustness, CAbi, ::testing::ValuesIn(c_abi_cases()), case_name);

// ---- session feeds and fetches --------------------------------------------------------------

// x: f32 [-1, 3] -> y = x + x. The bad run throws; the same session then runs a good feed.
bad_case run_case(std::string name, o expect, std::vector<std::string> parts,
                  std::function<void(session&)> bad) {
  return {std::move(name), expect, std::move(parts), [bad = std::move(bad)] {
            graph g;
            graph_builder b(g);
            auto x = ops::placeholder(b, "x", dtype::f32, {-1, 3});
            (void)ops::add(x, x, {.name = "y"});
            session s(std::move(g));
            try {
              bad(s);
            } catch (...) {
              const auto y = s.run({{"x", host_tensor({1, 3}, {1, 2, 3})}}, {"y"}).at(0);
              EXPECT_EQ(y.span<float>()[2], 6.0f);
              throw;
            }
          }};
}

std::vector<bad_case> session_cases() {
  const auto good = [] { return host_tensor({1, 3}, {1, 2, 3}); };
  return {
      run_case("UnknownFeed", o::not_found, {"'z'"},
               [=](session& s) { (void)s.run({{"x", good()}, {"z", good()}}, {"y"}); }),
      run_case("MissingFeed", o::invalid_argument, {"'x'"}, [](session& s) { (void)s.run({}, {"y"}); }),
      run_case("FeedWrongDtype", o::invalid_argument, {"'x'", "float64"},
               [](session& s) { (void)s.run({{"x", host_tensor<double>({1, 3}, std::vector<double>{1, 2, 3})}}, {"y"}); }),
      run_case("FeedWrongRank", o::invalid_argument, {"'x'", "[3]"},
               [](session& s) { (void)s.run({{"x", host_tensor({3}, {1, 2, 3})}}, {"y"}); }),
      run_case("FeedWrongDimension", o::invalid_argument, {"'x'", "[1, 4]"},
               [](session& s) { (void)s.run({{"x", host_tensor({1, 4}, {1, 2, 3, 4})}}, {"y"}); }),
      run_case("FeedUndefinedTensor", o::invalid_argument, {"'x'"},
               [](session& s) { (void)s.run({{"x", tensor()}}, {"y"}); }),
      run_case("FeedTwice", o::invalid_argument, {"'x'"},
               [=](session& s) { (void)s.run({{"x", good()}, {"x", good()}}, {"y"}); }),
      run_case("FetchUnknown", o::not_found, {"'nope'"}, [=](session& s) { (void)s.run({{"x", good()}}, {"nope"}); }),
      run_case("FetchIndexNotANumber", o::invalid_argument, {"'y:abc'"},
               [=](session& s) { (void)s.run({{"x", good()}}, {"y:abc"}); }),
      run_case("FetchIndexPastOutputs", o::not_found, {"'y:4'"},
               [=](session& s) { (void)s.run({{"x", good()}}, {"y:4"}); }),
      run_case("TargetUnknown", o::not_found, {"'t'"}, [=](session& s) { (void)s.run({{"x", good()}}, {}, {"t"}); }),
      {"OutputOfAGraphMovedIntoASession", o::not_found, {"no node #1", "fetch it by name"}, [] {
         graph g;
         graph_builder b(g);
         auto x = ops::placeholder(b, "x", dtype::f32, {-1});
         auto y = ops::add(x, x, {.name = "y"});
         session s(std::move(g));
         (void)y.name();
       }},
      run_case("FetchEmptyName", o::invalid_argument, {"''"},
               [=](session& s) { (void)s.run({{"x", good()}}, {""}); }),
  };
}

class Sessions : public Catalogue {};
TEST_P(Sessions, RefusedLeavingTheSessionUsable) { check(); }
INSTANTIATE_TEST_SUITE_P(Robustness, Sessions, ::testing::ValuesIn(session_cases()), case_name);

// ---- memory budgets -------------------------------------------------------------------------

std::vector<bad_case> budget_cases() {
  return {
      {"AllocationOverBudget", o::out_of_memory, {"'b'", "exceed its limit"}, [] {
         memory::limiting_adaptor budget(memory::host_resource::instance(), 1024, "b");
         void* p = budget.allocate(1000, 64);
         try {
           (void)budget.allocate(1000, 64);
         } catch (...) {
           budget.deallocate(p, 1000, 64);
           EXPECT_EQ(budget.used(), 0u);
           throw;
         }
       }},
      {"ZeroBudget", o::out_of_memory, {"'zero'"}, [] {
         memory::limiting_adaptor budget(memory::host_resource::instance(), 0, "zero");
         (void)budget.allocate(1, 64);
       }},
      {"NestedBudgetOverParent", o::invalid_argument, {"'child'"}, [] {
         memory::limiting_adaptor parent(memory::host_resource::instance(), 1024, "parent");
         memory::limiting_adaptor child(parent, 4096, "child");
       }},
      {"SessionOverItsCpuLimit", o::out_of_memory, {}, [] {
         graph g;
         graph_builder b(g);
         auto x = ops::placeholder(b, "x", dtype::f32, {-1});
         (void)ops::add(x, x, {.name = "y"});
         session_options opts;
         opts.devices.cpu_memory_limit = 1 << 16;
         session s(std::move(g), opts);
         std::vector<float> big(1 << 20, 1.0f);
         try {
           (void)s.run({{"x", host_tensor<float>({1 << 20}, big)}}, {"y"});
         } catch (...) {
           // The session still runs what fits.
           const auto y = s.run({{"x", host_tensor({2}, {1, 2})}}, {"y"}).at(0);
           EXPECT_EQ(y.span<float>()[1], 4.0f);
           throw;
         }
       }},
      {"TensorSizeCannotExist", o::out_of_memory, {}, [] {
         (void)host_tensor(dtype::f32, shape{std::int64_t{1} << 61});
       }},
  };
}

class Budgets : public Catalogue {};
TEST_P(Budgets, RefusedWithOutOfMemoryNamingTheBudget) { check(); }
INSTANTIATE_TEST_SUITE_P(Robustness, Budgets, ::testing::ValuesIn(budget_cases()), case_name);

// ---- many threads ---------------------------------------------------------------------------

// Eight threads share one session; every other run has a bad feed. Good runs give the right
// answer, bad ones a typed error, and nothing is left held.
TEST(Threads, BadRunsDoNotDisturbGoodOnesOnASharedSession) {
  expect_still_usable(std::numeric_limits<std::size_t>::max());
  const std::size_t baseline = cpu_bytes_in_use();
  {
    graph g;
    graph_builder b(g);
    auto x = ops::placeholder(b, "x", dtype::f32, {-1});
    (void)ops::mul(x, x, {.name = "y"});
    session s(std::move(g));
    std::atomic<int> wrong{0};
    std::atomic<int> refused{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 200; ++i) {
          const float v = static_cast<float>(t * 1000 + i);
          if ((t + i) % 2 == 0) {
            try {
              (void)s.run({{"x", host_tensor({2, 2}, {v, v, v, v})}}, {"y"});  // wrong rank
              ++wrong;
            } catch (const invalid_argument&) {
              ++refused;
            }
            continue;
          }
          const auto y = s.run({{"x", host_tensor({2}, {v, -v})}}, {"y"}).at(0);
          if (y.span<float>()[0] != v * v || y.span<float>()[1] != v * v) ++wrong;
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(wrong.load(), 0);
    EXPECT_EQ(refused.load(), 8 * 100);
  }
  expect_still_usable(baseline);
}

// A cancel from another thread while eight threads run: each run either finishes right or is
// cancelled; afterwards the session runs again.
TEST(Threads, CancelWhileManyRunLeavesTheSessionUsable) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {-1});
  auto y = x;
  for (int i = 0; i < 50; ++i) y = ops::add(y, x);
  (void)ops::identity(y, {.name = "out"});
  session s(std::move(g));
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        try {
          const auto out = s.run({{"x", host_tensor({1}, {1})}}, {"out"}).at(0);
          if (out.span<float>()[0] != 51.0f) ++wrong;
        } catch (const cancelled_error&) {
        }
      }
    });
  }
  for (int k = 0; k < 20; ++k) {
    s.cancel();
    std::this_thread::yield();
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(s.run({{"x", host_tensor({1}, {2})}}, {"out"}).at(0).span<float>()[0], 102.0f);
}

}  // namespace
}  // namespace loom::robustness
