#include "runtime/core/memory.h"

#include <cassert>
#include <cstdlib>
#include <limits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/numeric/bits.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tessera {
namespace {

constexpr size_t kAlignment = PinnableBlockAllocator::kAlignment;
constexpr size_t kMinBlock = PinnableBlockAllocator::kMinBlock;
constexpr size_t kLargeThreshold = PinnableBlockAllocator::kLargeThreshold;
constexpr int kMinBlockLog2 = 9;
static_assert(size_t{1} << kMinBlockLog2 == kMinBlock, "kMinBlockLog2");
constexpr int kLargeThresholdLog2 = 20;
static_assert(size_t{1} << kLargeThresholdLog2 == kLargeThreshold,
              "kLargeThresholdLog2");
// Four classes per doubling, plus the first class (kMinBlock) itself.
constexpr int kNumClasses = (kLargeThresholdLog2 - kMinBlockLog2) * 4 + 1;

// Marks a block that is not in any free list.
constexpr uint32_t kNotFree = std::numeric_limits<uint32_t>::max();

size_t RoundUp(size_t bytes, size_t multiple) {
  return (bytes + multiple - 1) / multiple * multiple;
}

// Size class of a request <= kLargeThreshold, and the class's block size.
// For bytes in (2^k, 2^(k+1)] the classes are 2^k + i * 2^(k-2), i = 1..4,
// which bounds the internal waste to 25%.
struct SizeClass {
  int index;
  size_t size;
};

SizeClass ClassFor(size_t bytes) {
  if (bytes <= kMinBlock) return {0, kMinBlock};
  const int k = absl::bit_width(bytes - 1) - 1;  // 2^k < bytes <= 2^(k+1).
  const size_t step = size_t{1} << (k - 2);
  const size_t size = RoundUp(bytes, step);
  const int i = static_cast<int>((size - (size_t{1} << k)) / step);
  return {(k - kMinBlockLog2) * 4 + i, size};
}

std::string PtrString(const void* ptr) { return absl::StrFormat("%p", ptr); }

}  // namespace

// ---------------------------------------------------------------------------
// HostMemorySource

absl::StatusOr<void*> HostMemorySource::Allocate(size_t bytes,
                                                 size_t alignment) {
  if (bytes == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host memory source: bad request of ", bytes,
                     " bytes aligned to ", alignment));
  }
  if (capacity_ > 0 &&
      (bytes > capacity_ || outstanding_ > capacity_ - bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "host memory source: ", bytes, " more bytes would exceed the capacity ",
        capacity_, " (outstanding ", outstanding_, ")"));
  }
  // aligned_alloc wants the size to be a multiple of the alignment, and at
  // least pointer alignment.
  const size_t align = alignment < sizeof(void*) ? sizeof(void*) : alignment;
  if (bytes > std::numeric_limits<size_t>::max() - align) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host memory source: ", bytes, " bytes is too large"));
  }
  void* ptr = std::aligned_alloc(align, RoundUp(bytes, align));
  if (ptr == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "host memory source: aligned_alloc of ", bytes, " bytes failed"));
  }
  outstanding_ += bytes;
  return ptr;
}

void HostMemorySource::Free(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  outstanding_ -= bytes;
  std::free(ptr);
}

// ---------------------------------------------------------------------------
// PinnableBlockAllocator internals

struct PinnableBlockAllocator::Impl {
  enum class State : uint8_t { kEmptySlot, kInUse, kFree };

  struct Block {
    void* ptr = nullptr;
    size_t size = 0;
    int class_index = -1;  // -1: a large block, keyed by size.
    State state = State::kEmptySlot;
    uint32_t pins = 0;
    uint32_t free_pos = kNotFree;  // Position in its free list, when free.
    uint64_t recorded_in = 0;      // Capture id that last recorded it.
  };

  explicit Impl(MemorySource* s) : source(s), class_free(kNumClasses) {}

  MemorySource* source;
  std::vector<Block> blocks;  // Slab; indices are stable while held.
  std::vector<uint32_t> empty_slots;
  absl::flat_hash_map<void*, uint32_t> by_ptr;  // Every held block.
  std::vector<std::vector<uint32_t>> class_free;
  absl::flat_hash_map<size_t, std::vector<uint32_t>> large_free;

