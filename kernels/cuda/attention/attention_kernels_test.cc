// The CUDA KV-cache kernels (StoreKvCache, prefill, split-K decode and static
// attention) against the CPU reference (CpuOps) on fresh random inputs: mixed
// batches, shuffled block tables, GQA / MQA, several head dims, sliding
// windows, and f32, bf16, int8 and fp8 (e4m3, per-head scales) caches; the
// CPU runs the fp8 cases on an fp8 cache of its own, so both sides hold the
// same bytes (checked) and the attention compares f32 sums over the same
// dequantized values. Cache slots that hold no position
// are NaN, so a kernel that reads a wrong slot fails loudly. Also: a sequence
// gives bitwise the same output alone as in a batch, and the launchers reject
// bad arguments (those tests run without a GPU too).
#include "kernels/cuda/attention/attention_kernels.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "kernels/attention_metadata.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/testing/step_arrays.h"

namespace tessera {
namespace {

using cuda::KvDType;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

#define ASSERT_CUDA_OK(expr)                                 \
  do {                                                       \
    const cudaError_t cuda_error_ = (expr);                  \
    ASSERT_EQ(cuda_error_, cudaSuccess)                      \
        << #expr << ": " << cudaGetErrorString(cuda_error_); \
  } while (0)

// Device memory holding `count` elements of T (RAII).
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t count) : count_(count) {
    if (count_ > 0) {
      EXPECT_EQ(cudaMalloc(&ptr_, count_ * sizeof(T)), cudaSuccess);
    }
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    Upload(host);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& other) noexcept { Swap(other); }
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    Swap(other);
    return *this;
  }
  ~DeviceArray() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }

  T* get() const { return static_cast<T*>(ptr_); }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  void Upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), count_);
    if (count_ == 0) return;
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> Download() const {
    std::vector<T> host(count_);
    if (count_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return host;
  }

 private:
  void Swap(DeviceArray& other) {
    std::swap(ptr_, other.ptr_);
    std::swap(count_, other.count_);
  }
  void* ptr_ = nullptr;
  size_t count_ = 0;
};

// Round to nearest even bf16, as __float2bfloat16_rn; NaN stays NaN.
float RoundToBf16(float x) {
  if (std::isnan(x)) return x;
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&x, &u, sizeof(u));
  return x;
}

float Bf16BitsToFloat(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

bool SameFloat(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) ||
         std::memcmp(&a, &b, sizeof(a)) == 0;
}

const char* DTypeString(KvDType d) {
  switch (d) {
    case KvDType::kF32:
      return "f32";
    case KvDType::kBF16:
      return "bf16";
    case KvDType::kI8:
      return "int8";
    case KvDType::kF8E4M3:
      return "fp8";
  }
  return "?";
}

struct Config {
  int32_t heads = 8;
  int32_t kv_heads = 2;
  int32_t dim = 64;
  int32_t dim_v = 64;
  int32_t block_size = 16;
  int64_t window = 0;
  KvDType dtype = KvDType::kF32;
  float softcap = 0.0f;  // 0: none (Gemma 2's attention logit soft cap).

  std::string ToString() const {
    return absl::StrCat("heads=", heads, " kv_heads=", kv_heads, " D=", dim,
                        " Dv=", dim_v, " block_size=", block_size,
                        " window=", window, " cache=", DTypeString(dtype),
                        " softcap=", softcap);
  }
  // f32 accumulation against f32 accumulation over the same values: f32,
  // int8 and fp8 (whose dequantized values are the same numbers on both
  // sides; only where the scales enter the sums differs, an f32 rounding)
  // differ by the sums' order, 1e-4 of the output's scale; bf16 holds the CPU
  // to its rounded values too, but the kernels' widening and the CPU's
  // model of it differ by more.
  float tolerance() const { return dtype == KvDType::kBF16 ? 1e-3f : 1e-4f; }
  size_t elem_bytes() const {
    return dtype == KvDType::kF32 ? 4 : dtype == KvDType::kBF16 ? 2 : 1;
  }
};

Config MakeConfig(int32_t heads, int32_t kv_heads, int32_t dim, int32_t dim_v,
                  int32_t block_size, int64_t window = 0) {
  Config c;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.dim = dim;
  c.dim_v = dim_v;
  c.block_size = block_size;
  c.window = window;
  return c;
}

// (context_len, query_len) of each sequence of a step.
using Lens = std::vector<std::pair<int64_t, int64_t>>;

// A batch's block tables and metadata. Static layout: one block per sequence
// of `block_size` = capacity slots.
struct Batch {
  int32_t block_size = 0;
  int64_t num_blocks = 0;
  std::vector<std::vector<int32_t>> tables;
  HostAttentionMetadata m;
  int64_t num_slots() const { return num_blocks * block_size; }
};

