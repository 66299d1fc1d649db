#include "kernels/cpu/cpu_ops.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_sampling.h"
#include "kernels/cpu/cpu_threads.h"
#include "kernels/op_checks.h"
#include "kernels/op_timer.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

// Attention work (in multiply-adds) below which threads cost more than they
// save.
constexpr int64_t kParallelThreshold = 1 << 16;
// Multiply-adds below which a matrix product runs on one thread.
constexpr int64_t kBlasParallelThreshold = int64_t{1} << 23;
// A large matrix product runs as slices of output features (rows of the
// weight), each one OpenBLAS call on one thread. The slices depend only on
// the product's shape, never on the number of threads: a slice is computed
// by the same OpenBLAS call whichever thread runs it, so the result is bit
// for bit the same on any thread count (cpu_ops_test). (An OpenBLAS call over
// the whole product is not: on Zen cores its sgemm sums an output column in
// another order when the product is wider, measured with 0.3.21.) Every slice
// starts on a multiple of this...
constexpr int64_t kBlasSliceAlign = 64;
// ...and holds at least this many multiply-adds, so OpenBLAS never takes its
// small-matrix path for one (on AVX-512 cores, sgemm products of up to 10^6
// multiply-adds) and a thread the OS is slow to run holds up little.
constexpr int64_t kBlasSliceWork = int64_t{1} << 21;

// Who runs the threads of a large matrix product. OpenBLAS (the pthreads
// build Debian ships) keeps a thread pool of its own, which busy-waits after
// its work: next to the pool that runs attention, on a 2-core machine, the
// two fought over the second core (a decode step at a 1000-token context took
// 30 ms instead of 3). So by default every product runs as slices on one
// OpenBLAS thread each, spread over CpuThreadPool: one pool, as many threads
// as cores. A user who sets OPENBLAS_NUM_THREADS (or GOTO_NUM_THREADS)
// chooses OpenBLAS's threading instead, as before; OMP_NUM_THREADS sizes the
// one pool.
struct BlasThreading {
  bool openblas_threads = false;  // Large products use OpenBLAS's pool.
  int max_threads = 1;            // That pool's size, when it is used.
};

bool EnvSet(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

const BlasThreading& GetBlasThreading() {
  static const BlasThreading threading = [] {
    BlasThreading t;
    t.openblas_threads =
        EnvSet("OPENBLAS_NUM_THREADS") || EnvSet("GOTO_NUM_THREADS");
    t.max_threads = openblas_get_num_threads();
    // Set once, before any concurrent use (ranks run as threads in tests).
    if (!t.openblas_threads) openblas_set_num_threads(1);
    return t;
  }();
  return threading;
}

// out[:, begin:end] = x * weight[begin:end, :]^T on the calling thread's
// OpenBLAS call (out has row stride n).
void LinearSlice(const float* x, const float* weight, int64_t t, int64_t k,
                 int64_t n, int64_t begin, int64_t end, float* out) {
  if (t == 1) {
    // A single token is a matrix-vector product: gemv streams the weight once.
    cblas_sgemv(CblasRowMajor, CblasNoTrans, end - begin, k, 1.0f,
                weight + begin * k, k, x, 1, 0.0f, out + begin, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, end - begin, k,
                1.0f, x, k, weight + begin * k, k, 0.0f, out + begin, n);
  }
}

absl::Status CheckF32(absl::string_view op, absl::string_view name,
                      const TensorView& t) {
  return CheckDType(op, name, t, DType::kF32);
}

// GELU with the tanh approximation in f32, in the order of PyTorch's CPU
// kernel (gelu(approximate="tanh"), transformers' gelu_pytorch_tanh): kBeta
// = sqrt(2 / pi) rounded once to f32, x^3 as x * x * x.
inline float GeluTanh(float x) {
  constexpr float kBeta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5);
  constexpr float kKappa = 0.044715f;
  const float cube = x * x * x;
  const float inner = kBeta * (x + kKappa * cube);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

// ---------------------------------------------------------------------------
// Paged KV cache helpers.

// Dimensions of a KvCacheLayer.
struct CacheDims {
  int64_t num_slots = 0;
  int64_t num_kv_heads = 0;
  int64_t dim = 0;
  int64_t dim_v = 0;
  DType dtype = DType::kF32;  // f32, int8 or fp8 (the CPU's cache dtypes).
};

// The dimensions of a cache the public op has checked (op_checks.h).
CacheDims DimsOf(const KvCacheLayer& cache) {
  CacheDims dims;
  dims.num_slots = cache.k.shape()[0];
  dims.num_kv_heads = cache.k.shape()[1];
  dims.dim = cache.k.shape()[2];
  dims.dim_v = cache.v.shape()[2];
  dims.dtype = cache.k.dtype();
  return dims;
}

// The value of an OCP e4m3fn byte (1 sign, 4 exponent bits of bias 7, 3
// mantissa bits; 0x7f / 0xff NaN): Fp8E4M3ToF32's numbers, in a constant
// expression so that the table below is built at compile time. Every step is
// exact in f32 (powers of two and 4-bit integers).
constexpr float Fp8E4M3Value(int bits) {
  const int exponent = (bits >> 3) & 0xf;
  const int mantissa = bits & 0x7;
  float magnitude = 0.0f;
  if (exponent == 0xf && mantissa == 0x7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {  // Subnormal: mantissa * 2^-9.
    magnitude = static_cast<float>(mantissa) / 512.0f;
  } else {
    magnitude = static_cast<float>(8 + mantissa) / 8.0f;
    for (int e = exponent; e > 7; --e) magnitude *= 2.0f;
    for (int e = exponent; e < 7; ++e) magnitude *= 0.5f;
  }
  return (bits & 0x80) != 0 ? -magnitude : magnitude;
}

constexpr std::array<float, 256> MakeFp8E4M3Table() {
  std::array<float, 256> table{};
  for (int i = 0; i < 256; ++i) table[i] = Fp8E4M3Value(i);
  return table;
}

// Widening an fp8 cache element is one load from this table.
constexpr std::array<float, 256> kFp8E4M3Values = MakeFp8E4M3Table();
static_assert(kFp8E4M3Values[0x38] == 1.0f && kFp8E4M3Values[0x7e] == 448.0f &&
                  kFp8E4M3Values[0x01] == 1.0f / 512.0f &&
                  kFp8E4M3Values[0xfe] == -448.0f,
              "e4m3fn decoding");

// One fp8 cache element as the attention loops read it: the stored byte,
// widened exactly (its layer's per-head scale is applied to the sums).
struct Fp8E4M3 {
  uint8_t bits;
  explicit operator float() const { return kFp8E4M3Values[bits]; }
};
static_assert(sizeof(Fp8E4M3) == 1, "an fp8 cache element is one byte");

// Which scales a cache element type carries: int8 per (slot, head), fp8 per
// head (KvCacheLayer).
template <typename T>
constexpr bool kPerSlotScales = std::is_same_v<T, int8_t>;
template <typename T>
constexpr bool kPerHeadScales = std::is_same_v<T, Fp8E4M3>;

// Symmetric int8 quantization of one row: scale = max|x| / 127 (0 for an
// all-zero row), values rounded to nearest.
void QuantizeRow(const float* x, int64_t n, int8_t* q, float* scale) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (!(amax > 0.0f)) {
    *scale = 0.0f;
    std::fill_n(q, n, int8_t{0});
    return;
  }
  const float s = amax / 127.0f;
  *scale = s;
  for (int64_t i = 0; i < n; ++i) {
    const float r = std::nearbyint(x[i] / s);
    q[i] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, r)));
  }
}

