#include "runtime/core/fatal_hook.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <utility>

namespace tessera {
namespace {

struct HookState {
  std::mutex mu;
  std::condition_variable idle;
  FatalHook hook;
  bool running = false;  // A copy of `hook` is running outside the lock.
};

HookState& State() {
  static HookState state;
  return state;
}

std::atomic<bool> g_ran{false};

}  // namespace

ScopedFatalHook::ScopedFatalHook(FatalHook hook) {
  HookState& state = State();
  std::unique_lock<std::mutex> lock(state.mu);
  state.idle.wait(lock, [&] { return !state.running; });
  previous_ = std::exchange(state.hook, std::move(hook));
}

ScopedFatalHook::~ScopedFatalHook() {
  // A hook that is running uses what its installer owns: let it end first
  // (hooks bound their own time).
  HookState& state = State();
  std::unique_lock<std::mutex> lock(state.mu);
  state.idle.wait(lock, [&] { return !state.running; });
  state.hook = std::move(previous_);
}

void RunFatalHook(absl::string_view why) {
  if (g_ran.exchange(true)) return;
  HookState& state = State();
  FatalHook hook;
  {
    std::lock_guard<std::mutex> lock(state.mu);
    if (!state.hook) return;
    hook = state.hook;
    state.running = true;
  }
  // Outside the lock: the hook may take a while.
  hook(why);
  {
    std::lock_guard<std::mutex> lock(state.mu);
    state.running = false;
  }
  state.idle.notify_all();
}

}  // namespace tessera
