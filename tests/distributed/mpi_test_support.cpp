// What every test program of tests/distributed links (the room's *_support.cpp): Open MPI
// under the sanitizers.
#include <cstdlib>

// Under ASan+UBSan (scripts/test.sh): what Open MPI's libraries and the components they load
// keep until the process exits is not loom's, and is suppressed by library; full stacks, so
// that a frame of those libraries is seen under the allocations they make through others,
// and Open MPI's components kept loaded (below), so that their frames have names. A leak
// with no such frame, loom's own, is still reported.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libmpi.so\nleak:libopen-pal.so\nleak:libopen-rte.so\nleak:mca_\nleak:libpmix.so\n"
         "leak:libhwloc.so\nleak:libevent\nleak:libfabric.so\nleak:libucs.so\nleak:libucp.so\n"
         "leak:libuct.so\nleak:libibverbs.so\n";
}
extern "C" const char* __asan_default_options() { return "fast_unwind_on_malloc=0"; }

// Open MPI unloads its components at MPI_Finalize, before LeakSanitizer looks; keep them
// (the mpirun tests set the same in their environment, tests/CMakeLists.txt).
[[maybe_unused]] static const int keep_components = [] {
  setenv("OMPI_MCA_mca_base_component_disable_dlclose", "1", 0);
  return 0;
}();