// sum_i a[i] * b[i] in f32 with a fixed association (kLanes partial sums by
// index, then a fixed tree), so the result depends only on the values: not on
// addresses, threads or the rest of the batch.
template <typename T>
inline float Dot(const float* a, const T* b, int64_t n) {
  if (n < 16) {
    // Small heads (the demo's D = 8): four partial sums, same order always.
    float acc[4] = {};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      for (int j = 0; j < 4; ++j) {
        acc[j] += a[i + j] * static_cast<float>(b[i + j]);
      }
    }
    float tail = 0.0f;
    for (; i < n; ++i) tail += a[i] * static_cast<float>(b[i]);
    return ((acc[0] + acc[2]) + (acc[1] + acc[3])) + tail;
  }
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      acc[j] += a[i + j] * static_cast<float>(b[i + j]);
    }
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * static_cast<float>(b[i]);
  // Pairwise tree with constant trip counts (unrolled, kept in registers).
  for (int j = 0; j < 8; ++j) acc[j] += acc[j + 8];
  for (int j = 0; j < 4; ++j) acc[j] += acc[j + 4];
  return ((acc[0] + acc[2]) + (acc[1] + acc[3])) + tail;
}

// o[i] += p * b[i].
template <typename T>
inline void Axpy(float p, const T* b, int64_t n, float* o) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) o[i] += p * static_cast<float>(b[i]);
}

// Softmax weights of one (token, head): grows to the longest context once per
// thread, then steady-state steps allocate nothing.
float* ScratchWeights(int64_t n) {
  thread_local std::vector<float> weights;
  if (weights.size() < static_cast<size_t>(n)) weights.resize(n);
  return weights.data();
}

// What a paged-attention call runs.
struct PagedPlan {
  CacheDims cache;
  int64_t num_heads = 0;
  int64_t group = 1;
  int64_t row_begin = 0;  // q rows of the chosen sequences.
  int64_t row_end = 0;
  int64_t max_keys = 0;  // Most keys one query attends.
  int64_t work = 0;      // Multiply-adds.
  HostArrays meta;       // The metadata's arrays, read in place.
};

// The plan of a call whose arguments the public op has checked
// (CheckPagedAttention).
PagedPlan PlanPagedAttention(const PagedAttentionArgs& args) {
  PagedPlan plan;
  plan.meta = ReadHostArrays(*args.metadata);
  const HostArrays& m = plan.meta;
  plan.cache = DimsOf(args.cache);
  const CacheDims& c = plan.cache;
  plan.num_heads = args.q.shape()[1];
  plan.group = plan.num_heads / c.num_kv_heads;
  plan.row_begin = m.query_start_loc[args.first_seq];
  plan.row_end = m.query_start_loc[args.end_seq];
  int64_t keys_total = 0;
  const int64_t window = args.sliding_window;
  for (int32_t s = args.first_seq; s < args.end_seq; ++s) {
    const int64_t ctx = m.context_lens[s];
    const int64_t seq_len = m.seq_lens[s];
    for (int64_t p = ctx; p < seq_len; ++p) {
      keys_total += window > 0 ? std::min(p + 1, window) : p + 1;
    }
    if (seq_len == ctx) continue;
    plan.max_keys = std::max(plan.max_keys,
                             window > 0 ? std::min(seq_len, window) : seq_len);
  }
  plan.work = keys_total * plan.num_heads * (c.dim + c.dim_v);
  return plan;
}

// Asks for the cache lines of a row a few keys before it is read: rows are
// short and scattered over blocks, so the hardware prefetchers miss them.
inline void PrefetchRow(const void* row, int64_t bytes) {
  const char* p = static_cast<const char*>(row);
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i);
}
constexpr int64_t kPrefetchAhead = 8;

// Walks the slots of consecutive positions of one sequence without a
// division per position. Static layout: slot = table[0] * block_size + pos.
template <bool kStatic>
class SlotCursor {
 public:
  SlotCursor(const int32_t* table, int64_t block_size, int64_t pos)
      : table_(table), block_size_(block_size) {
    if (kStatic) {
      offset_ = int64_t{table[0]} * block_size + pos;
    } else {
      block_ = pos / block_size;
      offset_ = pos - block_ * block_size;
    }
  }
  int64_t slot() const {
    return kStatic ? offset_ : int64_t{table_[block_]} * block_size_ + offset_;
  }
  void Next() {
    ++offset_;
    if (!kStatic && offset_ == block_size_) {
      offset_ = 0;
      ++block_;
    }
  }

