// The fatal hook: what a process that is about to end abnormally (std::_Exit
// or MPI_Abort on a stalled job, parallel/fault_monitor.h) runs first, so
// that a server can tell its clients (an error in every open response) before
// its sockets die with it.
//
// One hook per process, installed for a scope (ScopedFatalHook: a server
// while it serves). RunFatalHook runs it at most once, on the calling thread;
// the hook must bound its own time (it delays the exit) and may be called
// from any thread while others are blocked (it must not wait on them).
#ifndef TESSERA_RUNTIME_CORE_FATAL_HOOK_H_
#define TESSERA_RUNTIME_CORE_FATAL_HOOK_H_

#include <functional>
#include <string>

#include "absl/strings/string_view.h"

namespace tessera {

using FatalHook = std::function<void(absl::string_view why)>;

// Installs `hook` for its lifetime (the previous one, if any, comes back
// after). The destructor waits for a run of the hook under way to end, so a
// hook may use what the scope owns. Not copyable.
class ScopedFatalHook {
 public:
  explicit ScopedFatalHook(FatalHook hook);
  ~ScopedFatalHook();
  ScopedFatalHook(const ScopedFatalHook&) = delete;
  ScopedFatalHook& operator=(const ScopedFatalHook&) = delete;

 private:
  FatalHook previous_;
};

// Any thread: runs the installed hook with `why` (the line that says why the
// process ends), once per process; later calls and calls with no hook
// installed do nothing.
void RunFatalHook(absl::string_view why);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_CORE_FATAL_HOOK_H_
