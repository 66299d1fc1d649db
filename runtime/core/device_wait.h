// Device waits that a fault monitor can end.
//
// A host thread waiting for a GPU stream blocks in cudaStreamSynchronize until
// the stream's work ends; when that work is a collective whose peer rank has
// stopped, it never ends, and the waiting rank cannot take part in the job's
// fault round (parallel/fault_monitor.h) — only its watchdog's exit, seconds
// later and without naming the stalled peer, would end it. So device waits go
// through WaitForDevice: with no check installed on the calling thread they
// block as before (one process: nothing else to answer); with one (the fault
// monitor's, installed on the MPI thread of a job), they poll the device and
// run the check between polls, and the check's error (a step past its
// deadline, a fault round under way) ends the wait.
#ifndef TESSERA_RUNTIME_CORE_DEVICE_WAIT_H_
#define TESSERA_RUNTIME_CORE_DEVICE_WAIT_H_

#include <functional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera {

// Returns OK to go on waiting, or the error that ends the wait; `what` names
// the wait for the error.
using DeviceWaitCheck =
    std::function<absl::Status(absl::FunctionRef<std::string()> what)>;

// Installs `check` for device waits on the calling thread for its lifetime
// (the previous one comes back after).
class ScopedDeviceWaitCheck {
 public:
  explicit ScopedDeviceWaitCheck(DeviceWaitCheck check);
  ~ScopedDeviceWaitCheck();
  ScopedDeviceWaitCheck(const ScopedDeviceWaitCheck&) = delete;
  ScopedDeviceWaitCheck& operator=(const ScopedDeviceWaitCheck&) = delete;

 private:
  DeviceWaitCheck previous_;
};

// Waits for a device: `block` when the calling thread has no check; else
// polls `ready` (true: done; an error ends the wait) and runs the check
// between polls.
absl::Status WaitForDevice(absl::FunctionRef<absl::StatusOr<bool>()> ready,
                           absl::FunctionRef<absl::Status()> block,
                           absl::FunctionRef<std::string()> what);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_CORE_DEVICE_WAIT_H_