 private:
  const int32_t* table_;
  int64_t block_size_;
  int64_t block_ = 0;
  int64_t offset_ = 0;  // Static layout: the slot itself.
};

// Attention of one query row `row` (of sequence `seq`) and head `h`. The
// association of every sum is fixed by the key index alone, so the result is
// the same whatever batch, layout run or thread computes it.
template <typename T, bool kStatic>
void AttendOne(const PagedAttentionArgs& args, const PagedPlan& plan,
               int32_t seq, int64_t row, int64_t h, float* weights) {
  const HostArrays& m = plan.meta;
  const CacheDims& c = plan.cache;
  const int64_t dim = c.dim;
  const int64_t dim_v = c.dim_v;
  const int64_t kv_heads = c.num_kv_heads;
  const int64_t pos = m.context_lens[seq] + (row - m.query_start_loc[seq]);
  const int64_t first =
      args.sliding_window > 0
          ? std::max<int64_t>(0, pos - args.sliding_window + 1)
          : 0;
  const int64_t num_keys = pos - first + 1;
  const int64_t kvh = h / plan.group;
  const float* qv =
      args.q.data_as<const float>() + (row * plan.num_heads + h) * dim;
  const T* k = args.cache.k.data_as<const T>() + kvh * dim;
  const T* v = args.cache.v.data_as<const T>() + kvh * dim_v;
  const int64_t k_stride = kv_heads * dim;
  const int64_t v_stride = kv_heads * dim_v;
  const int64_t k_bytes = dim * static_cast<int64_t>(sizeof(T));
  const int64_t v_bytes = dim_v * static_cast<int64_t>(sizeof(T));
  constexpr bool kPerSlot = kPerSlotScales<T>;
  constexpr bool kPerHead = kPerHeadScales<T>;
  // int8: per-slot scales, stride kv_heads.
  const float* k_scale =
      kPerSlot ? args.cache.k_scale.data_as<const float>() + kvh : nullptr;
  const float* v_scale =
      kPerSlot ? args.cache.v_scale.data_as<const float>() + kvh : nullptr;
  // fp8: the layer's scales of this head, the same for every key: q·k is
  // scaled by k's (with the attention scale), each p·v term by v's.
  const float k_mul =
      kPerHead ? args.cache.k_scale.data_as<const float>()[kvh] * args.scale
               : args.scale;
  const float v_mul =
      kPerHead ? args.cache.v_scale.data_as<const float>()[kvh] : 1.0f;
  const int32_t* table = m.block_table(seq);
  const int64_t block_size = args.metadata->block_size;
  const float scale = args.scale;
  const float softcap = args.softcap;

  // Scores, then softmax with max subtraction.
  float max_score = -INFINITY;
  SlotCursor<kStatic> cursor(table, block_size, first);
  SlotCursor<kStatic> ahead(table, block_size, first);
  for (int64_t i = 0; i < std::min(kPrefetchAhead, num_keys);
       ++i, ahead.Next()) {
    PrefetchRow(k + ahead.slot() * k_stride, k_bytes);
  }
  for (int64_t i = 0; i < num_keys; ++i, cursor.Next()) {
    if (i + kPrefetchAhead < num_keys) {
      PrefetchRow(k + ahead.slot() * k_stride, k_bytes);
      ahead.Next();
    }
    const int64_t s = cursor.slot();
    float score = Dot(qv, k + s * k_stride, dim);
    if constexpr (kPerSlot) {
      score *= k_scale[s * kv_heads] * scale;
    } else {
      score *= k_mul;  // f32: the attention scale alone.
    }
    // transformers' order: the scaled score divided by the cap, tanh, times
    // the cap.
    if (softcap > 0.0f) score = std::tanh(score / softcap) * softcap;
    weights[i] = score;
    max_score = std::max(max_score, score);
  }
  float denom = 0.0f;
  for (int64_t i = 0; i < num_keys; ++i) {
    weights[i] = std::exp(weights[i] - max_score);
    denom += weights[i];
  }
  const float inv_denom = 1.0f / denom;
  auto prob = [&](int64_t i, int64_t s) {
    const float p = weights[i] * inv_denom;
    if constexpr (kPerSlot) {
      return p * v_scale[s * kv_heads];
    } else if constexpr (kPerHead) {
      return p * v_mul;
    } else {
      return p;
    }
  };

  // Weighted values, four keys per pass over the output row.
  float* o = args.out.data_as<float>() + (row * plan.num_heads + h) * dim_v;
  std::fill_n(o, dim_v, 0.0f);
  SlotCursor<kStatic> vcursor(table, block_size, first);
  SlotCursor<kStatic> vahead(table, block_size, first);
  int64_t prefetched = 0;
  for (; prefetched < std::min(kPrefetchAhead, num_keys);
       ++prefetched, vahead.Next()) {
    PrefetchRow(v + vahead.slot() * v_stride, v_bytes);
  }
  int64_t i = 0;
  for (; i + 4 <= num_keys; i += 4) {
    for (; prefetched < std::min(i + 4 + kPrefetchAhead, num_keys);
         ++prefetched, vahead.Next()) {
      PrefetchRow(v + vahead.slot() * v_stride, v_bytes);
    }
    int64_t s[4];
    for (int j = 0; j < 4; ++j, vcursor.Next()) s[j] = vcursor.slot();
    const float p0 = prob(i, s[0]), p1 = prob(i + 1, s[1]);
    const float p2 = prob(i + 2, s[2]), p3 = prob(i + 3, s[3]);
    const T* v0 = v + s[0] * v_stride;
    const T* v1 = v + s[1] * v_stride;
    const T* v2 = v + s[2] * v_stride;
    const T* v3 = v + s[3] * v_stride;
#pragma omp simd
    for (int64_t d = 0; d < dim_v; ++d) {
      o[d] +=
          (p0 * static_cast<float>(v0[d]) + p1 * static_cast<float>(v1[d])) +
          (p2 * static_cast<float>(v2[d]) + p3 * static_cast<float>(v3[d]));
    }
  }
  for (; i < num_keys; ++i, vcursor.Next()) {
    const int64_t s = vcursor.slot();
    Axpy(prob(i, s), v + s * v_stride, dim_v, o);
  }
}

