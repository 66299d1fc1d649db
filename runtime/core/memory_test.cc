#include "runtime/core/memory.h"

#include <cstdint>
#include <map>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using Allocator = PinnableBlockAllocator;

void* MustAllocate(Allocator& a, size_t bytes) {
  absl::StatusOr<void*> ptr = a.Allocate(bytes);
  EXPECT_TRUE(ptr.ok()) << ptr.status();
  return ptr.ok() ? *ptr : nullptr;
}

PinLease MustCommit(Allocator& a) {
  absl::StatusOr<PinLease> lease = a.Commit();
  EXPECT_TRUE(lease.ok()) << lease.status();
  return lease.ok() ? std::move(lease).value() : PinLease();
}

// The block size the allocator must give, computed the slow way: the smallest
// class (2^k + i * 2^(k-2)) that fits, or the request rounded to 256 above 1
// MiB.
size_t ExpectedBlockSize(size_t bytes) {
  if (bytes > Allocator::kLargeThreshold) {
    return (bytes + Allocator::kAlignment - 1) / Allocator::kAlignment *
           Allocator::kAlignment;
  }
  for (size_t base = Allocator::kMinBlock;; base *= 2) {
    for (size_t i = 0; i < 4; ++i) {
      const size_t size = base + i * base / 4;
      if (size >= bytes) return size;
    }
  }
}

TEST(HostMemorySourceTest, CountsAndEnforcesCapacity) {
  HostMemorySource source(4096);
  absl::StatusOr<void*> a = source.Allocate(3000, 256);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*a) % 256, 0u);
  EXPECT_EQ(source.outstanding_bytes(), 3000u);
  absl::StatusOr<void*> b = source.Allocate(2000, 256);
  EXPECT_TRUE(absl::IsResourceExhausted(b.status())) << b.status();
  EXPECT_EQ(source.outstanding_bytes(), 3000u);
  source.Free(*a, 3000);
  EXPECT_EQ(source.outstanding_bytes(), 0u);
}

TEST(AllocatorTest, SizeClassesAndAlignment) {
  HostMemorySource source;
  Allocator a(&source);
  std::vector<void*> live;
  for (size_t bytes :
       {size_t{1}, size_t{512}, size_t{513}, size_t{700}, size_t{1025},
        size_t{5000}, size_t{65537}, size_t{1} << 20, (size_t{1} << 20) + 1,
        size_t{3000001}}) {
    void* ptr = MustAllocate(a, bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(ptr) % Allocator::kAlignment, 0u)
        << bytes;
    absl::StatusOr<size_t> size = a.BlockSize(ptr);
    ASSERT_TRUE(size.ok()) << size.status();
    EXPECT_EQ(*size, ExpectedBlockSize(bytes)) << bytes;
    EXPECT_GE(*size, bytes);
    live.push_back(ptr);
  }
  EXPECT_EQ(ExpectedBlockSize(513), 640u);
  EXPECT_EQ(ExpectedBlockSize(3000001), 3000064u);
  for (void* ptr : live) EXPECT_TRUE(a.Free(ptr).ok());
}

TEST(AllocatorTest, ReusesSizeClassBlockWhilePinned) {
  HostMemorySource source;
  Allocator a(&source);
  ASSERT_TRUE(a.BeginCapture().ok());
  void* p = MustAllocate(a, 1000);
  PinLease lease = MustCommit(a);
  EXPECT_EQ(lease.block_count(), 1u);
  ASSERT_TRUE(a.Free(p).ok());
  EXPECT_EQ(a.stats().pinned_bytes, 1024);
  EXPECT_EQ(a.stats().cached_blocks, 1);

  // Same class (1024): the free-but-pinned block comes back, no new memory.
  void* q = MustAllocate(a, 900);
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.stats().underlying_allocations, 1);
  EXPECT_EQ(a.stats().pinned_bytes, 1024);
  ASSERT_TRUE(a.Free(q).ok());
}

