// What every communicator shares, whatever carries its bytes.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include "loom/core/input.hpp"
#include "loom/distributed/communicator.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::distributed {

namespace {

// LOOM_DISTRIBUTED_TIMEOUT in seconds, or 300 s. A value that is not a positive number of
// seconds is an error naming the variable (a silent default would hide a typo until a job
// hangs for five minutes).
std::chrono::milliseconds default_timeout() {
  const char* env = std::getenv("LOOM_DISTRIBUTED_TIMEOUT");
  if (env == nullptr || *env == '\0') return std::chrono::seconds(300);
  const auto s = parse_number<double>(env, "LOOM_DISTRIBUTED_TIMEOUT (seconds)");
  if (!(s > 0 && s < 1e9)) {
    throw invalid_argument(
        fmt::format("LOOM_DISTRIBUTED_TIMEOUT={} is not a positive number of seconds", env));
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000));
}

}  // namespace

communicator::communicator() : timeout_(default_timeout()) {}

namespace {

struct group_table {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<communicator>, std::less<>> groups;
};

group_table& groups() {
  static auto* t = new group_table();  // never destroyed: kernels may run during exit
  return *t;
}

}  // namespace

void register_group(const std::string& name, std::shared_ptr<communicator> comm) {
  if (name == "world") throw invalid_argument("the group 'world' is world() and cannot be replaced");
  if (name.empty()) throw invalid_argument("a group needs a name");
  if (!comm) throw invalid_argument(fmt::format("group '{}': no communicator", name));
  group_table& t = groups();
  std::lock_guard lock(t.mutex);
  t.groups[name] = std::move(comm);
}

void unregister_group(const std::string& name) {
  group_table& t = groups();
  std::lock_guard lock(t.mutex);
  t.groups.erase(name);
}

std::vector<std::string> all_gather_strings(communicator& comm, const std::string& text) {
  const auto n = static_cast<std::int64_t>(comm.size());
  tensor length = memory::host_tensor<std::int64_t>({1}, std::vector<std::int64_t>{
                                                             static_cast<std::int64_t>(text.size())});
  tensor lengths = memory::host_tensor(dtype::i64, {n});
  comm.all_gather(length, lengths)->wait();
  const auto l = lengths.span<std::int64_t>();
  const std::int64_t longest = std::max<std::int64_t>(1, *std::max_element(l.begin(), l.end()));
  tensor mine = memory::host_tensor(dtype::u8, {longest});
  std::fill_n(mine.data<std::uint8_t>(), longest, std::uint8_t{0});
  std::copy(text.begin(), text.end(), mine.data<std::uint8_t>());
  tensor all = memory::host_tensor(dtype::u8, {n * longest});
  comm.all_gather(mine, all)->wait();
  std::vector<std::string> out;
  for (std::int64_t r = 0; r < n; ++r) {
    const auto* first = reinterpret_cast<const char*>(all.data<std::uint8_t>() + r * longest);
    out.emplace_back(first, static_cast<std::size_t>(l[static_cast<std::size_t>(r)]));
  }
  return out;
}

bool launched_with_peers() noexcept {
  // Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE; MPICH's, Slurm's and PMIx launchers
  // PMI_SIZE.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* v = std::getenv(name);
    if (v == nullptr) continue;
    try {
      if (parse_number<std::int64_t>(v, name) > 1) return true;
    } catch (const error&) {
      // Not a number: not a launcher's.
    }
  }
  return false;
}

std::shared_ptr<communicator> group(const std::string& name) {
  if (name == "world") return world();
  group_table& t = groups();
  std::lock_guard lock(t.mutex);
  if (const auto it = t.groups.find(name); it != t.groups.end()) return it->second;
  std::string known = "world";
  for (const auto& [n, c] : t.groups) known += ", " + n;
  throw not_found(fmt::format(
      "no communicator registered as group '{}' (registered: {}; "
      "loom::distributed::register_group names one)",
      name, known));
}

}  // namespace loom::distributed