// (row, head) pairs handed out in chunks: long causal rows and short ones mix
// in a batch, so static shares would leave threads idle.
constexpr int kAttentionChunk = 4;

// Runs every (row, head) of the plan. Each pair is computed by one thread in
// a fixed order, so its result does not depend on the batch or the threads.
template <typename T, bool kStatic>
void RunPagedAttention(const PagedAttentionArgs& args, const PagedPlan& plan,
                       bool one_row_per_seq, CpuThreadPool* pool) {
  const int32_t* starts = plan.meta.query_start_loc.data();
  const int64_t heads = plan.num_heads;
  const int64_t items = (plan.row_end - plan.row_begin) * heads;
  auto attend = [&](int64_t item, float* weights) {
    const int64_t row = plan.row_begin + item / heads;
    const int64_t h = item % heads;
    // The sequence owning `row`: the last one starting at or before it.
    const int32_t seq =
        one_row_per_seq
            ? static_cast<int32_t>(args.first_seq + (row - plan.row_begin))
            : static_cast<int32_t>(std::upper_bound(starts + args.first_seq + 1,
                                                    starts + args.end_seq + 1,
                                                    row) -
                                   (starts + 1));
    AttendOne<T, kStatic>(args, plan, seq, row, h, weights);
  };
  if (plan.work <= kParallelThreshold) {
    // Small work stays on the calling thread: even waking a spinning worker
    // costs more.
    float* weights = ScratchWeights(plan.max_keys);
    for (int64_t item = 0; item < items; ++item) attend(item, weights);
    return;
  }
  pool->ParallelFor(
      (items + kAttentionChunk - 1) / kAttentionChunk, [&](int64_t chunk) {
        float* weights = ScratchWeights(plan.max_keys);
        const int64_t end = std::min(items, (chunk + 1) * kAttentionChunk);
        for (int64_t item = chunk * kAttentionChunk; item < end; ++item) {
          attend(item, weights);
        }
      });
}

template <bool kStatic>
void DispatchPagedAttention(const PagedAttentionArgs& args,
                            const PagedPlan& plan, bool one_row_per_seq,
                            CpuThreadPool* pool) {
  switch (plan.cache.dtype) {
    case DType::kI8:
      RunPagedAttention<int8_t, kStatic>(args, plan, one_row_per_seq, pool);
      return;
    case DType::kF8E4M3:
      RunPagedAttention<Fp8E4M3, kStatic>(args, plan, one_row_per_seq, pool);
      return;
    default:  // f32: the checks admit nothing else.
      RunPagedAttention<float, kStatic>(args, plan, one_row_per_seq, pool);
      return;
  }
}

}  // namespace

namespace {
constexpr DType kWeightDTypes[] = {DType::kF32};
constexpr DType kCacheDTypes[] = {DType::kF32, DType::kI8, DType::kF8E4M3};
}  // namespace

CpuOps::CpuOps() : CpuOps(&CpuThreadPool::Default()) {}

CpuOps::CpuOps(CpuThreadPool* pool)
    : Ops(OpSupport{kWeightDTypes, kCacheDTypes}), pool_(pool) {}

// A step array read in place (this backend's memory is host memory).
template <typename T>
absl::Span<const T> HostArray(const TensorView& t) {
  return absl::MakeConstSpan(t.data_as<const T>(),
                             static_cast<size_t>(t.numel()));
}

absl::StatusOr<std::unique_ptr<UploadBuffer>> CpuOps::NewUploadBuffer(
    size_t bytes) {
  return NewHostUploadBuffer(bytes);
}

absl::StatusOr<std::unique_ptr<OpTimer>> CpuOps::NewOpTimer() {
  return std::make_unique<WallClockOpTimer>();
}

absl::Status CpuOps::DoEmbedding(const TensorView& table,
                                 const TensorView& ids_view,
                                 const TensorView& out) {
  const absl::Span<const int32_t> ids = HostArray<int32_t>(ids_view);
  const int64_t hidden = table.shape()[1];
  for (size_t t = 0; t < ids.size(); ++t) {
    std::copy_n(table.data_as<const float>() + ids[t] * hidden, hidden,
                out.data_as<float>() + t * hidden);
  }
  return absl::OkStatus();
}

