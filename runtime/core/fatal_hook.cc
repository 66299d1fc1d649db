#include "runtime/core/fatal_hook.h"

#include <atomic>
#include <mutex>
#include <utility>

namespace tessera {
namespace {

std::mutex& HookMutex() {
  static std::mutex mu;
  return mu;
}

FatalHook& Hook() {
  static FatalHook hook;
  return hook;
}

std::atomic<bool> g_ran{false};

}  // namespace

ScopedFatalHook::ScopedFatalHook(FatalHook hook) {
  std::lock_guard<std::mutex> lock(HookMutex());
  previous_ = std::exchange(Hook(), std::move(hook));
}

ScopedFatalHook::~ScopedFatalHook() {
  std::lock_guard<std::mutex> lock(HookMutex());
  Hook() = std::move(previous_);
}

void RunFatalHook(absl::string_view why) {
  if (g_ran.exchange(true)) return;
  FatalHook hook;
  {
    std::lock_guard<std::mutex> lock(HookMutex());
    hook = Hook();
  }
  // Outside the lock: the hook may take a while, and nothing else needs it.
  if (hook) hook(why);
}

}  // namespace tessera