Batch MakeBatch(const Lens& lens, int32_t block_size, std::mt19937& rng) {
  Batch b;
  b.block_size = block_size;
  int64_t needed = 0;
  for (const auto& [ctx, len] : lens) {
    needed += (ctx + len + block_size - 1) / block_size;
  }
  b.num_blocks = needed + 3;  // A few blocks nobody owns.
  std::vector<int32_t> ids(b.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  size_t next = 0;
  for (const auto& [ctx, len] : lens) {
    const int64_t n = (ctx + len + block_size - 1) / block_size;
    b.tables.emplace_back(ids.begin() + next, ids.begin() + next + n);
    next += n;
  }
  std::vector<SequenceSlice> slices;
  for (size_t i = 0; i < lens.size(); ++i) {
    slices.push_back({lens[i].first, lens[i].second, b.tables[i]});
  }
  auto m = BuildAttentionMetadata(slices, block_size, b.num_blocks);
  EXPECT_TRUE(m.ok()) << m.status();
  if (m.ok()) b.m = *std::move(m);
  return b;
}

// The metadata arrays on the device.
struct DeviceMetadata {
  explicit DeviceMetadata(const HostAttentionMetadata& m)
      : query_start_loc(m.query_start_loc),
        context_lens(m.context_lens),
        seq_lens(m.seq_lens),
        block_tables(m.block_tables),
        slot_mapping(m.slot_mapping) {
    view.query_start_loc = query_start_loc.get();
    view.context_lens = context_lens.get();
    view.seq_lens = seq_lens.get();
    view.block_tables = block_tables.get();
    view.max_blocks_per_seq = m.max_blocks_per_seq;
    view.block_size = m.block_size;
    view.num_seqs = m.num_seqs;
    view.num_tokens = m.num_tokens;
    view.max_query_len = m.max_query_len;
    view.max_seq_len = m.max_seq_len;
  }
  DeviceArray<int32_t> query_start_loc, context_lens, seq_lens, block_tables;
  DeviceArray<int64_t> slot_mapping;
  cuda::DeviceAttentionMetadata view;
};

// One layer's cache on the host (the CPU reference's) and on the device.
struct Caches {
  Caches(const Config& c, int64_t num_slots)
      : config(c),
        num_slots(num_slots),
        dk(num_slots * c.kv_heads * c.dim * c.elem_bytes()),
        dv(num_slots * c.kv_heads * c.dim_v * c.elem_bytes()) {
    const int64_t kn = num_slots * c.kv_heads * c.dim;
    const int64_t vn = num_slots * c.kv_heads * c.dim_v;
    if (c.dtype == KvDType::kF8E4M3) {
      // Bytes on both sides; the layer's per-head scales, not powers of two
      // (x / scale rounds), set once: stores read them and never write them.
      k8.assign(kn, 0);
      v8.assign(vn, 0);
      for (int32_t h = 0; h < c.kv_heads; ++h) {
        ks.push_back(0.35f + 0.55f * static_cast<float>(h % 4));
        vs.push_back(1.7f - 0.45f * static_cast<float>(h % 3));
      }
      dks = DeviceArray<float>(ks);
      dvs = DeviceArray<float>(vs);
    } else if (c.dtype == KvDType::kI8) {
      ki.assign(kn, 0);
      vi.assign(vn, 0);
      ks.assign(num_slots * c.kv_heads, 0.0f);
      vs.assign(num_slots * c.kv_heads, 0.0f);
      dks = DeviceArray<float>(ks.size());
      dvs = DeviceArray<float>(vs.size());
    } else {
      kf.assign(kn, 0.0f);
      vf.assign(vn, 0.0f);
    }
    device.k = dk.get();
    device.v = dv.get();
    device.k_scale = dks.get();
    device.v_scale = dvs.get();
    device.dtype = c.dtype;
    device.num_slots = num_slots;
    device.num_kv_heads = c.kv_heads;
    device.head_dim = c.dim;
    device.head_dim_v = c.dim_v;
  }

  KvCacheLayer Host() {
    KvCacheLayer l;
    const int64_t kvh = config.kv_heads;
    if (config.dtype == KvDType::kF8E4M3) {
      l.k = TensorView(k8.data(), DType::kF8E4M3, {num_slots, kvh, config.dim});
      l.v =
          TensorView(v8.data(), DType::kF8E4M3, {num_slots, kvh, config.dim_v});
      l.k_scale = TensorView(ks.data(), DType::kF32, {kvh});
      l.v_scale = TensorView(vs.data(), DType::kF32, {kvh});
    } else if (config.dtype == KvDType::kI8) {
      l.k = TensorView(ki.data(), DType::kI8, {num_slots, kvh, config.dim});
      l.v = TensorView(vi.data(), DType::kI8, {num_slots, kvh, config.dim_v});
      l.k_scale = TensorView(ks.data(), DType::kF32, {num_slots, kvh});
      l.v_scale = TensorView(vs.data(), DType::kF32, {num_slots, kvh});
    } else {
      l.k = TensorView(kf.data(), DType::kF32, {num_slots, kvh, config.dim});
      l.v = TensorView(vf.data(), DType::kF32, {num_slots, kvh, config.dim_v});
    }
    return l;
  }

  Config config;
  int64_t num_slots;
  std::vector<float> kf, vf;    // f32 / bf16 configs (bf16-rounded values).
  std::vector<int8_t> ki, vi;   // int8 config.
  std::vector<uint8_t> k8, v8;  // fp8 config.
  std::vector<float> ks, vs;    // int8: per slot and head; fp8: per head.
  DeviceArray<uint8_t> dk, dv;  // Raw elements of config.dtype.
  DeviceArray<float> dks, dvs;
  cuda::DeviceKvLayer device;
};

// Everything one step needs, stored on both sides: random queries and keys,
// the cache (context positions random, unused slots NaN) after StoreKvCache
// of the step's tokens, and the metadata on the device.
class Step {
 public:
  Step(const Config& c, Batch batch)
      : config_(c),
        batch_(std::move(batch)),
        caches_(c, batch_.num_slots()),
        dmeta_(batch_.m),
        host_view_(batch_.m.View()) {}

  const Config& config() const { return config_; }
  const HostAttentionMetadata& m() const { return batch_.m; }
  const Batch& batch() const { return batch_; }
  const std::vector<float>& q() const { return q_; }
  const DeviceArray<float>& dq() const { return dq_; }
  const cuda::DeviceKvLayer& device_cache() const { return caches_.device; }
  const cuda::DeviceAttentionMetadata& device_metadata() const {
    return dmeta_.view;
  }
  KvCacheLayer host_cache() { return caches_.Host(); }
  int64_t q_count() const {
    return m().num_tokens * config_.heads * config_.dim;
  }
  int64_t out_count() const {
    return m().num_tokens * config_.heads * config_.dim_v;
  }

  // Fills both caches and checks the device store against the CPU's.
  void Prepare(std::mt19937& rng) {
    const Config& c = config_;
    const HostAttentionMetadata& m = batch_.m;
    const int64_t slots = batch_.num_slots();
    const int64_t k_row = int64_t{c.kv_heads} * c.dim;
    const int64_t v_row = int64_t{c.kv_heads} * c.dim_v;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // Slot contents before the step: the context positions of every
    // sequence are random, everything else NaN.
    std::vector<float> k0(slots * k_row, kNaN), v0(slots * v_row, kNaN);
    used_.assign(slots, false);
    for (int32_t s = 0; s < m.num_seqs; ++s) {
      for (int64_t p = 0; p < m.seq_lens[s]; ++p) used_[m.Slot(s, p)] = true;
      for (int64_t p = 0; p < m.context_lens[s]; ++p) {
        const int64_t slot = m.Slot(s, p);
        for (int64_t i = 0; i < k_row; ++i) k0[slot * k_row + i] = normal(rng);
        for (int64_t i = 0; i < v_row; ++i) v0[slot * v_row + i] = normal(rng);
      }
    }
    const int64_t t = m.num_tokens;
    std::vector<float> k1(t * k_row), v1(t * v_row);
    for (float& x : k1) x = normal(rng);
    for (float& x : v1) x = normal(rng);
    // One int8 row of zeros: its scale must be 0 on both sides.
    if (t > 0) std::fill_n(v1.begin(), c.dim_v, 0.0f);
    q_.resize(q_count());
    for (float& x : q_) x = normal(rng);
    dq_ = DeviceArray<float>(q_);

    // CPU: the bf16 cache is modelled by an f32 cache of rounded values.
    auto cpu_in = [&](std::vector<float> x) {
      if (c.dtype == KvDType::kBF16) {
        for (float& e : x) e = RoundToBf16(e);
      }
      return x;
    };
    std::vector<int64_t> all_slots(slots);
    std::iota(all_slots.begin(), all_slots.end(), 0);
    {
      std::vector<float> k0c = cpu_in(k0), v0c = cpu_in(v0);
      std::vector<float> k1c = cpu_in(k1), v1c = cpu_in(v1);
      const KvCacheLayer layer = caches_.Host();
      ASSERT_TRUE(cpu_.StoreKvCache(TensorView(k0c.data(), DType::kF32,
                                               {slots, c.kv_heads, c.dim}),
                                    TensorView(v0c.data(), DType::kF32,
                                               {slots, c.kv_heads, c.dim_v}),
                                    StepArray(all_slots), layer)
                      .ok());
      ASSERT_TRUE(
          cpu_.StoreKvCache(
                  TensorView(k1c.data(), DType::kF32, {t, c.kv_heads, c.dim}),
                  TensorView(v1c.data(), DType::kF32, {t, c.kv_heads, c.dim_v}),
                  StepArray(m.slot_mapping), layer)
              .ok());
    }
    // Device: the same two stores from the unrounded values.
    {
      DeviceArray<float> dk0(k0), dv0(v0), dk1(k1), dv1(v1);
      DeviceArray<int64_t> dall(all_slots);
      ASSERT_CUDA_OK(cuda::LaunchStoreKvCache(
          dk0.get(), dv0.get(), slots, dall.get(), caches_.device, nullptr));
      ASSERT_CUDA_OK(cuda::LaunchStoreKvCache(dk1.get(), dv1.get(), t,
                                              dmeta_.slot_mapping.get(),
                                              caches_.device, nullptr));
      ASSERT_CUDA_OK(cudaDeviceSynchronize());
    }
    ASSERT_NO_FATAL_FAILURE(CheckStoredCache());

    if (c.dtype == KvDType::kI8) {
      // Unused slots get NaN scales, then the device runs on exactly the
      // CPU's int8 cache.
      for (int64_t slot = 0; slot < slots; ++slot) {
        if (used_[slot]) continue;
        for (int32_t h = 0; h < c.kv_heads; ++h) {
          caches_.ks[slot * c.kv_heads + h] = kNaN;
          caches_.vs[slot * c.kv_heads + h] = kNaN;
        }
      }
      UploadBytes(caches_.ki, &caches_.dk);
      UploadBytes(caches_.vi, &caches_.dv);
      caches_.dks.Upload(caches_.ks);
      caches_.dvs.Upload(caches_.vs);
    }
  }

  // The device cache must hold what the CPU stored, bit for bit (bf16: the
  // CPU's rounded f32 values).
  void CheckStoredCache() {
    const Config& c = config_;
    const std::vector<uint8_t> k = caches_.dk.Download();
    const std::vector<uint8_t> v = caches_.dv.Download();
    int64_t bad = 0;
    auto check = [&](const std::vector<uint8_t>& got, const char* name,
                     const std::vector<float>& want_f,
                     const std::vector<int8_t>& want_i,
                     const std::vector<uint8_t>& want_8) {
      switch (c.dtype) {
        case KvDType::kF8E4M3:
          for (size_t i = 0; i < want_8.size(); ++i) {
            if (got[i] != want_8[i] && ++bad <= 5) {
              ADD_FAILURE() << c.ToString() << ": stored " << name << "[" << i
                            << "] = 0x" << std::hex << int{got[i]} << ", CPU 0x"
                            << int{want_8[i]} << std::dec;
            }
          }
          break;
        case KvDType::kF32:
        case KvDType::kBF16:
          for (size_t i = 0; i < want_f.size(); ++i) {
            float g;
            if (c.dtype == KvDType::kF32) {
              std::memcpy(&g, got.data() + 4 * i, 4);
            } else {
              uint16_t bits;
              std::memcpy(&bits, got.data() + 2 * i, 2);
              g = Bf16BitsToFloat(bits);
            }
            if (!SameFloat(g, want_f[i]) && ++bad <= 5) {
              ADD_FAILURE() << c.ToString() << ": stored " << name << "[" << i
                            << "] = " << g << ", CPU " << want_f[i];
            }
          }
          break;
        case KvDType::kI8:
          for (size_t i = 0; i < want_i.size(); ++i) {
            if (static_cast<int8_t>(got[i]) != want_i[i] && ++bad <= 5) {
              ADD_FAILURE() << c.ToString() << ": stored " << name << "[" << i
                            << "] = " << int{static_cast<int8_t>(got[i])}
                            << ", CPU " << int{want_i[i]};
            }
          }
          break;
      }
    };
    check(k, "k", caches_.kf, caches_.ki, caches_.k8);
    check(v, "v", caches_.vf, caches_.vi, caches_.v8);
    // int8 scales are written with the values; fp8's must be left as set.
    if (c.dtype == KvDType::kI8 || c.dtype == KvDType::kF8E4M3) {
      const std::vector<float> ks = caches_.dks.Download();
      const std::vector<float> vs = caches_.dvs.Download();
      for (size_t i = 0; i < ks.size(); ++i) {
        if ((!SameFloat(ks[i], caches_.ks[i]) ||
             !SameFloat(vs[i], caches_.vs[i])) &&
            ++bad <= 5) {
          ADD_FAILURE() << c.ToString() << ": stored scales [" << i
                        << "] = " << ks[i] << ", " << vs[i] << ", CPU "
                        << caches_.ks[i] << ", " << caches_.vs[i];
        }
      }
    }
    ASSERT_EQ(bad, 0) << c.ToString() << ": StoreKvCache differs from the CPU";
  }

  PagedAttentionArgs CpuArgs(std::vector<float>* out, int32_t first,
                             int32_t end) {
    const Config& c = config_;
    PagedAttentionArgs a;
    a.q = TensorView(q_.data(), DType::kF32, {m().num_tokens, c.heads, c.dim});
    a.cache = caches_.Host();
    a.metadata = &host_view_;
    a.first_seq = first;
    a.end_seq = end;
    a.out = TensorView(out->data(), DType::kF32,
                       {m().num_tokens, c.heads, c.dim_v});
    a.sliding_window = c.window;
    a.scale = Scale();
    a.softcap = config_.softcap;
    return a;
  }
  float Scale() const {
    return 1.0f / std::sqrt(static_cast<float>(config_.dim));
  }

  CpuOps& cpu() { return cpu_; }

 private:
  template <typename T>
  static void UploadBytes(const std::vector<T>& host,
                          DeviceArray<uint8_t>* dev) {
    ASSERT_EQ(host.size() * sizeof(T), dev->size());
    ASSERT_CUDA_OK(cudaMemcpy(dev->get(), host.data(), dev->size(),
                              cudaMemcpyHostToDevice));
  }

  Config config_;
  Batch batch_;
  Caches caches_;
  DeviceMetadata dmeta_;
  AttentionMetadata host_view_;  // Of batch_.m, for the CPU.
  std::vector<float> q_;
  DeviceArray<float> dq_;
  std::vector<bool> used_;
  CpuOps cpu_;
};

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 float tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float err = std::fabs(got[i] - want[i]);
    // !(err <= ...) also catches NaN.
    if (!(err <= tol * std::max(1.0f, std::fabs(want[i]))) && ++bad <= 5) {
      ADD_FAILURE() << what << ": out[" << i << "] = " << got[i] << ", CPU "
                    << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size()
                    << " outputs differ";
}

// Fresh random lengths: `decodes` sequences with query_len 1 first (at least
// one with a context long enough for two decode partitions), then
// `prefills` with query lengths 2..70; contexts 0..600.
Lens RandomLens(int decodes, int prefills, std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> ctx(0, 600), qlen(2, 70);
  Lens lens;
  for (int i = 0; i < decodes; ++i) lens.push_back({ctx(rng), 1});
  if (decodes > 0)
    lens[0].first = std::uniform_int_distribution<int64_t>(
        cuda::kDecodePartitionSize + 8, 600)(rng);
  for (int i = 0; i < prefills; ++i) lens.push_back({ctx(rng), qlen(rng)});
  return lens;
}

class CudaAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    // Fresh inputs every run; the seed reproduces a failure.
    const uint32_t seed = std::random_device{}();
    rng_.seed(seed);
    RecordProperty("seed", std::to_string(seed));
    std::cerr << "seed " << seed << "\n";
  }

  // Paged: decode on the leading decodes and prefill on the rest, then
  // prefill over the whole batch, each against the CPU.
  void CheckPaged(const Config& c, const Lens& lens) {
    SCOPED_TRACE(c.ToString());
    Step step(c, MakeBatch(lens, c.block_size, rng_));
    ASSERT_NO_FATAL_FAILURE(step.Prepare(rng_));
    const HostAttentionMetadata& m = step.m();
    const int32_t nd = m.num_decode_seqs;
    std::vector<float> want(step.out_count(), 0.0f);
    if (nd > 0) {
      ASSERT_TRUE(step.cpu().DecodeAttention(step.CpuArgs(&want, 0, nd)).ok());
    }
    ASSERT_TRUE(
        step.cpu().PrefillAttention(step.CpuArgs(&want, nd, m.num_seqs)).ok());

    DeviceArray<float> out(std::vector<float>(step.out_count(), kNaN));
    const size_t ws_bytes = cuda::DecodeAttentionWorkspaceBytes(
        nd, c.heads, c.dim_v, m.max_seq_len);
    DeviceArray<uint8_t> ws(ws_bytes);
    ASSERT_CUDA_OK(cuda::LaunchDecodeAttention(
        step.dq().get(), c.heads, step.device_cache(), step.device_metadata(),
        0, nd, c.window, step.Scale(), c.softcap, out.get(), ws.get(),
        ws.size(), nullptr));
    ASSERT_CUDA_OK(cuda::LaunchPrefillAttention(
        step.dq().get(), c.heads, step.device_cache(), step.device_metadata(),
        nd, m.num_seqs, c.window, step.Scale(), c.softcap, out.get(), nullptr));
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> eager = out.Download();
    ExpectClose(eager, want, c.tolerance(), "decode + prefill");
    if (nd > 0) {
      ASSERT_NO_FATAL_FAILURE(CheckGraphSafeDecode(c, step, eager));
    }

    DeviceArray<float> out2(std::vector<float>(step.out_count(), kNaN));
    ASSERT_CUDA_OK(cuda::LaunchPrefillAttention(
        step.dq().get(), c.heads, step.device_cache(), step.device_metadata(),
        0, m.num_seqs, c.window, step.Scale(), c.softcap, out2.get(), nullptr));
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    ExpectClose(out2.Download(), want, c.tolerance(), "prefill of all");
  }

  // Graph-safe launches (graph-safe steps 1 and 2, attention_metadata.h): the
  // decode launch sized for a grid_max_seq_len far beyond the batch's longest
  // sequence gives bitwise the eager result, and a sequence whose seq_len is 0
  // (a padded row) gets zeros while the others are unchanged.
  void CheckGraphSafeDecode(const Config& c, const Step& step,
                            const std::vector<float>& eager) {
    const HostAttentionMetadata& m = step.m();
    const int32_t nd = m.num_decode_seqs;
    const int64_t row = int64_t{c.heads} * c.dim_v;  // Floats per token.
    cuda::DeviceAttentionMetadata dm = step.device_metadata();
    dm.grid_max_seq_len = m.max_seq_len + 3 * cuda::kDecodePartitionSize + 5;
    const size_t ws_bytes = cuda::DecodeAttentionWorkspaceBytes(
        nd, c.heads, c.dim_v, dm.grid_max_seq_len);
    DeviceArray<uint8_t> ws(ws_bytes);
    // A workspace for the exact maximum is too small for the larger grid.
    if (c.window == 0) {
      DeviceArray<uint8_t> small(cuda::DecodeAttentionWorkspaceBytes(
          nd, c.heads, c.dim_v, m.max_seq_len));
      DeviceArray<float> unused(std::vector<float>(step.out_count(), kNaN));
      EXPECT_EQ(cuda::LaunchDecodeAttention(
                    step.dq().get(), c.heads, step.device_cache(), dm, 0, nd,
                    c.window, step.Scale(), c.softcap, unused.get(),
                    small.get(), small.size(), nullptr),
                cudaErrorInvalidValue);
    }
    DeviceArray<float> out(std::vector<float>(step.out_count(), kNaN));
    ASSERT_CUDA_OK(cuda::LaunchDecodeAttention(
        step.dq().get(), c.heads, step.device_cache(), dm, 0, nd, c.window,
        step.Scale(), c.softcap, out.get(), ws.get(), ws.size(), nullptr));
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> big = out.Download();
    for (int32_t s = 0; s < nd; ++s) {
      const int64_t r = m.query_start_loc[s];
      ASSERT_EQ(0, std::memcmp(big.data() + r * row, eager.data() + r * row,
                               row * sizeof(float)))
          << "sequence " << s << ": a larger grid changed its output";
    }
    // Sequence 0 as padding: seq_len 0 (its table and context stay, the
    // kernel must not read them).
    std::vector<int32_t> lens = m.seq_lens;
    lens[0] = 0;
    DeviceArray<int32_t> padded_lens(lens);
    dm.seq_lens = padded_lens.get();
    DeviceArray<float> out2(std::vector<float>(step.out_count(), kNaN));
    ASSERT_CUDA_OK(cuda::LaunchDecodeAttention(
        step.dq().get(), c.heads, step.device_cache(), dm, 0, nd, c.window,
        step.Scale(), c.softcap, out2.get(), ws.get(), ws.size(), nullptr));
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> padded = out2.Download();
    const int64_t r0 = m.query_start_loc[0];
    for (int64_t i = 0; i < row; ++i) {
      ASSERT_EQ(padded[r0 * row + i], 0.0f) << "padded sequence, element " << i;
    }
    for (int32_t s = 1; s < nd; ++s) {
      const int64_t r = m.query_start_loc[s];
      ASSERT_EQ(0, std::memcmp(padded.data() + r * row, eager.data() + r * row,
                               row * sizeof(float)))
          << "sequence " << s << " changed beside a padded sequence";
    }
  }

  // Static layout: one block per sequence of `capacity` slots.
  void CheckStatic(const Config& c, const Lens& lens) {
    SCOPED_TRACE(c.ToString() + " (static)");
    int64_t longest = 0;
    for (const auto& [ctx, len] : lens) longest = std::max(longest, ctx + len);
    const int32_t capacity = static_cast<int32_t>(longest + 7);
    Step step(c, MakeBatch(lens, capacity, rng_));
    ASSERT_NO_FATAL_FAILURE(step.Prepare(rng_));
    const HostAttentionMetadata& m = step.m();
    std::vector<float> want(step.out_count(), 0.0f);
    ASSERT_TRUE(
        step.cpu().StaticAttention(step.CpuArgs(&want, 0, m.num_seqs)).ok());
    DeviceArray<float> out(std::vector<float>(step.out_count(), kNaN));
    ASSERT_CUDA_OK(cuda::LaunchStaticAttention(
        step.dq().get(), c.heads, step.device_cache(), step.device_metadata(),
        0, m.num_seqs, c.window, step.Scale(), c.softcap, out.get(), nullptr));
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    ExpectClose(out.Download(), want, c.tolerance(), "static");
  }

  void CheckAll(Config c) {
    for (KvDType dtype :
         {KvDType::kF32, KvDType::kBF16, KvDType::kI8, KvDType::kF8E4M3}) {
      c.dtype = dtype;
      for (int round = 0; round < 2; ++round) {
        const Lens lens =
            RandomLens(/*decodes=*/3 + round, /*prefills=*/4, rng_);
        ASSERT_NO_FATAL_FAILURE(CheckPaged(c, lens));
        ASSERT_NO_FATAL_FAILURE(CheckStatic(c, lens));
      }
    }
  }

  std::mt19937 rng_;
};