absl::Status CpuOps::DoEmbeddingShard(const TensorView& table,
                                      const TensorView& ids_view,
                                      int64_t first_id, const TensorView& out) {
  const absl::Span<const int32_t> ids = HostArray<int32_t>(ids_view);
  const int64_t rows = table.shape()[0];
  const int64_t hidden = table.shape()[1];
  for (size_t t = 0; t < ids.size(); ++t) {
    float* row = out.data_as<float>() + t * hidden;
    const int64_t local = ids[t] - first_id;
    if (local >= 0 && local < rows) {
      std::copy_n(table.data_as<const float>() + local * hidden, hidden, row);
    } else {
      std::fill_n(row, hidden, 0.0f);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> CpuOps::Upload(const TensorView& host, DType dtype) {
  if (host.dtype() != DType::kF32 && host.dtype() != DType::kBF16 &&
      host.dtype() != DType::kF16 && host.dtype() != DType::kF8E4M3) {
    return absl::InvalidArgumentError(
        absl::StrCat("Upload: host tensor is ", DTypeName(host.dtype()),
                     ", expected f32, bf16, f16 or f8_e4m3"));
  }
  if (dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CPU backend computes in f32, not ", DTypeName(dtype)));
  }
  ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kF32, host.shape()));
  if (host.numel() == 0) return t;
  if (host.dtype() == DType::kF32) {
    std::memcpy(t.data(), host.data(), host.nbytes());
    return t;
  }
  // Widened straight into the tensor: no second host copy.
  RETURN_IF_ERROR(ConvertToF32(host.dtype(), host.data(),
                               static_cast<size_t>(host.numel()),
                               t.data_as<float>()));
  return t;
}

absl::Status CpuOps::DoConcatShards(const TensorView& gathered, int64_t shards,
                                    const TensorView& out) {
  const int64_t n = out.shape()[0], v = out.shape()[1];
  const int64_t vp = gathered.shape()[1];
  const float* g = gathered.data_as<const float>();
  float* o = out.data_as<float>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < shards && r * vp < v; ++r) {
      std::copy_n(g + (r * n + i) * vp, std::min(vp, v - r * vp),
                  o + i * v + r * vp);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuOps::DoGatherRows(const TensorView& src,
                                  const TensorView& rows_view,
                                  const TensorView& dst) {
  const absl::Span<const int32_t> rows = HostArray<int32_t>(rows_view);
  const int64_t n = src.shape()[1];
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy_n(src.data_as<const float>() + rows[i] * n, n,
                dst.data_as<float>() + static_cast<int64_t>(i) * n);
  }
  return absl::OkStatus();
}

absl::Status CpuOps::CopyToHost(const TensorView& src, void* dst) {
  if (src.numel() > 0) std::memcpy(dst, src.data(), src.nbytes());
  return absl::OkStatus();
}

absl::Status CpuOps::DoRmsNorm(const TensorView& x, const TensorView& weight,
                               float eps, const TensorView& out) {
  const int64_t n = weight.shape()[0];
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  const float* w = weight.data_as<const float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x.data_as<const float>() + r * n;
    float* o = out.data_as<float>() + r * n;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < n; ++i)
      sum_sq += static_cast<double>(in[i]) * in[i];
    const float inv_rms =
        1.0f /
        std::sqrt(static_cast<float>(sum_sq / static_cast<double>(n)) + eps);
    for (int64_t i = 0; i < n; ++i) o[i] = (in[i] * inv_rms) * w[i];
  }
  return absl::OkStatus();
}

absl::Status CpuOps::DoAdd(const TensorView& a, const TensorView& b,
                           const TensorView& out) {
  const float* pa = a.data_as<const float>();
  const float* pb = b.data_as<const float>();
  float* po = out.data_as<float>();
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + pb[i];
  return absl::OkStatus();
}

absl::Status CpuOps::DoLinear(const TensorView& x, const WeightView& w,
                              const TensorView* bias, const TensorView& out) {
  const TensorView& weight = w.data;
  const int64_t t = x.shape()[0];
  const int64_t k = x.shape()[1];
  const int64_t n = weight.shape()[0];
  if (t == 0 || n == 0) return absl::OkStatus();
  // Waking threads costs more than small products take (measured on the demo
  // model: 128-token prefill 10x slower with 2 threads), so they only run for
  // large ones.
  const bool large = t * n * k >= kBlasParallelThreshold;
  const BlasThreading& threading = GetBlasThreading();
  const float* xp = x.data_as<const float>();
  const float* wp = weight.data_as<const float>();
  float* o = out.data_as<float>();
  if (threading.openblas_threads) {
    openblas_set_num_threads(large ? threading.max_threads : 1);
    LinearSlice(xp, wp, t, k, n, 0, n, o);
  } else {
    // Slices of whole 64-row blocks (the last one also takes the rest), at
    // least min_blocks each, as even as they can be.
    const int64_t blocks = n / kBlasSliceAlign;
    const int64_t min_blocks = (kBlasSliceWork + t * k * kBlasSliceAlign - 1) /
                               (t * k * kBlasSliceAlign);
    const int64_t slices =
        large ? std::max<int64_t>(1, blocks / min_blocks) : 1;
    pool_->ParallelFor(slices, [&](int64_t i) {
      const int64_t begin = i * blocks / slices * kBlasSliceAlign;
      const int64_t end =
          i + 1 == slices ? n : (i + 1) * blocks / slices * kBlasSliceAlign;
      LinearSlice(xp, wp, t, k, n, begin, end, o);
    });
  }
  if (bias != nullptr) {
    const float* b = bias->data_as<const float>();
    for (int64_t r = 0; r < t; ++r) {
      for (int64_t c = 0; c < n; ++c) o[r * n + c] += b[c];
    }
  }
  return absl::OkStatus();
}

namespace {
void RotateHeads(const TensorView& x, absl::Span<const int32_t> positions,
                 absl::Span<const float* const> freq, int64_t half,
                 float scale);
}  // namespace

absl::Status CpuOps::DoRope(const TensorView& x,
                            const TensorView& positions_view,
                            const TensorView& inv_freq) {
  // Every token rotates by the one table, over the whole head, unscaled.
  const std::vector<const float*> freq(static_cast<size_t>(x.shape()[0]),
                                       inv_freq.data_as<const float>());
  RotateHeads(x, HostArray<int32_t>(positions_view), freq, x.shape()[2] / 2,
              1.0f);
  return absl::OkStatus();
}

absl::Status CpuOps::DoBiasAdd(const TensorView& x, const TensorView& bias) {
  const int64_t n = x.shape()[1];
  const float* b = bias.data_as<const float>();
  for (int64_t r = 0; r < x.shape()[0]; ++r) {
    float* row = x.data_as<float>() + r * n;
    for (int64_t i = 0; i < n; ++i) row[i] += b[i];
  }
  return absl::OkStatus();
}

absl::Status CpuOps::DoScale(const TensorView& x, float factor) {
  float* p = x.data_as<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) p[i] *= factor;
  return absl::OkStatus();
}

absl::Status CpuOps::DoSoftcap(const TensorView& x, float cap) {
  float* p = x.data_as<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) p[i] = std::tanh(p[i] / cap) * cap;
  return absl::OkStatus();
}

absl::Status CpuOps::DoSiluMul(const TensorView& gate, const TensorView& up,
                               const TensorView& out) {
  const float* g = gate.data_as<const float>();
  const float* u = up.data_as<const float>();
  float* o = out.data_as<float>();
  const int64_t n = gate.numel();
  for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  return absl::OkStatus();
}

