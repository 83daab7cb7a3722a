// loom.Session: runs a Graph on this machine's devices.
//
//   s = loom.Session(g, virtual_cpus=1, threads=0)
//   probs, = s.run([p], feeds={x: batch})          # NumPy, PyTorch, loom tensors, lists
//   s.run([], feeds={...}, targets=[update])
//
// Feeds are taken without a copy where possible (to_tensor); fetches come back as
// loom.Tensors (numpy.asarray and torch.from_dlpack share them). The GIL is released while
// the run executes, so other Python threads run meanwhile.
//
// Note [Ctrl-C]
// While a run executes on the main thread of a program that left SIGINT to Python's default
// handler (signal.default_int_handler: KeyboardInterrupt), a C-level SIGINT handler replaces
// Python's: it only sets the run's cancel flag (an atomic store, async-signal-safe), and the
// executor stops before its next node and drains (docs/runtime.md). When the run has
// returned, the previous handler is back and PyErr_SetInterrupt + PyErr_CheckSignals deliver
// the signal to Python as if it had arrived then, so KeyboardInterrupt follows. The session
// stays usable. Runs on other threads are not interrupted (Python delivers signals to the
// main thread only).
// A program that chose otherwise keeps its choice: with SIGINT ignored (signal.SIG_IGN) a
// SIGINT does nothing to the run; with SIG_DFL it ends the process, as it would without
// loom; with a handler of its own, loom leaves the signal to Python: the run is not
// cancelled, and Python calls the handler on the main thread as soon as the run has
// returned (a handler that wants the run stopped calls Session.cancel(), which works from a
// handler while the run is on another thread).
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>

#include "bindings.hpp"
#include "loom/checkpoint/checkpoint.hpp"
#include "loom/core/error.hpp"
#include "loom/runtime/run_metadata.hpp"
#include "loom/runtime/session.hpp"

namespace loom::python {
namespace {

// ---- Ctrl-C (Note [Ctrl-C]) ---------------------------------------------------------------

std::atomic<std::atomic<bool>*> sigint_target{nullptr};
std::atomic<bool> sigint_seen{false};
static_assert(std::atomic<std::atomic<bool>*>::is_always_lock_free);
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_sigint(int) {
  sigint_seen.store(true);
  if (std::atomic<bool>* flag = sigint_target.load()) flag->store(true);
}

// A number, not a py::object: a static Python object would be released after the
// interpreter is gone.
bool on_main_thread() {
  static const unsigned long main_ident =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  return PyThread_get_thread_ident() == main_ident;
}

// True when SIGINT is Python's default (KeyboardInterrupt) handler: not ignored, not the
// program's own (Note [Ctrl-C]).
bool python_default_sigint() {
  const py::module_ signal = py::module_::import("signal");
  const py::object current = signal.attr("getsignal")(SIGINT);
  return current.is(signal.attr("default_int_handler"));
}

// Installs on_sigint for the scope on the main thread, where SIGINT is Python's default
// handler (call with the GIL held).
class sigint_scope {
 public:
  explicit sigint_scope(std::atomic<bool>* cancel) {
    if (!on_main_thread() || !python_default_sigint()) return;
    sigint_seen.store(false);
    sigint_target.store(cancel);
    struct sigaction sa {};
    sa.sa_handler = &on_sigint;
    sigemptyset(&sa.sa_mask);
    active_ = sigaction(SIGINT, &sa, &previous_) == 0;
  }
  sigint_scope(const sigint_scope&) = delete;
  sigint_scope& operator=(const sigint_scope&) = delete;
  ~sigint_scope() { restore(); }

  // Puts Python's handler back; true when a SIGINT came meanwhile.
  bool restore() {
    if (!active_) return false;
    sigaction(SIGINT, &previous_, nullptr);
    sigint_target.store(nullptr);
    active_ = false;
    return sigint_seen.exchange(false);
  }

