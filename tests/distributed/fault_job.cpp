// A data-parallel training job with a fault, for tests/distributed/fault_jobs.sh: every rank
// trains the MLP together, and at step 3 rank 1 either stops answering ("hang": it sleeps
// for longer than the communicator's timeout) or dies ("die": it exits at once). Each rank
// prints one line, "rank R: <outcome>: <message>", and exits 0 (trained), 3 (a
// loom::distributed_error) or 4 (another error).
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <thread>

#include "loom/distributed/communicator.hpp"
#include "loom/train/dataset.hpp"
#include "loom/train/trainer.hpp"

int main(int argc, char** argv) {
  using namespace loom;
  const std::string_view fault = argc > 1 ? argv[1] : "";
  if (fault != "hang" && fault != "die") {
    std::fprintf(stderr, "usage: fault_job hang|die\n");
    return 2;
  }
  const auto world = distributed::world();
  const int rank = world->rank();
  const auto say = [&](std::string_view outcome, std::string_view message) {
    fmt::print("rank {}: {}: {}\n", rank, outcome, message);
    std::fflush(stdout);
  };
  try {
    train::train_options o;
    o.hidden = {32};
    o.epochs = 1;
    o.batch = 16 * world->size();
    o.max_steps_per_epoch = 20;
    o.optimizer = "sgd";
    o.threads = 1;
    o.evaluate = false;
    o.communicator = world;
    const train::dataset data = train::make_digits(o.batch * 20, 1);
    (void)train::train(data, train::dataset{}, o, [&](const train::step_progress& p) {
      if (rank != 1 || p.step != 3) return;
      if (fault == "die") std::_Exit(7);
      std::this_thread::sleep_for(world->timeout() * 4);
    });
    say("trained", "");
    return 0;
  } catch (const distributed_error& e) {
    say("distributed_error", e.what());
    return 3;
  } catch (const error& e) {
    say("error", e.what());
    return 4;
  }
}
