#include "runtime/core/device_wait.h"

#include <utility>

namespace tessera {
namespace {

thread_local DeviceWaitCheck t_check;

}  // namespace

ScopedDeviceWaitCheck::ScopedDeviceWaitCheck(DeviceWaitCheck check)
    : previous_(std::exchange(t_check, std::move(check))) {}

ScopedDeviceWaitCheck::~ScopedDeviceWaitCheck() {
  t_check = std::move(previous_);
}

absl::Status WaitForDevice(absl::FunctionRef<absl::StatusOr<bool>()> ready,
                           absl::FunctionRef<absl::Status()> block,
                           absl::FunctionRef<std::string()> what) {
  if (!t_check) return block();
  while (true) {
    absl::StatusOr<bool> done = ready();
    if (!done.ok()) return done.status();
    if (*done) return absl::OkStatus();
    absl::Status checked = t_check(what);
    if (!checked.ok()) return checked;
  }
}

}  // namespace tessera
