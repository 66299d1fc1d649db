// Device-agnostic memory: a raw MemorySource (aligned host memory, or
// cudaMalloc in kernels/cuda) under a PinnableBlockAllocator that caches
// blocks, pins the ones a captured graph references, and counts everything.
//
// Block states: IN USE (handed out), FREE (cached, reusable, returnable by
// Trim), or FREE-BUT-PINNED (cached and reusable by later work on the same
// stream, but never returned to the source while a PinLease holds it: a
// captured graph may still read or write it).
//
// Sizes: requests up to kLargeThreshold are rounded up to a size class (powers
// of two from kMinBlock, with four steps per doubling); larger requests get
// exact-size blocks (rounded to the alignment). Every free list is indexed (one
// per size class; large blocks keyed by size) and removal is swap-and-pop
// through an index stored in the block, so Allocate and Free are O(1) whatever
// the number of cached blocks.
//
// Thread safety: none. One allocator per stream/step loop; graphs and eager
// steps on that stream are serialized, which is what makes reusing a pinned
// free block safe.
#ifndef TESSERA_RUNTIME_CORE_MEMORY_H_
#define TESSERA_RUNTIME_CORE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera {

// Where the bytes come from. Implementations: HostMemorySource (below),
// CudaMemorySource (kernels/cuda). Allocate returns ResourceExhausted when the
// memory is not there.
class MemorySource {
 public:
  virtual ~MemorySource() = default;
  virtual absl::StatusOr<void*> Allocate(size_t bytes, size_t alignment) = 0;
  virtual void Free(void* ptr, size_t bytes) = 0;
  virtual std::string name() const = 0;  // "host", "cuda:0": for messages.
};

// Aligned host memory (std::aligned_alloc). `capacity_bytes` > 0 caps what it
// hands out at once (tests use it to provoke exhaustion); 0 means no cap.
class HostMemorySource final : public MemorySource {
 public:
  explicit HostMemorySource(size_t capacity_bytes = 0)
      : capacity_(capacity_bytes) {}
  absl::StatusOr<void*> Allocate(size_t bytes, size_t alignment) override;
  void Free(void* ptr, size_t bytes) override;
  std::string name() const override { return "host"; }
  size_t outstanding_bytes() const { return outstanding_; }

 private:
  size_t capacity_;
  size_t outstanding_ = 0;
};

struct AllocatorStats {
  // Every Allocate that succeeded, cache hits included, and the bytes of the
  // blocks it handed out: "does this code allocate?" is whether these move
  // (a decode step must not move them).
  int64_t allocations = 0;
  int64_t allocated_bytes = 0;
  int64_t frees = 0;                   // Every Free that succeeded.
  int64_t underlying_allocations = 0;  // Calls into the source that succeeded.
  int64_t underlying_frees = 0;
  int64_t underlying_allocated_bytes =
      0;  // Sum over all underlying allocations.
  int64_t underlying_freed_bytes = 0;
  int64_t reserved_bytes = 0;  // Held from the source now (in use + cached).
  int64_t in_use_bytes = 0;    // Handed out now (block sizes).
  int64_t peak_in_use_bytes = 0;
  int64_t pinned_bytes = 0;   // Blocks with at least one pin (in use or free).
  int64_t cached_blocks = 0;  // Free blocks (pinned or not).
};

class PinnableBlockAllocator;

// Pins held for a captured graph (or anything else that must keep memory
// alive). Destroying the lease releases its pins; it must not outlive its
// allocator. Move-only.
class PinLease {
 public:
  // Out of line: State is incomplete here, and an inline constructor makes
  // the compiler instantiate unique_ptr<State>'s deleter.
  PinLease();
  PinLease(PinLease&& other) noexcept;
  PinLease& operator=(PinLease&& other) noexcept;
  PinLease(const PinLease&) = delete;
  PinLease& operator=(const PinLease&) = delete;
  ~PinLease();

  size_t block_count() const;
  void Release();  // Drops the pins now (idempotent).

 private:
  friend class PinnableBlockAllocator;
  struct State;
  std::unique_ptr<State> state_;
};

class PinnableBlockAllocator {
 public:
  static constexpr size_t kAlignment =
      256;  // Every block starts on this boundary.
  static constexpr size_t kMinBlock = 512;  // Smallest size class.
  static constexpr size_t kLargeThreshold = size_t{1}
                                            << 20;  // Above: exact-size blocks.

  // `source` must outlive the allocator.
  explicit PinnableBlockAllocator(MemorySource* source);
  // Returns every block to the source. Leases must be gone by then (checked in
  // debug).
  ~PinnableBlockAllocator();

  PinnableBlockAllocator(const PinnableBlockAllocator&) = delete;
  PinnableBlockAllocator& operator=(const PinnableBlockAllocator&) = delete;

  // A block of at least `bytes` (> 0). Reuses a cached block of the right class
  // (pinned or not) before asking the source; when the source is exhausted,
  // trims unpinned free blocks and retries once, then fails with
  // ResourceExhausted stating requested, reserved, in use, pinned and free
  // bytes. While a capture is open, the block is recorded for the lease.
  absl::StatusOr<void*> Allocate(size_t bytes);

  // Returns a block to the cache. InvalidArgument for a pointer this allocator
  // did not hand out (foreign) or one already freed (double free); the
  // allocator is unchanged then.
  absl::Status Free(void* ptr);

  // The block size behind a live pointer (>= what was asked), or
  // InvalidArgument.
  absl::StatusOr<size_t> BlockSize(void* ptr) const;

  // Capture: between BeginCapture and Commit, every block allocated, and every
  // live block passed to Reference, is recorded; Commit pins them all and
  // returns the lease. Cancel drops the recording and pins nothing.
  // FailedPrecondition for nested or unmatched calls.
  absl::Status BeginCapture();
  absl::Status Reference(void* ptr);
  absl::StatusOr<PinLease> Commit();
  absl::Status Cancel();
  bool capturing() const;

  // Returns every free, unpinned cached block to the source; pinned blocks
  // stay. Returns the number of bytes released.
  size_t Trim();

  AllocatorStats stats() const;
  std::string DebugString()
      const;  // One line of the stats, for logs and errors.

 private:
  friend class PinLease;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_CORE_MEMORY_H_