namespace {

// e4m3 bytes of x[i] / scale (F32ToFp8E4M3: round to nearest even,
// saturating at ±448): an fp8 cache row under its head's fixed scale.
void QuantizeRowFp8(const float* x, int64_t n, float scale, uint8_t* q) {
  for (int64_t i = 0; i < n; ++i) q[i] = F32ToFp8E4M3(x[i] / scale);
}

// Writes token t's k and v rows (k_row = kv_heads * D, v_row = kv_heads * Dv
// floats each) to slot_mapping[t], quantizing for an int8 or fp8 cache; a
// negative slot (a padded token) is skipped.
void StoreRows(const float* kin, const float* vin,
               absl::Span<const int64_t> slot_mapping,
               const KvCacheLayer& cache) {
  const CacheDims c = DimsOf(cache);
  const int64_t tokens = static_cast<int64_t>(slot_mapping.size());
  const int64_t k_row = c.num_kv_heads * c.dim;
  const int64_t v_row = c.num_kv_heads * c.dim_v;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    if (c.dtype == DType::kF32) {
      std::copy_n(kin + t * k_row, k_row,
                  cache.k.data_as<float>() + slot * k_row);
      std::copy_n(vin + t * v_row, v_row,
                  cache.v.data_as<float>() + slot * v_row);
      continue;
    }
    if (c.dtype == DType::kF8E4M3) {
      const float* k_scale = cache.k_scale.data_as<const float>();
      const float* v_scale = cache.v_scale.data_as<const float>();
      for (int64_t h = 0; h < c.num_kv_heads; ++h) {
        QuantizeRowFp8(kin + t * k_row + h * c.dim, c.dim, k_scale[h],
                       cache.k.data_as<uint8_t>() + slot * k_row + h * c.dim);
        QuantizeRowFp8(vin + t * v_row + h * c.dim_v, c.dim_v, v_scale[h],
                       cache.v.data_as<uint8_t>() + slot * v_row + h * c.dim_v);
      }
      continue;
    }
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      const int64_t scale_index = slot * c.num_kv_heads + h;
      QuantizeRow(kin + t * k_row + h * c.dim, c.dim,
                  cache.k.data_as<int8_t>() + slot * k_row + h * c.dim,
                  cache.k_scale.data_as<float>() + scale_index);
      QuantizeRow(vin + t * v_row + h * c.dim_v, c.dim_v,
                  cache.v.data_as<int8_t>() + slot * v_row + h * c.dim_v,
                  cache.v_scale.data_as<float>() + scale_index);
    }
  }
}

// The dynamic NTK frequencies for a sequence of `length` positions
// (RopeOptions::kDynamicNtk), each operation in f32 as transformers computes
// them from a tensor length: x = factor * L / original_max_len -
// (factor - 1); b = base * x^exponent; out[i] = 1 / b^(2i / R).
void DynamicNtkInvFreq(const RopeOptions& r, int32_t length, int64_t half,
                       float* out) {
  float x = r.factor * static_cast<float>(length);
  x = x / static_cast<float>(r.original_max_len);
  x = x - r.factor_minus_one;
  const float base = r.base * std::pow(x, r.exponent);
  const float rotary = static_cast<float>(2 * half);
  for (int64_t i = 0; i < half; ++i) {
    out[i] = 1.0f / std::pow(base, static_cast<float>(2 * i) / rotary);
  }
}

// Each token's inverse frequencies for a QkvRopeStore step: inv_freq, or,
// with length scaling, the table its sequence's length after the step
// selects (LongRoPE) or makes (dynamic NTK, kept in `tables`). Rows beyond
// the metadata's sequences keep inv_freq.
std::vector<const float*> TokenInvFreq(
    const QkvRopeStoreArgs& a, std::vector<std::vector<float>>* tables) {
  const int64_t tokens = a.q_out.shape()[0];
  const float* base = a.inv_freq.data_as<const float>();
  std::vector<const float*> freq(static_cast<size_t>(tokens), base);
  const RopeOptions& r = a.rope;
  if (r.length_scaling == RopeLengthScaling::kNone) return freq;
  const AttentionMetadata& m = *a.metadata;
  const absl::Span<const int32_t> starts =
      HostArray<int32_t>(m.query_start_loc);
  const absl::Span<const int32_t> lens = HostArray<int32_t>(m.seq_lens);
  const int64_t half = a.inv_freq.shape()[0];
  tables->assign(static_cast<size_t>(m.num_seqs), {});
  for (int32_t s = 0; s < m.num_seqs; ++s) {
    const int32_t length = lens[s];
    if (length <= r.original_max_len) continue;
    const float* table = nullptr;
    if (r.length_scaling == RopeLengthScaling::kLongRope) {
      table = r.long_inv_freq.data_as<const float>();
    } else {
      std::vector<float>& own = (*tables)[s];
      own.resize(static_cast<size_t>(half));
      DynamicNtkInvFreq(r, length, half, own.data());
      table = own.data();
    }
    // The step's arrays were checked when packed; clamp regardless.
    const int64_t begin = std::clamp<int64_t>(starts[s], 0, tokens);
    const int64_t end = std::clamp<int64_t>(starts[s + 1], begin, tokens);
    for (int64_t t = begin; t < end; ++t) freq[t] = table;
  }
  return freq;
}

// Rope ("rotate half") over dims [0, 2 * half) of each head of x [tokens,
// heads, dim], token t with freq[t]; cos and sin times `scale`
// (transformers' attention_scaling). DoRope is it with one table, half =
// dim / 2 and scale = 1.
void RotateHeads(const TensorView& x, absl::Span<const int32_t> positions,
                 absl::Span<const float* const> freq, int64_t half,
                 float scale) {
  const int64_t tokens = x.shape()[0];
  const int64_t heads = x.shape()[1];
  const int64_t dim = x.shape()[2];
  std::vector<float> cos_table(half), sin_table(half);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      // As transformers: angle = float(position) * inv_freq in f32, then
      // cos(angle) * attention_scaling.
      const float angle = static_cast<float>(positions[t]) * freq[t][i];
      cos_table[i] = std::cos(angle);
      sin_table[i] = std::sin(angle);
      if (scale != 1.0f) {
        cos_table[i] *= scale;
        sin_table[i] *= scale;
      }
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x.data_as<float>() + (t * heads + h) * dim;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i];
        const float b = v[i + half];
        v[i] = a * cos_table[i] - b * sin_table[i];
        v[i + half] = b * cos_table[i] + a * sin_table[i];
      }
    }
  }
}

}  // namespace