TEST_F(CudaAttentionTest, Gqa8Over2Dim64) {
  CheckAll(MakeConfig(8, 2, 64, 64, 16));
}

TEST_F(CudaAttentionTest, MqaDim128BlockSize5) {
  CheckAll(MakeConfig(8, 1, 128, 128, 5));
}

TEST_F(CudaAttentionTest, Dim96SlidingWindow) {
  CheckAll(MakeConfig(6, 2, 96, 96, 16, 37));
}

TEST_F(CudaAttentionTest, Dim80NoGqaBlockSize5) {
  CheckAll(MakeConfig(4, 4, 80, 80, 5));
}

TEST_F(CudaAttentionTest, Dim128LongWindow) {
  CheckAll(MakeConfig(8, 2, 128, 128, 16, 200));
}

TEST_F(CudaAttentionTest, ValueDimDiffersFromKeyDim) {
  CheckAll(MakeConfig(4, 2, 96, 64, 5));
}

TEST_F(CudaAttentionTest, Dim256) {
  CheckAll(MakeConfig(4, 1, 256, 256, 16, 300));
}

TEST_F(CudaAttentionTest, SmallDims) { CheckAll(MakeConfig(2, 1, 8, 24, 16)); }

// Gemma 2's attention logit soft-capping (a cap small enough to bind: the
// scaled scores of these random inputs are of order 1) on every kernel and
// cache dtype, with and without a window, and at head_dim 256 (Gemma's) with
// decode contexts of several partitions.
TEST_F(CudaAttentionTest, Softcap) {
  Config c = MakeConfig(8, 2, 64, 64, 16);
  c.softcap = 0.8f;
  ASSERT_NO_FATAL_FAILURE(CheckAll(c));
  c = MakeConfig(4, 2, 128, 128, 5, /*window=*/37);
  c.softcap = 1.5f;
  ASSERT_NO_FATAL_FAILURE(CheckAll(c));
  c = MakeConfig(8, 4, 256, 256, 16, /*window=*/700);
  c.softcap = 0.5f;
  for (KvDType dtype :
       {KvDType::kF32, KvDType::kBF16, KvDType::kI8, KvDType::kF8E4M3}) {
    c.dtype = dtype;
    ASSERT_NO_FATAL_FAILURE(
        CheckPaged(c, {{1500, 1}, {1024, 1}, {3, 1}, {700, 33}, {0, 20}}));
  }
}

