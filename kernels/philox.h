// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11; Random123's philox4x32 with 10 rounds) and the one uniform per draw
// that both samplers (kernels/cpu/cpu_sampling.h and the CUDA sampler in
// kernels/cuda/sampling/sampling_kernels.h) take from it. Counter-based: the
// uniform is a pure function of (seed, step), so a draw does not depend on the
// batch, on the backend or on any earlier draw. Plain integer C++, compiled for
// the host and (through nvcc) for the device, so both compute the same bits.
#ifndef TESSERA_KERNELS_PHILOX_H_
#define TESSERA_KERNELS_PHILOX_H_

#include <cstdint>

#if defined(__CUDACC__)
#define TESSERA_HOST_DEVICE __host__ __device__
#else
#define TESSERA_HOST_DEVICE
#endif

namespace tessera {

struct Philox4x32 {
  uint32_t v[4];
};

// Encrypts `counter` with the key (key0, key1).
TESSERA_HOST_DEVICE inline Philox4x32 Philox4x32_10(Philox4x32 counter,
                                                    uint32_t key0,
                                                    uint32_t key1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t* c = counter.v;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kW0;
      key1 += kW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32);
    const uint32_t lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32);
    const uint32_t lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c[1] ^ key0;
    const uint32_t n2 = hi0 ^ c[3] ^ key1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
  }
  return counter;
}

// The uniform in [0, 1) of draw `step` of the stream `seed`: counter = (step
// low, step high, 0, 0), key = (seed low, seed high); 53 bits from the first
// two output words, so the double is exact (a multiple of 2^-53).
TESSERA_HOST_DEVICE inline double PhiloxUniform(uint64_t seed, uint64_t step) {
  Philox4x32 counter = {
      {static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32), 0u, 0u}};
  const Philox4x32 out = Philox4x32_10(counter, static_cast<uint32_t>(seed),
                                       static_cast<uint32_t>(seed >> 32));
  const uint64_t a = out.v[0] >> 5;  // 27 bits
  const uint64_t b = out.v[1] >> 6;  // 26 bits
  return static_cast<double>((a << 26) | b) * (1.0 / 9007199254740992.0);
}

}  // namespace tessera

#undef TESSERA_HOST_DEVICE

#endif  // TESSERA_KERNELS_PHILOX_H_