 private:
  bool active_ = false;
  struct sigaction previous_ {};
};

// ---- run ----------------------------------------------------------------------------------

// Note [pinned results]
// A session's devices own the pools its results live in, and a pool must outlive its
// blocks; but in Python a result (or a NumPy array or PyTorch tensor sharing it) routinely
// outlives the Session. So each tensor handed to Python views a buffer of its own over the
// same memory, whose release drops the original tensor and a reference to the session:
// the session, its devices and pools live until the last result is gone.
struct pinned {
  std::shared_ptr<session> owner;  // declared first: destroyed after the tensor
  tensor original;
};

tensor pin(tensor t, const std::shared_ptr<session>& owner) {
  if (!t.defined()) return t;
  const buffer& b = *t.buf();
  auto holder = std::make_unique<pinned>(pinned{owner, t});
  buffer_ptr view = buffer::adopt(
      b.data(), b.bytes(), b.alignment(), b.device(), b.stream_of(),
      [](void* context, void*, std::size_t, std::size_t, stream) noexcept {
        delete static_cast<pinned*>(context);
      },
      holder.get(), b.read_only());
  holder.release();
  return tensor::strided(std::move(view), t.type(), t.shape(), t.strides(), t.offset());
}

// A fetch or target name from an Output or a str.
std::string name_of(const py::handle& v, const char* what) {
  if (py::isinstance<py_output>(v)) return v.cast<py_output>().out.name();
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  throw_python(PyExc_TypeError,
               fmt::format("a {} is a loom.Output or a name, not a {}", what, type_name(v)));
}

// Names from one Output/str or a sequence of them; `single` says it was one.
std::vector<std::string> names_of(const py::handle& v, const char* what, bool* single = nullptr) {
  std::vector<std::string> out;
  if (v.is_none()) return out;
  if (py::isinstance<py_output>(v) || py::isinstance<py::str>(v)) {
    if (single != nullptr) *single = true;
    out.push_back(name_of(v, what));
    return out;
  }
  if (!py::isinstance<py::list>(v) && !py::isinstance<py::tuple>(v)) {
    throw_python(PyExc_TypeError,
                 fmt::format("expected a {} (a loom.Output or a name) or a list of them, not a {}",
                             what, type_name(v)));
  }
  for (const py::handle e : v) out.push_back(name_of(e, what));
  return out;
}

// The endpoint a feed names, or the error the run would give (KeyError for a node the graph
// lacks or an output it does not have, ValueError for a malformed name), naming the feed.
endpoint feed_endpoint(const session& s, const std::string& name) {
  try {
    return s.get_graph().parse_endpoint(name);
  } catch (const not_found& e) {
    throw not_found(fmt::format("feed '{}': {}", name, e.what()));
  } catch (const invalid_argument& e) {
    throw invalid_argument(fmt::format("feed '{}': {}", name, e.what()));
  }
}

// A feed's value: Python numbers and (nested) lists become a tensor of the fed endpoint's
// dtype (Note [Python values of a dtype]; as TensorFlow's feed_dict converts them); arrays
// and tensors are fed as they are.
tensor feed_value(const session& s, const std::string& name, endpoint e, const py::handle& v) {
  const std::string what = fmt::format("feed '{}'", name);
  if (is_python_values(v)) return tensor_of_values(v, s.get_graph().type_of(e).type, what);
  return to_tensor(v, what);
}

// The Graph each live Session was made from, for the hint below (Note [a session's copy of
// its graph]).
struct session_source {
  std::weak_ptr<session> s;
  std::weak_ptr<py_graph> g;
};
std::mutex sources_mutex;
std::map<const session*, session_source> sources;

void remember_source(const std::shared_ptr<session>& s, const std::shared_ptr<py_graph>& g) {
  const std::lock_guard lock(sources_mutex);
  std::erase_if(sources, [](const auto& kv) { return kv.second.s.expired(); });
  sources[s.get()] = {s, g};
}

// Note [a session's copy of its graph]: a Session copies its Graph when it is made (as
// TensorFlow's does), so a node added to the Graph afterwards is unknown to it. A fetch,
// feed or target that names such a node fails with a KeyError that says so, instead of a
// bare "no node named".
void explain_later_nodes(const std::shared_ptr<session>& s, const std::vector<std::string>& names) {
  std::shared_ptr<py_graph> g;
  {
    const std::lock_guard lock(sources_mutex);
    const auto it = sources.find(s.get());
    if (it == sources.end() || it->second.s.lock() != s) return;
    g = it->second.g.lock();
  }
  if (g == nullptr) return;
  for (const std::string& full : names) {
    const std::string name = full.substr(0, full.rfind(':') == std::string::npos ? full.size()
                                                                                  : full.rfind(':'));
    if (s->get_graph().find(name) == nullptr && g->g.find(name) != nullptr) {
      throw_python(PyExc_KeyError,
                   fmt::format("node '{}' was added to the Graph after this Session was made; a "
                               "Session runs the copy of the Graph it took when it was made: "
                               "make a new Session to run it",
                               name));
    }
  }
}

py::object run(const std::shared_ptr<session>& s, const py::object& fetches,
               const py::object& feeds, const py::object& targets,
               const std::optional<std::string>& trace_path) {
  bool single = false;
  const std::vector<std::string> fetch_names = names_of(fetches, "fetch", &single);
  const std::vector<std::string> target_names = names_of(targets, "target");
  explain_later_nodes(s, fetch_names);
  explain_later_nodes(s, target_names);
  std::vector<feed> feed_list;
  if (!feeds.is_none()) {
    if (!py::isinstance<py::dict>(feeds)) {
      throw_python(PyExc_TypeError,
                   fmt::format("feeds is a {}; expected a dict mapping loom.Outputs or names to "
                               "values",
                               type_name(feeds)));
    }
    for (const auto& [k, v] : feeds.cast<py::dict>()) {
      const std::string name = name_of(k, "feed key");
      explain_later_nodes(s, {name});
      feed_list.emplace_back(name, feed_value(*s, name, feed_endpoint(*s, name), v));
    }
  }
  std::atomic<bool> cancel{false};
  run_metadata meta;
  run_options ro;
  ro.cancel = &cancel;
  ro.trace = trace_path.has_value();
  std::vector<tensor> out;
  bool interrupted = false;
  {
    sigint_scope sigint(&cancel);
    std::exception_ptr failure;
    {
      const without_gil unlocked(&cancel);  // Note [interpreter exit]
      try {
        out = s->run(feed_list, fetch_names, target_names, ro.trace ? &meta : nullptr, ro);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    interrupted = sigint.restore();
    if (interrupted) {
      PyErr_SetInterrupt();
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    if (failure) std::rethrow_exception(failure);
  }
  if (trace_path) meta.write_chrome_trace(*trace_path);
  if (single) return from_tensor(pin(std::move(out.front()), s));
  py::list result;
  for (tensor& t : out) result.append(from_tensor(pin(std::move(t), s)));
  return result;
}

// ---- checkpoints -----------------------------------------------------------------------------

// A path argument: a str, or an os.PathLike that gives one.
std::string path_argument(const py::handle& obj, const char* what) {
  py::object path;
  try {
    path = py::module_::import("os").attr("fspath")(obj);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
  }
  if (!path || !py::isinstance<py::str>(path)) {
    throw_python(PyExc_TypeError, fmt::format("{}: the path must be a str or an os.PathLike, not "
                                              "a {}",
                                              what, type_name(obj)));
  }
  return path.cast<std::string>();
}

// Raises OSError(err, message, path): Python picks the subclass of the errno
// (FileNotFoundError, IsADirectoryError, NotADirectoryError, ...).
[[noreturn]] void raise_os_error(int err, const std::string& message, const std::string& path) {
  const py::object exc = py::reinterpret_borrow<py::object>(PyExc_OSError)(err, message, path);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

// Runs a checkpoint call: loom's typed errors keep their Python exceptions (ValueError for a
// file that does not parse, KeyError for a variable it lacks, ...); a failure of the file
// system, which loom reports as its plain error, is an OSError.
template <class F>
auto checkpoint_call(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const invalid_argument&) {
    throw;
  } catch (const not_found&) {
    throw;
  } catch (const parse_error&) {
    throw;
  } catch (const node_error&) {
    throw;
  } catch (const cancelled_error&) {
    throw;
  } catch (const error& e) {
    throw_python(PyExc_OSError, e.what());
  }
}

// The file a checkpoint is written to: not a directory, in a directory that exists.
void check_save_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  if (path.empty()) raise_os_error(ENOENT, "save: the path is empty", path);
  if (fs::is_directory(p, ec)) {
    raise_os_error(EISDIR, fmt::format("save: '{}' is a directory; a checkpoint is a file", path),
                   path);
  }
  const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const fs::file_status st = fs::status(parent, ec);
  if (!fs::exists(st)) {
    raise_os_error(
        ENOENT,
        fmt::format("save: the directory '{}' of '{}' does not exist", parent.string(), path),
        path);
  }
  if (!fs::is_directory(st)) {
    raise_os_error(ENOTDIR,
                   fmt::format("save: '{}' (in '{}') is not a directory", parent.string(), path),
                   path);
  }
}

// The file a checkpoint is read from: one that exists and is no directory.
void check_restore_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(fs::path(path), ec);
  if (path.empty() || !fs::exists(st)) {
    raise_os_error(ENOENT, fmt::format("restore: the checkpoint '{}' does not exist", path), path);
  }
  if (fs::is_directory(st)) {
    raise_os_error(EISDIR,
                   fmt::format("restore: '{}' is a directory; a checkpoint is a file", path), path);
  }
}

// Checkpoint metadata: a dict of str to str.
std::map<std::string, std::string> metadata_argument(const py::handle& obj) {
  if (!py::isinstance<py::dict>(obj)) {
    throw_python(
        PyExc_TypeError,
        fmt::format("save: metadata must be a dict of str to str, not a {}", type_name(obj)));
  }
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : obj.cast<py::dict>()) {
    if (!py::isinstance<py::str>(k) || !py::isinstance<py::str>(v)) {
      throw_python(PyExc_TypeError,
                   fmt::format("save: metadata must map str to str; it maps {} to a {}",
                               py::repr(k).cast<std::string>(), type_name(v)));
    }
    out.emplace(k.cast<std::string>(), v.cast<std::string>());
  }
  return out;
}

py::dict stats_dict(const memory_stats& st) {
  return py::dict(py::arg("bytes_in_use") = st.bytes_in_use,
                  py::arg("peak_bytes_in_use") = st.peak_bytes_in_use,
                  py::arg("bytes_reserved") = st.bytes_reserved,
                  py::arg("peak_bytes_reserved") = st.peak_bytes_reserved,
                  py::arg("allocations_in_use") = st.allocations_in_use,
                  py::arg("num_allocs") = st.num_allocs, py::arg("num_deallocs") = st.num_deallocs,
                  py::arg("num_failed_allocs") = st.num_failed_allocs,
                  py::arg("free_bytes") = st.free_bytes,
                  py::arg("largest_free_block") = st.largest_free_block,
                  py::arg("fragmentation") = st.fragmentation());
}

}  // namespace

py::dict memory_stats_dict(const memory_stats& st) {
  return stats_dict(st);
}

void bind_session(py::module_& m) {
  py::class_<session, std::shared_ptr<session>>(m, "Session",
                                                "Runs a Graph on this machine's devices")
      .def(py::init([](const std::shared_ptr<py_graph>& g, int virtual_cpus, int threads,
                       const py::object& memory_limit, bool soft_placement, bool passes,
                       std::vector<std::string> disabled_passes) {
             session_options o;
             o.devices.virtual_cpu_devices = virtual_cpus;
             o.devices.cpu_threads = threads;
             // None or 0: no limit (device_options::cpu_memory_limit).
             o.devices.cpu_memory_limit =
                 memory_limit.is_none() ? 0 : size_of_arg(memory_limit, "Session: memory_limit");
             o.allow_soft_placement = soft_placement;
             o.passes.enabled = passes;
             o.passes.disabled = std::move(disabled_passes);
             o.passes.amp = g->amp;  // loom.amp.enable(graph, ...)
             auto s = std::make_shared<session>(g->g, o);
             remember_source(s, g);
             return s;
           }),
           py::arg("graph"), py::kw_only(), py::arg("virtual_cpus") = 1, py::arg("threads") = 0,
           py::arg("memory_limit") = py::none(), py::arg("soft_placement") = false,
           py::arg("passes") = true, py::arg("disabled_passes") = std::vector<std::string>{},
           "A session over a copy of `graph` (later additions to the graph are not seen). "
           "passes=False runs graphs as written; disabled_passes names graph passes to switch "
           "off (docs/passes.md); mixed precision is the graph's (loom.amp.enable)")
      .def(
          "explain_passes",
          [](const std::shared_ptr<session>& s, const py::object& fetches, const py::object& feeds,
             const py::object& targets) {
            const std::vector<std::string> feed_names =
                names_of(py::isinstance<py::dict>(feeds) ? py::object(py::list(feeds)) : feeds, "feed");
            const std::vector<std::string> fetch_names = names_of(fetches, "fetch");
            const std::vector<std::string> target_names = names_of(targets, "target");
            std::vector<passes::pass_record> log;
            {
              const without_gil unlocked;
              log = s->explain_passes(feed_names, fetch_names, target_names);
            }
            py::list out;
            for (const auto& r : log) {
              out.append(py::dict(
                  py::arg("pass") = r.pass,
                  py::arg("kind") = r.what == passes::pass_record::kind::rewrite ? "rewrite" : "refused",
                  py::arg("nodes") = r.nodes, py::arg("result") = r.result,
                  py::arg("reason") = r.reason, py::arg("text") = passes::to_string(r)));
            }
            return out;
          },
          py::arg("fetches"), py::arg("feeds") = py::none(), py::arg("targets") = py::none(),
          "What the graph passes rewrote and refused (with reasons) in the plan for these "
          "fetches, feeds (names, Outputs, or the feed dict) and targets: a list of dicts")
      .def("run", &run, py::arg("fetches"), py::arg("feeds") = py::none(),
           py::arg("targets") = py::none(), py::kw_only(), py::arg("trace") = py::none(),
           "Runs the graph: returns a Tensor for a single fetch, else a list. feeds maps "
           "Outputs or names to values; targets are run too. trace=PATH writes a Chrome trace.")
      .def("cancel", &session::cancel, "Cancels every run in progress")
      .def(
          "host_value",
          [](const session& s, const tensor& t) {
            const without_gil release;  // may wait for the GPU
            return s.host_value(t);
          },
          py::arg("tensor"),
          "The tensor in host memory: itself when it is there, else a copy made by the "
          "session's device that holds it (fetched values stay on the GPU that made them)")
      .def_property_readonly(
          "devices",
          [](const session& s) {
            py::list out;
            for (const auto& d : s.devices()) {
              const auto& a = d->attributes();
              out.append(py::dict(py::arg("name") = a.name, py::arg("threads") = a.threads,
                                  py::arg("memory_limit") = a.memory_limit,
                                  py::arg("description") = a.description));
            }
            return out;
          })
      .def(
          "memory_stats",
          [](const session& s) {
            py::dict out;
            for (const auto& d : s.devices()) {
              if (const auto st = d->allocator().stats()) out[py::str(d->name())] = stats_dict(*st);
            }
            return out;
          },
          "Each device's pool statistics (bytes in use, peak, reserved, fragmentation, ...)")
      .def("variable_names", [](session& s) { return s.variables().names(); })
      .def(
          "variable",
          [](const std::shared_ptr<session>& s, const std::string& name) {
            variable_store::variable* v = s->variables().find(name);
            if (v == nullptr || !v->value.defined()) {
              // Not initialized yet: running the variable node gives it its value (or
              // names what is missing).
              std::atomic<bool> cancel{false};
              run_options ro;
              ro.cancel = &cancel;
              std::vector<tensor> out;
              {
                const without_gil unlocked(&cancel);
                out = s->run({}, {name}, {}, nullptr, ro);
              }
              return pin(std::move(out.front()), s);
            }
            const std::lock_guard lock(v->mutex);
            return pin(v->value, s);
          },
          py::arg("name"), "A variable's current value (shares its memory)")
      .def(
          "save",
          [](session& s, const py::object& path_arg, const py::object& metadata) {
            const std::string path = path_argument(path_arg, "save");
            const auto meta = metadata.is_none() ? std::map<std::string, std::string>{}
                                                 : metadata_argument(metadata);
            check_save_path(path);
            checkpoint_call([&] {
              const without_gil unlocked;
              checkpoint::save_checkpoint(s, path, meta);
            });
          },
          py::arg("path"), py::arg("metadata") = py::none(),
          "Saves every variable to a safetensors checkpoint (atomically). A directory, or a "
          "path in a directory that does not exist, is an OSError (IsADirectoryError, "
          "FileNotFoundError)")
      .def(
          "restore",
          [](session& s, const py::object& path_arg, bool allow_missing) {
            const std::string path = path_argument(path_arg, "restore");
            check_restore_path(path);
            checkpoint::restore_options o;
            o.allow_missing = allow_missing;
            return checkpoint_call([&] {
              const without_gil unlocked;
              return checkpoint::restore_checkpoint(s, path, o);
            });
          },
          py::arg("path"), py::kw_only(), py::arg("allow_missing") = false,
          "Restores variables from a checkpoint; returns its metadata. A missing file is a "
          "FileNotFoundError, a directory an IsADirectoryError, a file that is no checkpoint "
          "a ValueError, a variable it lacks a KeyError")
      .def_property_readonly("plan_count", &session::plan_count);
}

}  // namespace loom::python