  bool capturing = false;
  uint64_t capture_id = 0;  // Ids start at 1, so 0 never matches.
  std::vector<uint32_t> recorded;
  absl::flat_hash_set<PinLease::State*> leases;

  AllocatorStats stats;

  std::vector<uint32_t>& FreeListOf(const Block& b) {
    return b.class_index >= 0 ? class_free[b.class_index] : large_free[b.size];
  }

  void PushFree(uint32_t index) {
    Block& b = blocks[index];
    std::vector<uint32_t>& list = FreeListOf(b);
    b.free_pos = static_cast<uint32_t>(list.size());
    list.push_back(index);
    b.state = State::kFree;
    ++stats.cached_blocks;
  }

  // Swap-and-pop: O(1) whatever the list length.
  void RemoveFree(uint32_t index) {
    Block& b = blocks[index];
    std::vector<uint32_t>& list = FreeListOf(b);
    const uint32_t last = list.back();
    list[b.free_pos] = last;
    blocks[last].free_pos = b.free_pos;
    list.pop_back();
    if (list.empty() && b.class_index < 0) large_free.erase(b.size);
    b.free_pos = kNotFree;
    --stats.cached_blocks;
  }

  void Record(uint32_t index) {
    Block& b = blocks[index];
    if (b.recorded_in == capture_id) return;
    b.recorded_in = capture_id;
    recorded.push_back(index);
  }

  // A block recorded by the open capture is about to be pinned: a graph
  // being captured may already use it, so it is not returned to the source.
  bool Trimmable(const Block& b) const {
    return b.state == State::kFree && b.pins == 0 &&
           !(capturing && b.recorded_in == capture_id);
  }

  void Pin(uint32_t index) {
    Block& b = blocks[index];
    if (b.pins++ == 0) stats.pinned_bytes += b.size;
  }

  void Unpin(uint32_t index) {
    Block& b = blocks[index];
    assert(b.pins > 0);
    if (--b.pins == 0) stats.pinned_bytes -= b.size;
  }

  // Returns a free block to the source and its slot to the slab.
  void Release(uint32_t index) {
    Block& b = blocks[index];
    source->Free(b.ptr, b.size);
    ++stats.underlying_frees;
    stats.underlying_freed_bytes += b.size;
    stats.reserved_bytes -= b.size;
    by_ptr.erase(b.ptr);
    b = Block();
    empty_slots.push_back(index);
  }

  size_t Trim() {
    size_t released = 0;
    auto trim_list = [&](std::vector<uint32_t>& list) {
      // Walk backwards so swap-and-pop only moves already-visited entries.
      for (size_t i = list.size(); i-- > 0;) {
        const uint32_t index = list[i];
        if (!Trimmable(blocks[index])) continue;
        released += blocks[index].size;
        const int class_index = blocks[index].class_index;
        if (class_index < 0) {
          // Erasing an emptied large list invalidates `list`; avoid it here.
          const uint32_t last = list.back();
          list[i] = last;
          blocks[last].free_pos = static_cast<uint32_t>(i);
          list.pop_back();
          blocks[index].free_pos = kNotFree;
          --stats.cached_blocks;
        } else {
          RemoveFree(index);
        }
        Release(index);
      }
    };
    for (std::vector<uint32_t>& list : class_free) trim_list(list);
    for (auto it = large_free.begin(); it != large_free.end();) {
      trim_list(it->second);
      if (it->second.empty()) {
        large_free.erase(it++);
      } else {
        ++it;
      }
    }
    return released;
  }

  uint32_t NewSlot() {
    if (!empty_slots.empty()) {
      const uint32_t index = empty_slots.back();
      empty_slots.pop_back();
      return index;
    }
    blocks.emplace_back();
    return static_cast<uint32_t>(blocks.size() - 1);
  }