TEST(AllocatorTest, ReusesLargeBlockOfExactSizeWhilePinned) {
  HostMemorySource source;
  Allocator a(&source);
  const size_t large = 3 * Allocator::kLargeThreshold + 100;
  ASSERT_TRUE(a.BeginCapture().ok());
  void* p = MustAllocate(a, large);
  PinLease lease = MustCommit(a);
  ASSERT_TRUE(a.Free(p).ok());

  // Same rounded size: reused although pinned.
  void* q = MustAllocate(a, large + 50);
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.stats().underlying_allocations, 1);
  // A different large size is a new block (exact-size reuse only).
  void* r = MustAllocate(a, large + 1000);
  EXPECT_NE(r, p);
  EXPECT_EQ(a.stats().underlying_allocations, 2);
  ASSERT_TRUE(a.Free(q).ok());
  ASSERT_TRUE(a.Free(r).ok());
}

TEST(AllocatorTest, TrimKeepsPinnedBlocksUntilLeaseIsGone) {
  HostMemorySource source;
  Allocator a(&source);
  void* unpinned = MustAllocate(a, 4096);
  ASSERT_TRUE(a.BeginCapture().ok());
  void* pinned = MustAllocate(a, 2 * Allocator::kLargeThreshold);
  void* pinned_in_use = MustAllocate(a, 100);
  PinLease lease = MustCommit(a);
  ASSERT_TRUE(a.Free(unpinned).ok());
  ASSERT_TRUE(a.Free(pinned).ok());

  EXPECT_EQ(a.Trim(), 4096u);  // Only the unpinned free block.
  EXPECT_EQ(a.stats().reserved_bytes,
            static_cast<int64_t>(2 * Allocator::kLargeThreshold + 512));
  EXPECT_EQ(a.stats().cached_blocks, 1);

  lease.Release();
  lease.Release();  // Idempotent.
  EXPECT_EQ(a.stats().pinned_bytes, 0);
  EXPECT_EQ(a.Trim(), 2 * Allocator::kLargeThreshold);
  EXPECT_EQ(a.stats().reserved_bytes, 512);  // The in-use block stays.
  EXPECT_EQ(source.outstanding_bytes(), 512u);
  ASSERT_TRUE(a.Free(pinned_in_use).ok());
  EXPECT_EQ(a.Trim(), 512u);
  EXPECT_EQ(source.outstanding_bytes(), 0u);
}

// A graph plan whose constructor commits a lease into a member and then fails
// half-way: the lease must still release its pins when the member is destroyed.
struct FailingPlan {
  FailingPlan(Allocator& a, bool throw_error, absl::Status* status) {
    *status = a.BeginCapture();
    if (!status->ok()) return;
    buffer = MustAllocate(a, 8192);
    absl::StatusOr<PinLease> committed = a.Commit();
    if (!committed.ok()) {
      *status = committed.status();
      return;
    }
    lease = std::move(committed).value();
    if (throw_error) throw std::runtime_error("instantiating the graph failed");
    *status = absl::InternalError("instantiating the graph failed");
  }
  PinLease lease;
  void* buffer = nullptr;
};

TEST(AllocatorTest, LeaseReleasedWhenPlanConstructorThrows) {
  HostMemorySource source;
  Allocator a(&source);
  absl::Status status;
  EXPECT_THROW(FailingPlan(a, /*throw_error=*/true, &status),
               std::runtime_error);
  // The fully constructed member was destroyed during unwinding.
  EXPECT_EQ(a.stats().pinned_bytes, 0);
  EXPECT_FALSE(a.capturing());
  EXPECT_EQ(a.stats().in_use_bytes, 8192);
}

TEST(AllocatorTest, LeaseReleasedWhenPlanConstructorReturnsError) {
  HostMemorySource source;
  Allocator a(&source);
  absl::Status status;
  void* buffer = nullptr;
  {
    FailingPlan plan(a, /*throw_error=*/false, &status);
    buffer = plan.buffer;
    EXPECT_FALSE(status.ok());
    EXPECT_EQ(a.stats().pinned_bytes, 8192);
  }
  EXPECT_EQ(a.stats().pinned_bytes, 0);
  ASSERT_TRUE(a.Free(buffer).ok());
  EXPECT_EQ(a.Trim(), 8192u);
}

