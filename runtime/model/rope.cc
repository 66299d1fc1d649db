#include "runtime/model/rope.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {

absl::StatusOr<Tensor> ComputeRopeInvFreq(const ModelConfig& c) {
  const int64_t dim = c.head_dim;
  if (dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim ", dim, " must be even for RoPE"));
  }
  ASSIGN_OR_RETURN(Tensor inv_freq, Tensor::Empty(DType::kF32, {dim / 2}));
  float* f = inv_freq.data_as<float>();
  const RopeConfig& r = c.rope;
  for (int64_t i = 0; i < dim / 2; ++i) {
    // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), in f32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    f[i] = 1.0f / std::pow(static_cast<float>(r.theta), exponent);
  }
  switch (r.scaling) {
    case RopeScaling::kNone:
      break;
    case RopeScaling::kLinear:
      for (int64_t i = 0; i < dim / 2; ++i)
        f[i] = f[i] / static_cast<float>(r.factor);
      break;
    case RopeScaling::kLlama3: {
      // Long wavelengths (low frequencies) are slowed by `factor`, short ones
      // kept, and the band between is interpolated smoothly (transformers'
      // _compute_llama3_parameters).
      const double old_len = static_cast<double>(r.original_max_position);
      const double low_freq_wavelen = old_len / r.low_freq_factor;
      const double high_freq_wavelen = old_len / r.high_freq_factor;
      for (int64_t i = 0; i < dim / 2; ++i) {
        const float freq = f[i];
        const float wavelen = 2.0f * static_cast<float>(M_PI) / freq;
        float scaled = wavelen > low_freq_wavelen
                           ? freq / static_cast<float>(r.factor)
                           : freq;
        const bool medium =
            !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
        if (medium) {
          const float smooth =
              static_cast<float>((old_len / wavelen - r.low_freq_factor) /
                                 (r.high_freq_factor - r.low_freq_factor));
          scaled = (1.0f - smooth) * scaled / static_cast<float>(r.factor) +
                   smooth * scaled;
        }
        f[i] = scaled;
      }
      break;
    }
  }
  return inv_freq;
}

}  // namespace tessera