  absl::StatusOr<void*> Allocate(size_t bytes) {
    if (bytes == 0) {
      return absl::InvalidArgumentError("allocating 0 bytes");
    }
    if (bytes > std::numeric_limits<size_t>::max() - kAlignment) {
      return OutOfMemory(bytes);
    }
    int class_index = -1;
    size_t size;
    std::vector<uint32_t>* list = nullptr;
    if (bytes <= kLargeThreshold) {
      const SizeClass c = ClassFor(bytes);
      class_index = c.index;
      size = c.size;
      list = &class_free[class_index];
    } else {
      // Large blocks are reused only at exactly the same rounded size: a
      // best-fit search would not be O(1), and splitting would tie blocks
      // together for Trim. Large requests in a model repeat their sizes.
      size = RoundUp(bytes, kAlignment);
      auto it = large_free.find(size);
      if (it != large_free.end()) list = &it->second;
    }

    uint32_t index;
    if (list != nullptr && !list->empty()) {
      // Pinned or not: a pinned free block is safe to reuse on this stream
      // (work is serialized), and reusing it keeps graphs from growing the
      // footprint.
      index = list->back();
      RemoveFree(index);
    } else {
      absl::StatusOr<void*> ptr = source->Allocate(size, kAlignment);
      if (absl::IsResourceExhausted(ptr.status())) {
        Trim();
        ptr = source->Allocate(size, kAlignment);
        if (absl::IsResourceExhausted(ptr.status())) return OutOfMemory(bytes);
      }
      if (!ptr.ok()) {
        return absl::Status(
            ptr.status().code(),
            absl::StrCat("allocating ", bytes, " bytes on ", source->name(),
                         ": ", ptr.status().message()));
      }
      index = NewSlot();
      Block& b = blocks[index];
      b.ptr = *ptr;
      b.size = size;
      b.class_index = class_index;
      by_ptr.emplace(b.ptr, index);
      ++stats.underlying_allocations;
      stats.underlying_allocated_bytes += size;
      stats.reserved_bytes += size;
    }
    Block& b = blocks[index];
    b.state = State::kInUse;
    ++stats.allocations;
    stats.allocated_bytes += b.size;
    stats.in_use_bytes += b.size;
    if (stats.in_use_bytes > stats.peak_in_use_bytes) {
      stats.peak_in_use_bytes = stats.in_use_bytes;
    }
    if (capturing) Record(index);
    return b.ptr;
  }

  absl::Status OutOfMemory(size_t bytes) const {
    return absl::ResourceExhaustedError(absl::StrCat(
        "allocating ", bytes, " bytes on ", source->name(),
        ": out of memory (reserved ", stats.reserved_bytes, ", in use ",
        stats.in_use_bytes, ", pinned ", stats.pinned_bytes, ", free ",
        stats.reserved_bytes - stats.in_use_bytes, " bytes)"));
  }

  // The index of a live (in use) block, or InvalidArgument naming `ptr`.
  absl::StatusOr<uint32_t> LiveBlock(void* ptr, absl::string_view doing) const {
    auto it = by_ptr.find(ptr);
    if (it == by_ptr.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(doing, " ", PtrString(ptr),
                       ": not a block handed out by this allocator"));
    }
    if (blocks[it->second].state != State::kInUse) {
      return absl::InvalidArgumentError(absl::StrCat(
          doing, " ", PtrString(ptr), ": the block was already freed"));
    }
    return it->second;
  }
};

// ---------------------------------------------------------------------------
// PinLease

struct PinLease::State {
  PinnableBlockAllocator::Impl* impl = nullptr;
  std::vector<uint32_t> blocks;
};

PinLease::PinLease() = default;

PinLease::PinLease(PinLease&& other) noexcept
    : state_(std::move(other.state_)) {}

PinLease& PinLease::operator=(PinLease&& other) noexcept {
  if (this != &other) {
    Release();
    state_ = std::move(other.state_);
  }
  return *this;
}

PinLease::~PinLease() { Release(); }

size_t PinLease::block_count() const {
  return state_ == nullptr ? 0 : state_->blocks.size();
}

void PinLease::Release() {
  if (state_ == nullptr) return;
  PinnableBlockAllocator::Impl* impl = state_->impl;
  if (impl != nullptr) {
    for (uint32_t index : state_->blocks) impl->Unpin(index);
    impl->leases.erase(state_.get());
  }
  state_.reset();
}