TEST(AllocatorTest, CancelRestoresCounts) {
  HostMemorySource source;
  Allocator a(&source);
  void* before = MustAllocate(a, 600);
  const AllocatorStats start = a.stats();
  ASSERT_TRUE(a.BeginCapture().ok());
  EXPECT_TRUE(a.capturing());
  ASSERT_TRUE(a.Reference(before).ok());
  void* during = MustAllocate(a, 600);
  ASSERT_TRUE(a.Free(during).ok());
  ASSERT_TRUE(a.Cancel().ok());
  EXPECT_FALSE(a.capturing());
  const AllocatorStats end = a.stats();
  EXPECT_EQ(end.pinned_bytes, 0);
  EXPECT_EQ(end.in_use_bytes, start.in_use_bytes);
  // Nothing pinned: both blocks can be trimmed once free.
  ASSERT_TRUE(a.Free(before).ok());
  EXPECT_EQ(a.Trim(), 2 * 640u);
}

TEST(AllocatorTest, CaptureCallsOutOfOrderFailPrecondition) {
  HostMemorySource source;
  Allocator a(&source);
  EXPECT_TRUE(absl::IsFailedPrecondition(a.Commit().status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(a.Cancel()));
  void* p = MustAllocate(a, 10);
  EXPECT_TRUE(absl::IsFailedPrecondition(a.Reference(p)));
  ASSERT_TRUE(a.BeginCapture().ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(a.BeginCapture()));
  EXPECT_TRUE(a.capturing());
  // Referenced twice and allocated in the capture: pinned once per lease.
  ASSERT_TRUE(a.Reference(p).ok());
  ASSERT_TRUE(a.Reference(p).ok());
  PinLease lease = MustCommit(a);
  EXPECT_EQ(lease.block_count(), 1u);
  EXPECT_EQ(a.stats().pinned_bytes, 512);
  EXPECT_TRUE(absl::IsFailedPrecondition(a.Commit().status()));

  // Two leases on one block: pinned until both are gone.
  ASSERT_TRUE(a.BeginCapture().ok());
  ASSERT_TRUE(a.Reference(p).ok());
  PinLease second = MustCommit(a);
  PinLease moved = std::move(lease);
  EXPECT_EQ(lease.block_count(), 0u);  // NOLINT(bugprone-use-after-move)
  moved = PinLease();
  EXPECT_EQ(a.stats().pinned_bytes, 512);
  second.Release();
  EXPECT_EQ(a.stats().pinned_bytes, 0);
  ASSERT_TRUE(a.Free(p).ok());
}

TEST(AllocatorTest, DoubleFreeAndForeignPointer) {
  HostMemorySource source;
  Allocator a(&source);
  void* p = MustAllocate(a, 2048);
  ASSERT_TRUE(a.Free(p).ok());
  const AllocatorStats before = a.stats();

  absl::Status twice = a.Free(p);
  EXPECT_TRUE(absl::IsInvalidArgument(twice)) << twice;
  EXPECT_NE(twice.message().find(absl::StrFormat("%p", p)),
            absl::string_view::npos)
      << twice;

  int local = 0;
  absl::Status foreign = a.Free(&local);
  EXPECT_TRUE(absl::IsInvalidArgument(foreign)) << foreign;
  EXPECT_NE(foreign.message().find(absl::StrFormat("%p", &local)),
            absl::string_view::npos)
      << foreign;
  EXPECT_TRUE(absl::IsInvalidArgument(a.BlockSize(&local).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(a.BlockSize(p).status()));
  ASSERT_TRUE(a.BeginCapture().ok());
  EXPECT_TRUE(absl::IsInvalidArgument(a.Reference(p)));
  ASSERT_TRUE(a.Cancel().ok());

  const AllocatorStats after = a.stats();
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
  EXPECT_EQ(after.cached_blocks, before.cached_blocks);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  // The block is still handed out exactly once.
  EXPECT_EQ(MustAllocate(a, 2048), p);
  EXPECT_EQ(a.stats().cached_blocks, 0);
}

TEST(AllocatorTest, ExhaustionTrimsAndRetries) {
  const size_t mib = size_t{1} << 20;
  HostMemorySource source(4 * mib);
  Allocator a(&source);
  // Fill the source with cached 1 MiB blocks, then ask for a different class.
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(MustAllocate(a, mib));
  for (void* p : blocks) ASSERT_TRUE(a.Free(p).ok());
  absl::StatusOr<void*> big = a.Allocate(3 * mib);
  ASSERT_TRUE(big.ok()) << big.status();
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.underlying_frees, 4);
  EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>(3 * mib));
  EXPECT_EQ(s.cached_blocks, 0);
  ASSERT_TRUE(a.Free(*big).ok());
}