// Contexts of up to ~1500 positions: three decode partitions.
TEST_F(CudaAttentionTest, LongDecodeContexts) {
  Config c = MakeConfig(8, 2, 128, 128, 16);
  for (KvDType dtype : {KvDType::kF32, KvDType::kI8, KvDType::kF8E4M3}) {
    c.dtype = dtype;
    const Lens lens = {{1500, 1}, {1024, 1}, {1023, 1}, {511, 1},
                       {512, 1},  {0, 1},    {700, 33}};
    ASSERT_NO_FATAL_FAILURE(CheckPaged(c, lens));
  }
}

// A sequence computed alone gives bitwise the output it gets in a batch
// (decode, prefill and static), whatever the batch's maxima and grid.
TEST_F(CudaAttentionTest, BatchInvariant) {
  for (KvDType dtype : {KvDType::kF32, KvDType::kI8, KvDType::kF8E4M3}) {
    Config c = MakeConfig(8, 2, 128, 128, 16, dtype == KvDType::kI8 ? 300 : 0);
    c.dtype = dtype;
    SCOPED_TRACE(c.ToString());
    Lens lens = RandomLens(/*decodes=*/3, /*prefills=*/4, rng_);
    lens[1].first = 1400;  // Three decode partitions for one of them.
    for (bool static_layout : {false, true}) {
      int32_t block_size = c.block_size;
      if (static_layout) {
        int64_t longest = 0;
        for (const auto& [ctx, len] : lens)
          longest = std::max(longest, ctx + len);
        block_size = static_cast<int32_t>(longest);
      }
      Step step(c, MakeBatch(lens, block_size, rng_));
      ASSERT_NO_FATAL_FAILURE(step.Prepare(rng_));
      const HostAttentionMetadata& m = step.m();
      const int32_t nd = m.num_decode_seqs;
      ASSERT_GT(nd, 0);
      const int64_t row_out = int64_t{c.heads} * c.dim_v;
      const int64_t row_q = int64_t{c.heads} * c.dim;

      auto run = [&](const cuda::DeviceAttentionMetadata& dm, const float* dq,
                     int32_t first, int32_t end, bool decode,
                     int32_t max_seq_len, float* out) {
        if (static_layout) {
          return cuda::LaunchStaticAttention(
              dq, c.heads, step.device_cache(), dm, first, end, c.window,
              step.Scale(), c.softcap, out, nullptr);
        }
        if (!decode) {
          return cuda::LaunchPrefillAttention(
              dq, c.heads, step.device_cache(), dm, first, end, c.window,
              step.Scale(), c.softcap, out, nullptr);
        }
        const size_t bytes = cuda::DecodeAttentionWorkspaceBytes(
            end - first, c.heads, c.dim_v, max_seq_len);
        DeviceArray<uint8_t> ws(bytes);
        const cudaError_t e = cuda::LaunchDecodeAttention(
            dq, c.heads, step.device_cache(), dm, first, end, c.window,
            step.Scale(), c.softcap, out, ws.get(), ws.size(), nullptr);
        // The workspace is freed on return: finish first.
        const cudaError_t s = cudaDeviceSynchronize();
        return e != cudaSuccess ? e : s;
      };

      DeviceArray<float> batch_out(std::vector<float>(step.out_count(), kNaN));
      if (static_layout) {
        ASSERT_CUDA_OK(run(step.device_metadata(), step.dq().get(), 0,
                           m.num_seqs, false, m.max_seq_len, batch_out.get()));
      } else {
        ASSERT_CUDA_OK(run(step.device_metadata(), step.dq().get(), 0, nd, true,
                           m.max_seq_len, batch_out.get()));
        ASSERT_CUDA_OK(run(step.device_metadata(), step.dq().get(), nd,
                           m.num_seqs, false, m.max_seq_len, batch_out.get()));
      }
      ASSERT_CUDA_OK(cudaDeviceSynchronize());
      const std::vector<float> batched = batch_out.Download();

      for (int32_t s = 0; s < m.num_seqs; ++s) {
        const Batch& b = step.batch();
        const SequenceSlice slice{lens[s].first, lens[s].second, b.tables[s]};
        auto alone =
            BuildAttentionMetadata({&slice, 1}, b.block_size, b.num_blocks);
        ASSERT_TRUE(alone.ok()) << alone.status();
        DeviceMetadata dm(*alone);
        const int64_t row0 = m.query_start_loc[s];
        const int64_t rows = m.query_len(s);
        std::vector<float> q(step.q().begin() + row0 * row_q,
                             step.q().begin() + (row0 + rows) * row_q);
        DeviceArray<float> dq(q);
        DeviceArray<float> out(std::vector<float>(rows * row_out, kNaN));
        ASSERT_CUDA_OK(run(dm.view, dq.get(), 0, 1, !static_layout && s < nd,
                           alone->max_seq_len, out.get()));
        ASSERT_CUDA_OK(cudaDeviceSynchronize());
        const std::vector<float> got = out.Download();
        ASSERT_EQ(std::memcmp(got.data(), batched.data() + row0 * row_out,
                              got.size() * sizeof(float)),
                  0)
            << "sequence #" << s << " (context " << lens[s].first
            << ", query_len " << lens[s].second << ", static " << static_layout
            << ") differs alone";
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Argument checks: these return before any CUDA call, so they run (and must
// pass) without a GPU. The pointers are never dereferenced.

cuda::DeviceKvLayer FakeCache() {
  static float storage[4];
  cuda::DeviceKvLayer c;
  c.k = storage;
  c.v = storage;
  c.dtype = KvDType::kF32;
  c.num_slots = 64;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.head_dim_v = 64;
  return c;
}

cuda::DeviceAttentionMetadata FakeMetadata() {
  static int32_t storage[4];
  cuda::DeviceAttentionMetadata m;
  m.query_start_loc = storage;
  m.context_lens = storage;
  m.seq_lens = storage;
  m.block_tables = storage;
  m.max_blocks_per_seq = 4;
  m.block_size = 16;
  m.num_seqs = 2;
  m.num_tokens = 2;
  m.max_query_len = 1;
  m.max_seq_len = 1000;  // Two decode partitions.
  return m;
}

TEST(CudaAttentionArgsTest, WorkspaceBytes) {
  EXPECT_EQ(cuda::DecodeAttentionWorkspaceBytes(4, 8, 128, 1), 0u);
  EXPECT_EQ(cuda::DecodeAttentionWorkspaceBytes(4, 8, 128, 512), 0u);
  EXPECT_EQ(cuda::DecodeAttentionWorkspaceBytes(4, 8, 128, 513),
            4u * 8 * 2 * (128 + 2) * sizeof(float));
  EXPECT_EQ(cuda::DecodeAttentionWorkspaceBytes(0, 8, 128, 5000), 0u);
}

TEST(CudaAttentionArgsTest, RejectsBadArguments) {
  float q[4], out[4];
  const cuda::DeviceKvLayer cache = FakeCache();
  const cuda::DeviceAttentionMetadata m = FakeMetadata();
  const size_t ws = cuda::DecodeAttentionWorkspaceBytes(2, 8, 64, 1000);
  ASSERT_GT(ws, 0u);
  alignas(16) static uint8_t small_ws[64];

  // Workspace too small / missing for two partitions.
  EXPECT_EQ(
      cuda::LaunchDecodeAttention(q, 8, cache, m, 0, 2, 0, 1.0f, 0.0f, out,
                                  small_ws, sizeof(small_ws), nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchDecodeAttention(q, 8, cache, m, 0, 2, 0, 1.0f, 0.0f,
                                        out, nullptr, ws, nullptr),
            cudaErrorInvalidValue);
  // Heads not a multiple of kv heads.
  EXPECT_EQ(cuda::LaunchPrefillAttention(q, 7, cache, m, 0, 2, 0, 1.0f, 0.0f,
                                         out, nullptr),
            cudaErrorInvalidValue);
  // Null pointers.
  EXPECT_EQ(cuda::LaunchPrefillAttention(nullptr, 8, cache, m, 0, 2, 0, 1.0f,
                                         0.0f, out, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchStaticAttention(q, 8, cache, m, 0, 2, 0, 1.0f, 0.0f,
                                        nullptr, nullptr),
            cudaErrorInvalidValue);
  cuda::DeviceAttentionMetadata no_tables = m;
  no_tables.block_tables = nullptr;
  EXPECT_EQ(cuda::LaunchPrefillAttention(q, 8, cache, no_tables, 0, 2, 0, 1.0f,
                                         0.0f, out, nullptr),
            cudaErrorInvalidValue);
  // Head dims over the limit.
  cuda::DeviceKvLayer big = cache;
  big.head_dim = cuda::kMaxAttentionHeadDim + 1;
  EXPECT_EQ(cuda::LaunchPrefillAttention(q, 8, big, m, 0, 2, 0, 1.0f, 0.0f, out,
                                         nullptr),
            cudaErrorInvalidValue);
  big = cache;
  big.head_dim_v = 300;
  EXPECT_EQ(cuda::LaunchStaticAttention(q, 8, big, m, 0, 2, 0, 1.0f, 0.0f, out,
                                        nullptr),
            cudaErrorInvalidValue);
  // An int8 cache without scales.
  cuda::DeviceKvLayer i8 = cache;
  i8.dtype = KvDType::kI8;
  EXPECT_EQ(cuda::LaunchPrefillAttention(q, 8, i8, m, 0, 2, 0, 1.0f, 0.0f, out,
                                         nullptr),
            cudaErrorInvalidValue);
  const int64_t slot = 0;
  EXPECT_EQ(cuda::LaunchStoreKvCache(q, q, 1, &slot, i8, nullptr),
            cudaErrorInvalidValue);
  // An fp8 cache without its per-head scales, on every launcher.
  cuda::DeviceKvLayer fp8 = cache;
  fp8.dtype = KvDType::kF8E4M3;
  EXPECT_EQ(cuda::LaunchPrefillAttention(q, 8, fp8, m, 0, 2, 0, 1.0f, 0.0f, out,
                                         nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchStaticAttention(q, 8, fp8, m, 0, 2, 0, 1.0f, 0.0f, out,
                                        nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchDecodeAttention(q, 8, fp8, m, 0, 2, 0, 1.0f, 0.0f, out,
                                        nullptr, ws, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchStoreKvCache(q, q, 1, &slot, fp8, nullptr),
            cudaErrorInvalidValue);
  fp8.v_scale = q;  // One of the two is not enough.
  EXPECT_EQ(cuda::LaunchStoreKvCache(q, q, 1, &slot, fp8, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchStoreKvCache(nullptr, q, 1, &slot, cache, nullptr),
            cudaErrorInvalidValue);
  // Sequence ranges and windows.
  EXPECT_EQ(cuda::LaunchPrefillAttention(q, 8, cache, m, 1, 3, 0, 1.0f, 0.0f,
                                         out, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchPrefillAttention(q, 8, cache, m, 2, 1, 0, 1.0f, 0.0f,
                                         out, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchPrefillAttention(q, 8, cache, m, 0, 2, -1, 1.0f, 0.0f,
                                         out, nullptr),
            cudaErrorInvalidValue);
  // A soft cap is 0 (none) or positive and finite, on every kernel.
  for (const float bad : {-1.0f, std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_EQ(cuda::LaunchPrefillAttention(q, 8, cache, m, 0, 2, 0, 1.0f, bad,
                                           out, nullptr),
              cudaErrorInvalidValue);
    EXPECT_EQ(cuda::LaunchStaticAttention(q, 8, cache, m, 0, 2, 0, 1.0f, bad,
                                          out, nullptr),
              cudaErrorInvalidValue);
    EXPECT_EQ(cuda::LaunchDecodeAttention(q, 8, cache, m, 0, 2, 0, 1.0f, bad,
                                          out, nullptr, ws, nullptr),
              cudaErrorInvalidValue);
  }
  // Nothing to do is fine (and launches nothing).
  EXPECT_EQ(cuda::LaunchPrefillAttention(q, 8, cache, m, 1, 1, 0, 1.0f, 0.0f,
                                         out, nullptr),
            cudaSuccess);
  EXPECT_EQ(cuda::LaunchDecodeAttention(q, 8, cache, m, 2, 2, 0, 1.0f, 0.0f,
                                        out, nullptr, 0, nullptr),
            cudaSuccess);
  EXPECT_EQ(cuda::LaunchStoreKvCache(q, q, 0, &slot, cache, nullptr),
            cudaSuccess);
}

}  // namespace
}  // namespace tessera