absl::Status CpuOps::DoStoreKvCache(const TensorView& k, const TensorView& v,
                                    const TensorView& slots_view,
                                    const KvCacheLayer& cache) {
  StoreRows(k.data_as<const float>(), v.data_as<const float>(),
            HostArray<int64_t>(slots_view), cache);
  return absl::OkStatus();
}

absl::Status CpuOps::DoGatedActivation(GatedActivationKind kind,
                                       const TensorView& gate_up,
                                       const TensorView& out) {
  const int64_t rows = out.shape()[0];
  const int64_t inter = out.shape()[1];
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up.data_as<const float>() + r * 2 * inter;
    const float* u = g + inter;
    float* o = out.data_as<float>() + r * inter;
    switch (kind) {
      case GatedActivationKind::kSilu:
        // SiluMul's expression, so the fused MLP computes the same bits.
        for (int64_t i = 0; i < inter; ++i) {
          o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
        }
        break;
      case GatedActivationKind::kGeluTanh:
        for (int64_t i = 0; i < inter; ++i) o[i] = GeluTanh(g[i]) * u[i];
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status CpuOps::DoQkvRopeStore(const QkvRopeStoreArgs& a) {
  // The unfused ops in sequence over dense copies of the q, k and v columns:
  // the same bits as projecting q, k, v separately.
  const int64_t tokens = a.q_out.shape()[0];
  const int64_t heads = a.q_out.shape()[1];
  const int64_t dim = a.q_out.shape()[2];
  const int64_t kv_heads = a.cache.k.shape()[1];
  const int64_t q_row = heads * dim, kv_row = kv_heads * dim;
  const int64_t row = q_row + 2 * kv_row;
  thread_local std::vector<float> kv_scratch;
  const size_t need = static_cast<size_t>(2 * tokens * kv_row);
  if (kv_scratch.size() < need) kv_scratch.resize(need);
  float* k = kv_scratch.data();
  float* v = k + tokens * kv_row;
  const float* in = a.qkv.data_as<const float>();
  float* q = a.q_out.data_as<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    std::copy_n(in + t * row, q_row, q + t * q_row);
    std::copy_n(in + t * row + q_row, kv_row, k + t * kv_row);
    std::copy_n(in + t * row + q_row + kv_row, kv_row, v + t * kv_row);
  }
  const TensorView k_view(k, DType::kF32, {tokens, kv_heads, dim});
  if (a.q_norm != nullptr) {
    RETURN_IF_ERROR(DoRmsNorm(a.q_out, *a.q_norm, a.eps, a.q_out));
  }
  if (a.k_norm != nullptr) {
    RETURN_IF_ERROR(DoRmsNorm(k_view, *a.k_norm, a.eps, k_view));
  }
  std::vector<std::vector<float>> tables;
  const std::vector<const float*> freq = TokenInvFreq(a, &tables);
  const absl::Span<const int32_t> positions = HostArray<int32_t>(a.positions);
  const int64_t half = a.inv_freq.shape()[0];
  RotateHeads(a.q_out, positions, freq, half, a.rope.cos_sin_scale);
  RotateHeads(k_view, positions, freq, half, a.rope.cos_sin_scale);
  StoreRows(k, v, HostArray<int64_t>(a.slot_mapping), a.cache);
  return absl::OkStatus();
}

absl::Status CpuOps::DoPrefillAttention(const PagedAttentionArgs& args) {
  DispatchPagedAttention</*kStatic=*/false>(args, PlanPagedAttention(args),
                                            /*one_row_per_seq=*/false, pool_);
  return absl::OkStatus();
}

absl::Status CpuOps::DoDecodeAttention(const PagedAttentionArgs& args) {
  DispatchPagedAttention</*kStatic=*/false>(args, PlanPagedAttention(args),
                                            /*one_row_per_seq=*/true, pool_);
  return absl::OkStatus();
}

absl::Status CpuOps::DoStaticAttention(const PagedAttentionArgs& args) {
  DispatchPagedAttention</*kStatic=*/true>(args, PlanPagedAttention(args),
                                           /*one_row_per_seq=*/false, pool_);
  return absl::OkStatus();
}

absl::Status CpuOps::DoSample(const TensorView& logits,
                              absl::Span<const SampleRow> rows,
                              std::vector<SampleResult>* out) {
  thread_local CpuSampleScratch scratch;
  const int64_t vocab = logits.shape()[1];
  for (size_t i = 0; i < rows.size(); ++i) {
    const absl::Span<const float> row(
        logits.data_as<const float>() + static_cast<int64_t>(i) * vocab, vocab);
    SampleResult& result = (*out)[i];
    result.token = CpuSampleToken(row, rows[i], &scratch);
    CpuLogprobs(row, rows[i].top_logprobs, &scratch, &result);
  }
  return absl::OkStatus();
}

}  // namespace tessera

namespace tessera {
namespace {

// Whether (value a, id ia) ranks before (b, ib) in MoeRoute's order:
// larger probability first, NaN above every number, ties by the lower id.
bool RanksBefore(float a, int32_t ia, float b, int32_t ib) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return ia < ib;
}

}  // namespace

