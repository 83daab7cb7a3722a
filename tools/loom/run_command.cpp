// `loom run GRAPH.json --feed name=FILE.npy ... --fetch name ...`: runs a serialized graph
// and writes each fetch as a .npy file. A GRAPH ending in .onnx is an ONNX model: feeds and
// fetches may name its inputs and outputs, and without --fetch every output is fetched.
#include <fmt/format.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string_view>

#include "commands.hpp"
#include "loom/core/error.hpp"
#include "loom/core/input.hpp"
#include "loom/graph/serialization.hpp"
#include "loom/memory/npy.hpp"
#include "loom/onnx/import.hpp"
#include "loom/passes/pass_manager.hpp"
#include "loom/runtime/session.hpp"

namespace loom::tools {
namespace {

struct run_args {
  std::string graph_path;
  std::vector<std::string> feeds;
  std::vector<std::string> fetches;
  std::vector<std::string> targets;
  std::string output_dir = ".";
  std::string trace_path;
  bool explain = false;
  bool explain_fusion = false;
  bool no_passes = false;
  std::vector<std::string> disabled_passes;
  bool soft = false;
  int virtual_cpus = 1;
  int repeat = 1;
};

// A tensor name on the command line: "node" or "node:k", k a non-negative integer.
CLI::Validator tensor_name() {
  return {[](std::string& text) -> std::string {
            const auto colon = text.rfind(':');
            if (text.empty() || colon == 0) return fmt::format("'{}' names no node", text);
            if (colon == std::string::npos) return {};
            const std::string what = fmt::format("the output index of '{}'", text);
            try {
              const auto k =
                  parse_number<std::int32_t>(std::string_view(text).substr(colon + 1), what);
              if (k < 0)
                return fmt::format("{}: {} is negative (expected node or node:k)", what, k);
            } catch (const parse_error& e) {
              return fmt::format("{} (expected node or node:k)", e.what());
            }
            return {};
          },
          "NODE[:K]", "tensor name"};
}

// A feed on the command line: name=FILE, FILE a file that can be read.
CLI::Validator feed_spec() {
  return {[](std::string& text) -> std::string {
            const auto eq = text.find('=');
            if (eq == std::string::npos || eq == 0 || eq + 1 == text.size()) {
              return fmt::format("'{}': expected name=FILE.npy", text);
            }
            try {
              (void)open_input_file(text.substr(eq + 1), ".npy file");
            } catch (const error& e) {
              return fmt::format("'{}': {}", text, e.what());
            }
            return {};
          },
          "NAME=FILE.npy", "feed"};
}

// "h:1" → "h_1.npy": a file name for a fetch.
std::string file_name_for(const std::string& fetch) {
  std::string out;
  for (char c : fetch) out += (c == ':' || c == '/') ? '_' : c;
  return out + ".npy";
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto args = std::make_shared<run_args>();
  auto* cmd = app.add_subcommand("run", "Run a serialized graph (JSON) with .npy feeds");
  cmd->add_option("graph", args->graph_path, "The graph, as written by graph_to_json")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--feed", args->feeds, "name=FILE.npy (repeatable)")->check(feed_spec());
  cmd->add_option("--fetch", args->fetches, "A tensor to fetch, 'node' or 'node:k' (repeatable)")
      ->check(tensor_name());
  cmd->add_option("--target", args->targets, "A node to run without fetching (repeatable)")
      ->check(tensor_name());
  cmd->add_option("--output-dir,-o", args->output_dir, "Where the fetched .npy files go");
  cmd->add_option("--trace", args->trace_path, "Write a Chrome trace (Perfetto) of the run here");
  cmd->add_flag("--explain-placement", args->explain, "Print each node's device and why");
  cmd->add_flag("--explain-fusion", args->explain_fusion,
                "Print every rewrite the graph passes made and every candidate they refused, "
                "with the reason");
  cmd->add_flag("--no-passes", args->no_passes, "Run the graph as written (no graph passes)");
  cmd->add_option("--disable-pass", args->disabled_passes, "Switch one graph pass off (repeatable)")
      ->check(CLI::IsMember(passes::pass_manager::standard_pass_names()));
  cmd->add_flag("--soft-placement", args->soft,
                "Place nodes whose requested device is missing elsewhere");
  cmd->add_option("--virtual-cpus", args->virtual_cpus, "Split the CPU into N devices")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--repeat", args->repeat, "Run this many times (the last run is written)")
      ->check(CLI::Range(1, 1000000));
  cmd->callback(guarded("run", [args] {
    const bool onnx = std::filesystem::path(args->graph_path).extension() == ".onnx";
    if (args->fetches.empty() && args->targets.empty() && !onnx) {
      usage_error("--fetch", "nothing to do: give at least one --fetch or --target");
    }
    // Where results go, before any work: a path that cannot be written is a usage error now.
    if (!args->fetches.empty() || onnx) {
      try {
        create_output_directory(args->output_dir, "output directory");
      } catch (const error& e) {
        usage_error("--output-dir", e.what());
      }
    }
    if (!args->trace_path.empty()) {
      try {
        check_output_file(args->trace_path, "trace file");
      } catch (const error& e) {
        usage_error("--trace", e.what());
      }
    }
    graph g;
    // An ONNX model's input and output names, as the loom tensors that hold them.
    std::map<std::string, std::string> onnx_names;
    if (onnx) {
      auto m = onnx::import_file(args->graph_path);
      g = std::move(m.graph);
      if (args->explain_fusion) {
        for (const auto& r : m.rewrites) fmt::print("onnx import: {}\n", r);
      }
      for (const auto& v : m.inputs) onnx_names[v.onnx_name] = v.tensor;
      for (const auto& v : m.outputs) {
        onnx_names[v.onnx_name] = v.tensor;
        if (args->fetches.empty() && args->targets.empty()) args->fetches.push_back(v.onnx_name);
      }
    } else {
      g = load_graph(args->graph_path);
    }
    auto loom_name = [&](const std::string& name) {
      auto it = onnx_names.find(name);
      return it == onnx_names.end() ? name : it->second;
    };
    std::vector<std::string> fetches;
    for (const auto& f : args->fetches) fetches.push_back(loom_name(f));
    std::vector<feed> feeds;
    for (const auto& f : args->feeds) {
      const auto eq = f.find('=');
      const std::string path = f.substr(eq + 1);
      try {
        feeds.emplace_back(loom_name(f.substr(0, eq)), memory::read_npy(path));
      } catch (const parse_error& e) {
        throw parse_error(fmt::format("--feed {}: {}", f, e.what()), e.line());
      }
    }
    session_options options;
    options.devices.virtual_cpu_devices = args->virtual_cpus;
    options.allow_soft_placement = args->soft;
    options.passes.enabled = !args->no_passes;
    options.passes.disabled = args->disabled_passes;
    session s(std::move(g), options);
    std::vector<std::string> feed_names;
    for (const auto& f : feeds) feed_names.push_back(f.first);
    if (args->explain) {
      for (const auto& d : s.explain_placement(feed_names, fetches, args->targets)) {
        fmt::print("{} ({}) -> {}: {}\n", d.node, d.op, d.device, d.reason);
      }
    }
    if (args->explain_fusion) {
      const auto log = s.explain_passes(feed_names, fetches, args->targets);
      for (const auto& r : log) fmt::print("{}\n", passes::to_string(r));
      if (log.empty()) fmt::print("passes: nothing rewritten or refused\n");
    }
    std::vector<tensor> out;
    run_metadata md;
    run_options ro;
    ro.trace = !args->trace_path.empty();
    for (int i = 0; i < args->repeat; ++i) {
      md = run_metadata();
      out = s.run(feeds, fetches, args->targets, &md, ro);
    }
    for (tensor& t : out) t = s.host_value(t);  // .npy files hold host memory
    for (std::size_t i = 0; i < out.size(); ++i) {
      const auto path =
          (std::filesystem::path(args->output_dir) / file_name_for(args->fetches[i])).string();
      memory::write_npy(out[i], path);
      fmt::print("{}: {} -> {}\n", args->fetches[i], out[i].describe(), path);
    }
    if (ro.trace) {
      md.write_chrome_trace(args->trace_path);
      fmt::print("trace: {} nodes -> {}\n", md.nodes.size(), args->trace_path);
    }
  }));
}

}  // namespace loom::tools
