// Interpreter exit: every piece of loom work that runs without the GIL is counted, and an
// atexit hook cancels the runs among them and waits for all of them before Python finalizes.
//
// Note [interpreter exit]
// When the main thread ends, Python joins the non-daemon threads, calls the atexit hooks,
// and then finalizes: from that moment a daemon thread that asks for the GIL is stopped
// (Python 3.11 and 3.12 end it with pthread_exit, whose forced unwinding through C++
// destructors aborts the process; later versions hang it), and once the interpreter is gone
// the process's static objects (loom's pools, devices, thread pools) are destroyed under
// whatever C++ is still running. A daemon thread inside Session.run used to meet one or the
// other: a SIGSEGV or "terminate called without an active exception" at exit.
//
// So loom work without the GIL happens inside a `without_gil` scope, which counts itself in
// flight from before it lets the GIL go until after it has it back. At import, loom
// registers an atexit hook (atexit runs before finalization, while every thread still
// runs): it marks the interpreter as exiting, sets the cancel flag of every run in flight,
// lets the GIL go and waits until nothing is in flight. Each run stops before its next node
// and drains (docs/runtime.md), takes the GIL back (the hook does not hold it) and leaves the
// count; its thread raises loom.CancelledError and goes on in Python until Python stops it as
// any daemon thread. From then on a `without_gil` on any thread but the exiting one raises
// loom.CancelledError before doing anything, so no thread is in loom's C++ code when
// finalization starts, and none enters it afterwards. The exiting thread itself may still
// run loom (in a later atexit hook): it is the thread finalization runs on.
//
// Non-daemon threads are joined by Python before the atexit hooks: their runs finish as
// usual and are not cancelled. Buffers over Python objects (NumPy arrays, objects with
// __cuda_array_interface__) are released with the GIL while the interpreter lives, directly
// when the releasing thread holds it, and left to the process's end once it is finalizing
// (call_with_gil).
#include <pybind11/pybind11.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "bindings.hpp"
#include "loom/core/error.hpp"

namespace loom::python {
namespace {

// Never destroyed: threads Python stopped may hold scopes when the process ends.
struct in_flight_registry {
  std::mutex mutex;
  std::condition_variable idle;
  std::size_t count = 0;
  std::vector<std::atomic<bool>*> cancels;  // of the runs in flight
  bool exiting = false;
  std::thread::id exit_thread;
};

in_flight_registry& registry() {
  static auto* r = new in_flight_registry;
  return *r;
}

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// The atexit hook (Note [interpreter exit]); called with the GIL.
void on_interpreter_exit() {
  in_flight_registry& r = registry();
  {
    const std::lock_guard lock(r.mutex);
    r.exiting = true;
    r.exit_thread = std::this_thread::get_id();
    for (std::atomic<bool>* cancel : r.cancels) cancel->store(true);
  }
  const py::gil_scoped_release unlocked;  // the runs take it back on their way out
  std::unique_lock lock(r.mutex);
  r.idle.wait(lock, [&] { return r.count == 0; });
}

}  // namespace

without_gil::without_gil(std::atomic<bool>* cancel) : cancel_(cancel) {
  in_flight_registry& r = registry();
  {
    const std::lock_guard lock(r.mutex);
    if (r.exiting && std::this_thread::get_id() != r.exit_thread) {
      throw cancelled_error(
          "the Python interpreter is exiting: loom starts no more work on other threads");
    }
    ++r.count;
    if (cancel_ != nullptr) r.cancels.push_back(cancel_);
  }
  state_ = PyEval_SaveThread();
}

without_gil::~without_gil() {
  PyEval_RestoreThread(state_);
  in_flight_registry& r = registry();
  {
    const std::lock_guard lock(r.mutex);
    --r.count;
    if (const auto it = std::find(r.cancels.begin(), r.cancels.end(), cancel_);
        cancel_ != nullptr && it != r.cancels.end()) {
      r.cancels.erase(it);
    }
  }
  r.idle.notify_all();
}

std::size_t runs_in_flight() {
  in_flight_registry& r = registry();
  const std::lock_guard lock(r.mutex);
  return r.cancels.size();
}

bool call_with_gil(void (*fn)(void*), void* arg) noexcept {
  if (Py_IsInitialized() == 0) return false;
  if (PyGILState_Check() != 0) {
    fn(arg);  // this thread holds the GIL (the finalizing one included)
    return true;
  }
  // Another thread may ask for the GIL only while the interpreter is not finalizing (Note
  // [interpreter exit]); after that what fn would release is left to the process's end.
  if (interpreter_finalizing()) return false;
  const PyGILState_STATE state = PyGILState_Ensure();
  fn(arg);
  PyGILState_Release(state);
  return true;
}

void bind_exit(py::module_& m) {
  m.def("_runs_in_flight", &runs_in_flight,
        "How many Session.run calls are executing now, on every thread (for tests)");
  py::module_::import("atexit").attr("register")(py::cpp_function(&on_interpreter_exit));
}

}  // namespace loom::python