absl::Status CpuOps::DoMoeRoute(const TensorView& logits, bool renormalize,
                                const TensorView& topk_ids,
                                const TensorView& topk_weights) {
  const int64_t tokens = logits.shape()[0], experts = logits.shape()[1];
  const int64_t k = topk_ids.shape()[1];
  std::vector<float> probs(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits.data_as<const float>() + t * experts;
    // softmax in f32: exp(l - max) / sum, the sum in expert order.
    float max = -INFINITY;
    for (int64_t e = 0; e < experts; ++e) max = std::max(max, l[e]);
    float sum = 0.0f;
    for (int64_t e = 0; e < experts; ++e) {
      probs[e] = std::exp(l[e] - max);
      sum += probs[e];
    }
    for (int64_t e = 0; e < experts; ++e) probs[e] = probs[e] / sum;
    int32_t* ids = topk_ids.data_as<int32_t>() + t * k;
    float* w = topk_weights.data_as<float>() + t * k;
    // Pick j is the best of the experts that rank after pick j - 1 (the
    // order is total, so no expert is picked twice).
    for (int64_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int64_t e = 0; e < experts; ++e) {
        const int32_t id = static_cast<int32_t>(e);
        if (j > 0 && !RanksBefore(probs[ids[j - 1]], ids[j - 1], probs[e], id))
          continue;
        if (best < 0 || RanksBefore(probs[e], id, probs[best], best)) best = id;
      }
      ids[j] = best;
      w[j] = probs[best];
    }
    if (renormalize) {
      float total = 0.0f;
      for (int64_t j = 0; j < k; ++j) total += w[j];
      for (int64_t j = 0; j < k; ++j) w[j] = w[j] / total;
    }
  }
  return absl::OkStatus();
}

absl::Status CpuOps::DoMoeExperts(const MoeExpertsArgs& a) {
  const int64_t tokens = a.x.shape()[0], hidden = a.x.shape()[1];
  const int64_t k = a.topk_ids.shape()[1];
  const int64_t experts = a.gate_up.data.shape()[0];
  const int64_t inter = a.gate_up.data.shape()[1] / 2;
  const int64_t rows = tokens * k;
  // The scratch (Ops::MoeExpertsScratchBytes): xs [T, H], gate_up [T, 2I],
  // act [T, I], y [T * k, H] (f32), then order [T * k], position [T * k],
  // offsets [E + 1] (int32).
  float* xs = a.scratch.data_as<float>();
  float* gate_up = xs + tokens * hidden;
  float* act = gate_up + tokens * 2 * inter;
  float* y = act + tokens * inter;
  int32_t* order = reinterpret_cast<int32_t*>(y + rows * hidden);
  int32_t* position = order + rows;
  int32_t* offsets = position + rows;
  const int32_t* ids = a.topk_ids.data_as<const int32_t>();
  const float* weights = a.topk_weights.data_as<const float>();
  const float* x = a.x.data_as<const float>();
  // Routed rows (token t's j-th choice is row t * k + j) sorted by expert,
  // in token order within one: a counting sort.
  auto local = [&](int64_t r) -> int64_t {
    const int64_t e = static_cast<int64_t>(ids[r]) - a.first_expert;
    return e >= 0 && e < experts ? e : -1;
  };
  std::fill_n(offsets, experts + 1, 0);
  for (int64_t r = 0; r < rows; ++r) {
    if (const int64_t e = local(r); e >= 0) ++offsets[e + 1];
  }
  for (int64_t e = 0; e < experts; ++e) offsets[e + 1] += offsets[e];
  {
    std::vector<int32_t> cursor(offsets, offsets + experts);
    for (int64_t r = 0; r < rows; ++r) {
      position[r] = -1;
      if (const int64_t e = local(r); e >= 0) {
        position[r] = cursor[e];
        order[cursor[e]++] = static_cast<int32_t>(r);
      }
    }
  }
  const float* w_gate_up = a.gate_up.data.data_as<const float>();
  const float* w_down = a.down.data.data_as<const float>();
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = order[offsets[e] + i] / k;
      std::copy_n(x + t * hidden, hidden, xs + i * hidden);
    }
    const TensorView xs_view(xs, DType::kF32, {n, hidden});
    const TensorView gu_view(gate_up, DType::kF32, {n, 2 * inter});
    const TensorView act_view(act, DType::kF32, {n, inter});
    const TensorView y_view(y + offsets[e] * hidden, DType::kF32, {n, hidden});
    const TensorView gu_w(
        const_cast<float*>(w_gate_up + e * 2 * inter * hidden), DType::kF32,
        {2 * inter, hidden});
    const TensorView down_w(const_cast<float*>(w_down + e * hidden * inter),
                            DType::kF32, {hidden, inter});
    RETURN_IF_ERROR(DoLinear(xs_view, gu_w, nullptr, gu_view));
    RETURN_IF_ERROR(
        DoGatedActivation(GatedActivationKind::kSilu, gu_view, act_view));
    RETURN_IF_ERROR(DoLinear(act_view, down_w, nullptr, y_view));
  }
  // out[t] = 0 + w_a * y_a + w_b * y_b + ... in ascending expert id (ties by
  // j), each product rounded before its add, as index_add_ expert by expert.
  float* out = a.out.data_as<float>();
  std::vector<int64_t> picks(static_cast<size_t>(k));
  for (int64_t t = 0; t < tokens; ++t) {
    float* o = out + t * hidden;
    std::fill_n(o, hidden, 0.0f);
    int64_t n = 0;
    for (int64_t j = 0; j < k; ++j) {
      if (position[t * k + j] >= 0) picks[n++] = t * k + j;
    }
    std::stable_sort(picks.begin(), picks.begin() + n,
                     [&](int64_t p, int64_t q) { return ids[p] < ids[q]; });
    for (int64_t i = 0; i < n; ++i) {
      const float w = weights[picks[i]];
      const float* yr = y + static_cast<int64_t>(position[picks[i]]) * hidden;
      for (int64_t h = 0; h < hidden; ++h) {
        const float term = w * yr[h];
        o[h] = o[h] + term;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CpuOps::DoSigmoidGatedAdd(const TensorView& gate,
                                       const TensorView& x,
                                       const TensorView& out) {
  const int64_t tokens = x.shape()[0], n = x.shape()[1];
  for (int64_t t = 0; t < tokens; ++t) {
    const float g = gate.data_as<const float>()[t];
    const float s = 1.0f / (1.0f + std::exp(-g));
    const float* xr = x.data_as<const float>() + t * n;
    float* o = out.data_as<float>() + t * n;
    for (int64_t i = 0; i < n; ++i) {
      const float term = s * xr[i];
      o[i] = o[i] + term;
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
