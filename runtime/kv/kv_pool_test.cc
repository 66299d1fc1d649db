#include "runtime/kv/kv_pool.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "runtime/core/memory.h"

namespace tessera {
namespace {

KvPoolShape Shape3x2x8(DType dtype) {
  KvPoolShape shape;
  shape.num_layers = 3;
  shape.num_kv_heads = 2;
  shape.head_dim = 8;
  shape.dtype = dtype;
  return shape;
}

std::vector<float> Read(const TensorView& t) {
  const float* p = t.data_as<const float>();
  return std::vector<float>(p, p + t.numel());
}

TEST(KvPoolTest, Fp8LayersHoldBytesAndPerHeadScalesOfOne) {
  HostMemorySource source;
  PinnableBlockAllocator allocator(&source);
  CpuOps ops;
  absl::StatusOr<KvPool> pool =
      KvPool::Create(Shape3x2x8(DType::kF8E4M3), 4, 16, &ops, &allocator);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->bytes(), 64 * 3 * 2 * 2 * 8 + 3 * 2 * 2 * 4);
  for (int64_t l = 0; l < 3; ++l) {
    const KvCacheLayer& layer = pool->layer(l);
    EXPECT_EQ(layer.k.dtype(), DType::kF8E4M3);
    EXPECT_EQ(layer.k.shape(), Shape({64, 2, 8}));
    EXPECT_TRUE(layer.quantized());
    EXPECT_FALSE(layer.per_slot_scales());
    EXPECT_EQ(layer.k_scale.shape(), Shape({2}));
    EXPECT_EQ(layer.v_scale.shape(), Shape({2}));
    EXPECT_EQ(Read(layer.k_scale), std::vector<float>({1.0f, 1.0f}));
    EXPECT_EQ(Read(layer.v_scale), std::vector<float>({1.0f, 1.0f}));
  }
  // K, V of 3 layers, then the one scale buffer.
  EXPECT_EQ(pool->blocks().size(), 3u * 2 + 1);

  // A checkpoint's scales land in the views the ops read, at the same
  // addresses (graphs keep reading them).
  const void* before = pool->layer(1).k_scale.data();
  ASSERT_TRUE(pool->SetLayerScales(1, {0.5f, 2.0f}, {3.0f, 0.25f}).ok());
  EXPECT_EQ(pool->layer(1).k_scale.data(), before);
  EXPECT_EQ(Read(pool->layer(1).k_scale), std::vector<float>({0.5f, 2.0f}));
  EXPECT_EQ(Read(pool->layer(1).v_scale), std::vector<float>({3.0f, 0.25f}));
  EXPECT_EQ(Read(pool->layer(0).k_scale), std::vector<float>({1.0f, 1.0f}));
  EXPECT_EQ(Read(pool->layer(2).v_scale), std::vector<float>({1.0f, 1.0f}));
  EXPECT_EQ(
      std::vector<float>(pool->k_scales(1).begin(), pool->k_scales(1).end()),
      std::vector<float>({0.5f, 2.0f}));

  // Refused: wrong sizes, layers, values.
  EXPECT_FALSE(pool->SetLayerScales(1, {1.0f}, {1.0f, 1.0f}).ok());
  EXPECT_FALSE(pool->SetLayerScales(3, {1.0f, 1.0f}, {1.0f, 1.0f}).ok());
  EXPECT_FALSE(pool->SetLayerScales(0, {0.0f, 1.0f}, {1.0f, 1.0f}).ok());
  EXPECT_FALSE(pool->SetLayerScales(0, {1.0f, 1.0f}, {-1.0f, 1.0f}).ok());
  EXPECT_EQ(Read(pool->layer(0).k_scale), std::vector<float>({1.0f, 1.0f}));

  // The layer goes through the ops' checks (per-head f32 scales).
  const std::vector<float> k(2 * 8, 1.5f), v(2 * 8, -3.0f);
  const std::vector<int64_t> slots = {5};
  absl::StatusOr<Tensor> kt = ops.Upload(
      TensorView(const_cast<float*>(k.data()), DType::kF32, {1, 2, 8}),
      DType::kF32);
  absl::StatusOr<Tensor> vt = ops.Upload(
      TensorView(const_cast<float*>(v.data()), DType::kF32, {1, 2, 8}),
      DType::kF32);
  ASSERT_TRUE(kt.ok() && vt.ok());
  ASSERT_TRUE(ops.StoreKvCache(kt->view(), vt->view(),
                               TensorView(const_cast<int64_t*>(slots.data()),
                                          DType::kI64, {1}),
                               pool->layer(1))
                  .ok());
  const uint8_t* kb = pool->layer(1).k.data_as<const uint8_t>() + 5 * 16;
  const uint8_t* vb = pool->layer(1).v.data_as<const uint8_t>() + 5 * 16;
  EXPECT_EQ(kb[0], F32ToFp8E4M3(1.5f / 0.5f));    // Head 0: 3.
  EXPECT_EQ(kb[8], F32ToFp8E4M3(1.5f / 2.0f));    // Head 1: 0.75.
  EXPECT_EQ(vb[0], F32ToFp8E4M3(-3.0f / 3.0f));   // -1.
  EXPECT_EQ(vb[8], F32ToFp8E4M3(-3.0f / 0.25f));  // -12.
}

TEST(KvPoolTest, OtherDTypesHaveNoPerHeadScales) {
  HostMemorySource source;
  PinnableBlockAllocator allocator(&source);
  CpuOps ops;
  absl::StatusOr<KvPool> i8 =
      KvPool::Create(Shape3x2x8(DType::kI8), 2, 4, &ops, &allocator);
  ASSERT_TRUE(i8.ok()) << i8.status();
  EXPECT_TRUE(i8->layer(0).quantized());
  EXPECT_TRUE(i8->layer(0).per_slot_scales());
  EXPECT_EQ(i8->layer(0).k_scale.shape(), Shape({8, 2}));
  EXPECT_EQ(i8->blocks().size(), 3u * 4);
  EXPECT_TRUE(i8->k_scales(0).empty());
  EXPECT_FALSE(i8->SetLayerScales(0, {1.0f, 1.0f}, {1.0f, 1.0f}).ok());
  absl::StatusOr<KvPool> f32 =
      KvPool::Create(Shape3x2x8(DType::kF32), 2, 4, &ops, &allocator);
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_FALSE(f32->layer(0).quantized());
  EXPECT_EQ(f32->layer(0).k_scale.data(), nullptr);
  // fp8 needs the device for its scales.
  EXPECT_FALSE(
      KvPool::Create(Shape3x2x8(DType::kF8E4M3), 2, 4, nullptr, &allocator)
          .ok());
}

}  // namespace
}  // namespace tessera