// ---------------------------------------------------------------------------
// PinnableBlockAllocator

PinnableBlockAllocator::PinnableBlockAllocator(MemorySource* source)
    : impl_(std::make_unique<Impl>(source)) {}

PinnableBlockAllocator::~PinnableBlockAllocator() {
  assert(impl_->leases.empty() && "a PinLease outlived its allocator");
  // Without asserts, detach stray leases so their destructors do not touch
  // freed memory.
  for (PinLease::State* lease : impl_->leases) lease->impl = nullptr;
  for (const Impl::Block& b : impl_->blocks) {
    if (b.state != Impl::State::kEmptySlot) impl_->source->Free(b.ptr, b.size);
  }
}

absl::StatusOr<void*> PinnableBlockAllocator::Allocate(size_t bytes) {
  return impl_->Allocate(bytes);
}

absl::Status PinnableBlockAllocator::Free(void* ptr) {
  absl::StatusOr<uint32_t> index = impl_->LiveBlock(ptr, "freeing");
  if (!index.ok()) return index.status();
  impl_->stats.in_use_bytes -= impl_->blocks[*index].size;
  ++impl_->stats.frees;
  impl_->PushFree(*index);
  return absl::OkStatus();
}

absl::StatusOr<size_t> PinnableBlockAllocator::BlockSize(void* ptr) const {
  absl::StatusOr<uint32_t> index = impl_->LiveBlock(ptr, "sizing");
  if (!index.ok()) return index.status();
  return impl_->blocks[*index].size;
}

absl::Status PinnableBlockAllocator::BeginCapture() {
  if (impl_->capturing) {
    return absl::FailedPreconditionError(
        "BeginCapture: a capture is already open (captures do not nest)");
  }
  impl_->capturing = true;
  ++impl_->capture_id;
  impl_->recorded.clear();
  return absl::OkStatus();
}

absl::Status PinnableBlockAllocator::Reference(void* ptr) {
  if (!impl_->capturing) {
    return absl::FailedPreconditionError("Reference: no capture is open");
  }
  absl::StatusOr<uint32_t> index = impl_->LiveBlock(ptr, "referencing");
  if (!index.ok()) return index.status();
  impl_->Record(*index);
  return absl::OkStatus();
}

absl::StatusOr<PinLease> PinnableBlockAllocator::Commit() {
  if (!impl_->capturing) {
    return absl::FailedPreconditionError("Commit: no capture is open");
  }
  auto state = std::make_unique<PinLease::State>();
  state->impl = impl_.get();
  state->blocks = std::move(impl_->recorded);
  impl_->recorded.clear();
  impl_->capturing = false;
  for (uint32_t index : state->blocks) impl_->Pin(index);
  impl_->leases.insert(state.get());
  PinLease lease;
  lease.state_ = std::move(state);
  return lease;
}

absl::Status PinnableBlockAllocator::Cancel() {
  if (!impl_->capturing) {
    return absl::FailedPreconditionError("Cancel: no capture is open");
  }
  impl_->recorded.clear();
  impl_->capturing = false;
  return absl::OkStatus();
}

bool PinnableBlockAllocator::capturing() const { return impl_->capturing; }

size_t PinnableBlockAllocator::Trim() { return impl_->Trim(); }

AllocatorStats PinnableBlockAllocator::stats() const { return impl_->stats; }

std::string PinnableBlockAllocator::DebugString() const {
  const AllocatorStats& s = impl_->stats;
  return absl::StrCat(
      impl_->source->name(), ": ", s.allocations, " allocations (",
      s.allocated_bytes, " bytes), ", s.frees, " frees; reserved ",
      s.reserved_bytes, ", in use ", s.in_use_bytes, " (peak ",
      s.peak_in_use_bytes, "), pinned ", s.pinned_bytes, ", cached ",
      s.cached_blocks, " blocks; underlying ", s.underlying_allocations,
      " allocations (", s.underlying_allocated_bytes, " bytes), ",
      s.underlying_frees, " frees (", s.underlying_freed_bytes, " bytes)");
}

}  // namespace tessera