TEST(AllocatorTest, ExhaustionWithPinnedBlocksIsAClearError) {
  const size_t mib = size_t{1} << 20;
  HostMemorySource source(4 * mib);
  Allocator a(&source);
  void* in_use = MustAllocate(a, mib);
  ASSERT_TRUE(a.BeginCapture().ok());
  void* pinned = MustAllocate(a, 2 * mib);
  PinLease lease = MustCommit(a);
  ASSERT_TRUE(a.Free(pinned).ok());
  void* unpinned = MustAllocate(a, 512 * 1024);
  ASSERT_TRUE(a.Free(unpinned).ok());

  absl::StatusOr<void*> big = a.Allocate(3 * mib);
  ASSERT_TRUE(absl::IsResourceExhausted(big.status())) << big.status();
  // The unpinned cached block was trimmed before giving up.
  const int64_t reserved = 3 * mib;
  EXPECT_EQ(big.status().message(),
            absl::StrCat("allocating ", 3 * mib,
                         " bytes on host: out of memory (reserved ", reserved,
                         ", in use ", mib, ", pinned ", 2 * mib, ", free ",
                         2 * mib, " bytes)"));
  EXPECT_EQ(a.stats().underlying_frees, 1);
  ASSERT_TRUE(a.Free(in_use).ok());
}

TEST(AllocatorTest, StatsArithmetic) {
  HostMemorySource source;
  Allocator a(&source);
  void* p = MustAllocate(a, 100);              // 512
  void* q = MustAllocate(a, 1500);             // 1536
  void* r = MustAllocate(a, 2 * 1048576 + 1);  // 2 MiB + 256
  AllocatorStats s = a.stats();
  const int64_t large = 2 * 1048576 + 256;
  EXPECT_EQ(s.underlying_allocations, 3);
  EXPECT_EQ(s.underlying_allocated_bytes, 512 + 1536 + large);
  EXPECT_EQ(s.reserved_bytes, 512 + 1536 + large);
  EXPECT_EQ(s.in_use_bytes, 512 + 1536 + large);
  EXPECT_EQ(s.peak_in_use_bytes, s.in_use_bytes);
  ASSERT_TRUE(a.Free(r).ok());
  ASSERT_TRUE(a.Free(q).ok());
  s = a.stats();
  EXPECT_EQ(s.in_use_bytes, 512);
  EXPECT_EQ(s.peak_in_use_bytes, 512 + 1536 + large);
  EXPECT_EQ(s.cached_blocks, 2);
  EXPECT_EQ(a.Trim(), static_cast<size_t>(1536 + large));
  s = a.stats();
  EXPECT_EQ(s.underlying_frees, 2);
  EXPECT_EQ(s.underlying_freed_bytes, 1536 + large);
  EXPECT_EQ(s.reserved_bytes,
            s.underlying_allocated_bytes - s.underlying_freed_bytes);
  EXPECT_EQ(s.cached_blocks, 0);
  EXPECT_EQ(source.outstanding_bytes(), 512u);
  EXPECT_NE(a.DebugString().find("in use 512"), std::string::npos)
      << a.DebugString();
  ASSERT_TRUE(a.Free(p).ok());
}

// allocations counts every handed-out block, cache hits included (a reused
// block is still an allocation of the code that asked), unlike
// underlying_allocations; a failed Free counts nothing.
TEST(AllocatorTest, AllocationCountersIncludeCacheHits) {
  HostMemorySource source;
  Allocator a(&source);
  void* p = MustAllocate(a, 100);  // 512
  ASSERT_TRUE(a.Free(p).ok());
  void* q = MustAllocate(a, 300);  // 512 again, from the cache.
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.underlying_allocations, 1);
  EXPECT_EQ(s.allocations, 2);
  EXPECT_EQ(s.allocated_bytes, 1024);
  EXPECT_EQ(s.frees, 1);
  int local = 0;
  EXPECT_FALSE(a.Free(&local).ok());
  EXPECT_FALSE(a.Allocate(0).ok());
  s = a.stats();
  EXPECT_EQ(s.allocations, 2);
  EXPECT_EQ(s.frees, 1);
  EXPECT_NE(a.DebugString().find("2 allocations (1024 bytes), 1 frees"),
            std::string::npos)
      << a.DebugString();
  ASSERT_TRUE(a.Free(q).ok());
  EXPECT_EQ(a.stats().frees, 2);
}

TEST(AllocatorTest, DestructorReturnsEverything) {
  HostMemorySource source;
  {
    Allocator a(&source);
    MustAllocate(a, 100);
    void* p = MustAllocate(a, 5 * 1048576);
    ASSERT_TRUE(a.Free(p).ok());
    EXPECT_GT(source.outstanding_bytes(), 0u);
  }
  EXPECT_EQ(source.outstanding_bytes(), 0u);
}

// ---------------------------------------------------------------------------
// Property test: random operations against a reference model.

struct ModelBlock {
  size_t size = 0;
  bool live = false;
  int pins = 0;
  bool recorded = false;  // By the open capture.
};

struct ModelLease {
  PinLease lease;
  std::vector<void*> blocks;
};

class Model {
 public:
  explicit Model(uint32_t seed)
      : rng_(seed), source_(kCapacity), allocator_(&source_) {}

  ~Model() {
    leases_.clear();  // Leases must go before the allocator.
  }

  void Run(int steps) {
    for (int step = 0; step < steps; ++step) {
      Step();
      Check();
      if (::testing::Test::HasFailure()) {
        ADD_FAILURE() << "failed at step " << step << " after: " << last_op_;
        return;
      }
    }
  }

 private:
  static constexpr size_t kCapacity = size_t{48} << 20;

  size_t RandomSize() {
    std::uniform_int_distribution<int> kind(0, 9);
    const int k = kind(rng_);
    if (k < 6) return std::uniform_int_distribution<size_t>(1, 16384)(rng_);
    if (k < 8) {
      return std::uniform_int_distribution<size_t>(16385, 1 << 20)(rng_);
    }
    // Few distinct large sizes, so exact-size reuse happens.
    const size_t base = std::uniform_int_distribution<size_t>(1, 4)(rng_);
    return (base << 20) + std::uniform_int_distribution<size_t>(1, 300)(rng_);
  }

  template <typename Map>
  typename Map::iterator Pick(Map& map) {
    auto it = map.begin();
    std::advance(
        it, std::uniform_int_distribution<size_t>(0, map.size() - 1)(rng_));
    return it;
  }

  std::vector<void*> LivePointers() const {
    std::vector<void*> live;
    for (const auto& [ptr, block] : blocks_) {
      if (block.live) live.push_back(ptr);
    }
    return live;
  }

  void* RandomLive() {
    std::vector<void*> live = LivePointers();
    if (live.empty()) return nullptr;
    return live[std::uniform_int_distribution<size_t>(0,
                                                      live.size() - 1)(rng_)];
  }

  size_t Reserved() const {
    size_t total = 0;
    for (const auto& [ptr, block] : blocks_) total += block.size;
    return total;
  }

  bool Trimmable(const ModelBlock& b) const {
    return !b.live && b.pins == 0 && !(capturing_ && b.recorded);
  }

  size_t ModelTrim() {
    size_t released = 0;
    for (auto it = blocks_.begin(); it != blocks_.end();) {
      if (Trimmable(it->second)) {
        released += it->second.size;
        it = blocks_.erase(it);
      } else {
        ++it;
      }
    }
    return released;
  }

  void DoAllocate() {
    const size_t bytes = RandomSize();
    const size_t size = ExpectedBlockSize(bytes);
    last_op_ = absl::StrCat("Allocate(", bytes, ")");
    bool cached = false;
    for (const auto& [ptr, block] : blocks_) {
      if (!block.live && block.size == size) cached = true;
    }
    const int64_t allocations = allocator_.stats().underlying_allocations;
    absl::StatusOr<void*> ptr = allocator_.Allocate(bytes);
    if (!cached && Reserved() + size > kCapacity) {
      ++exhaustions_;
      ModelTrim();
      if (Reserved() + size > kCapacity) {
        EXPECT_TRUE(absl::IsResourceExhausted(ptr.status())) << ptr.status();
        return;
      }
    }
    ASSERT_TRUE(ptr.ok()) << ptr.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*ptr) % Allocator::kAlignment, 0u);
    ModelBlock& block = blocks_[*ptr];
    if (cached) {
      // Must reuse a cached block of that size (pinned or not).
      EXPECT_EQ(block.size, size);
      EXPECT_FALSE(block.live);
      EXPECT_EQ(allocator_.stats().underlying_allocations, allocations);
      if (block.pins > 0) ++pinned_reuses_;
    } else {
      EXPECT_EQ(block.size, 0u) << "handed out a block it already held";
      EXPECT_EQ(allocator_.stats().underlying_allocations, allocations + 1);
      block.size = size;
      block.recorded = false;
    }
    block.live = true;
    if (capturing_) block.recorded = true;
    in_use_ += size;
  }

  void DoFree() {
    void* ptr = RandomLive();
    last_op_ = absl::StrCat("Free(", absl::StrFormat("%p", ptr), ")");
    if (ptr == nullptr) return;
    ASSERT_TRUE(allocator_.Free(ptr).ok());
    blocks_[ptr].live = false;
    in_use_ -= blocks_[ptr].size;
  }

  void DoBadFree() {
    // A free block (double free) or a pointer inside a block (foreign).
    last_op_ = "bad Free";
    for (const auto& [ptr, block] : blocks_) {
      void* bad = block.live ? static_cast<char*>(ptr) + 1 : ptr;
      EXPECT_TRUE(absl::IsInvalidArgument(allocator_.Free(bad)));
      return;
    }
  }

  void DoBeginCapture() {
    last_op_ = "BeginCapture";
    absl::Status status = allocator_.BeginCapture();
    if (capturing_) {
      EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
      return;
    }
    ASSERT_TRUE(status.ok()) << status;
    capturing_ = true;
    for (auto& [ptr, block] : blocks_) block.recorded = false;
  }

  void DoReference() {
    void* ptr = RandomLive();
    last_op_ = "Reference";
    if (ptr == nullptr) return;
    absl::Status status = allocator_.Reference(ptr);
    if (!capturing_) {
      EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
      return;
    }
    ASSERT_TRUE(status.ok()) << status;
    blocks_[ptr].recorded = true;
  }

  void DoCommit() {
    last_op_ = "Commit";
    absl::StatusOr<PinLease> lease = allocator_.Commit();
    if (!capturing_) {
      EXPECT_TRUE(absl::IsFailedPrecondition(lease.status()));
      return;
    }
    ASSERT_TRUE(lease.ok()) << lease.status();
    ModelLease model;
    for (auto& [ptr, block] : blocks_) {
      if (!block.recorded) continue;
      block.recorded = false;
      ++block.pins;
      model.blocks.push_back(ptr);
    }
    EXPECT_EQ(lease->block_count(), model.blocks.size());
    model.lease = std::move(lease).value();
    leases_.push_back(std::move(model));
    capturing_ = false;
  }

  void DoCancel() {
    last_op_ = "Cancel";
    absl::Status status = allocator_.Cancel();
    if (!capturing_) {
      EXPECT_TRUE(absl::IsFailedPrecondition(status));
      return;
    }
    ASSERT_TRUE(status.ok()) << status;
    for (auto& [ptr, block] : blocks_) block.recorded = false;
    capturing_ = false;
  }

  void DoDropLease() {
    last_op_ = "drop lease";
    if (leases_.empty()) return;
    const size_t i =
        std::uniform_int_distribution<size_t>(0, leases_.size() - 1)(rng_);
    for (void* ptr : leases_[i].blocks) --blocks_[ptr].pins;
    leases_[i].lease.Release();
    leases_.erase(leases_.begin() + i);
  }

  void DoTrim() {
    last_op_ = "Trim";
    const size_t expected = ModelTrim();
    EXPECT_EQ(allocator_.Trim(), expected);
  }

  void Step() {
    const int op = std::uniform_int_distribution<int>(0, 99)(rng_);
    if (op < 40) {
      DoAllocate();
    } else if (op < 70) {
      DoFree();
    } else if (op < 72) {
      DoBadFree();
    } else if (op < 78) {
      DoBeginCapture();
    } else if (op < 83) {
      DoReference();
    } else if (op < 87) {
      DoCommit();
    } else if (op < 89) {
      DoCancel();
    } else if (op < 95) {
      DoDropLease();
    } else {
      DoTrim();
    }
  }

  void Check() {
    const AllocatorStats s = allocator_.stats();
    size_t pinned = 0, cached = 0;
    for (const auto& [ptr, block] : blocks_) {
      if (block.pins > 0) pinned += block.size;
      if (!block.live) ++cached;
      if (block.live) {
        absl::StatusOr<size_t> size = allocator_.BlockSize(ptr);
        ASSERT_TRUE(size.ok()) << size.status();
        EXPECT_EQ(*size, block.size);
      }
    }
    EXPECT_EQ(s.in_use_bytes, static_cast<int64_t>(in_use_));
    EXPECT_EQ(s.pinned_bytes, static_cast<int64_t>(pinned));
    EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>(Reserved()));
    EXPECT_EQ(s.cached_blocks, static_cast<int64_t>(cached));
    EXPECT_EQ(s.reserved_bytes,
              s.underlying_allocated_bytes - s.underlying_freed_bytes);
    EXPECT_EQ(source_.outstanding_bytes(), Reserved());
    EXPECT_GE(s.peak_in_use_bytes, s.in_use_bytes);
    EXPECT_EQ(allocator_.capturing(), capturing_);
  }

  std::mt19937 rng_;
  HostMemorySource source_;
  Allocator allocator_;
  std::map<void*, ModelBlock> blocks_;  // Every block the allocator holds.
  std::vector<ModelLease> leases_;
  size_t in_use_ = 0;
  bool capturing_ = false;
  std::string last_op_;

 public:
  // How often the interesting paths ran, so the test can check it covers them.
  int exhaustions_ = 0;
  int pinned_reuses_ = 0;
};

TEST(AllocatorPropertyTest, FixedSeed) {
  Model model(12345);
  model.Run(5000);
  EXPECT_GT(model.exhaustions_, 0);
  EXPECT_GT(model.pinned_reuses_, 0);
}

TEST(AllocatorPropertyTest, RandomSeed) {
  const uint32_t seed = std::random_device()();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  Model(seed).Run(5000);
}

}  // namespace
}  // namespace tessera
