#include "runtime/model/rope.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

// transformers' YaRN correction dim: the dim whose wavelength fits
// `rotations` times in the original context.
double YarnCorrectionDim(double rotations, double dim, double base,
                         double original) {
  return dim * std::log(original / (rotations * 2.0 * M_PI)) /
         (2.0 * std::log(base));
}

// f[i] = 1 / theta^(2i / dim) in f32, theta already rounded to f32 (torch's
// scalar ** f32 tensor).
void DefaultInvFreq(float theta, int64_t dim, float* f) {
  for (int64_t i = 0; i < dim / 2; ++i) {
    // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), in f32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    f[i] = 1.0f / std::pow(theta, exponent);
  }
}

void Llama3(const RopeConfig& r, int64_t dim, float* f) {
  // Long wavelengths (low frequencies) are slowed by `factor`, short ones
  // kept, and the band between is interpolated smoothly (transformers'
  // _compute_llama3_parameters).
  const double old_len = static_cast<double>(r.original_max_position);
  const double low_freq_wavelen = old_len / r.low_freq_factor;
  const double high_freq_wavelen = old_len / r.high_freq_factor;
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float freq = f[i];
    const float wavelen = 2.0f * static_cast<float>(M_PI) / freq;
    float scaled =
        wavelen > low_freq_wavelen ? freq / static_cast<float>(r.factor) : freq;
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
}

// transformers' _compute_yarn_parameters: a blend, per frequency, of the
// interpolated (/ factor) and the original (extrapolated) frequency; the
// correction range in double, the tables in f32.
void Yarn(const RopeConfig& r, int64_t dim, float* f) {
  const float theta = static_cast<float>(r.theta);
  const float factor = static_cast<float>(r.factor);
  const double d = static_cast<double>(dim);
  const double original = static_cast<double>(r.original_max_position);
  double low = YarnCorrectionDim(r.beta_fast, d, r.theta, original);
  double high = YarnCorrectionDim(r.beta_slow, d, r.theta, original);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, d - 1.0);
  if (low == high) high += 0.001;  // transformers' "prevent singularity".
  const float low_f = static_cast<float>(low);
  const float span = static_cast<float>(high - low);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float pos_freq =
        std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor * pos_freq);
    const float ramp =
        std::clamp((static_cast<float>(i) - low_f) / span, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    f[i] = interpolation * (1.0f - extrapolation_factor) +
           extrapolation * extrapolation_factor;
  }
}

// transformers' _compute_longrope_parameters: 1 / (ext[i] * theta^(2i/dim)),
// ext rounded to f32 (torch.tensor(list, float32)).
absl::StatusOr<Tensor> LongRopeInvFreq(const RopeConfig& r, int64_t dim,
                                       const std::vector<double>& ext,
                                       absl::string_view key) {
  if (static_cast<int64_t>(ext.size()) != dim / 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("longrope ", key, " has ", ext.size(),
                     " entries; the rotary dims need ", dim / 2));
  }
  ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kF32, {dim / 2}));
  float* f = t.data_as<float>();
  const float theta = static_cast<float>(r.theta);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float shape = static_cast<float>(2 * i) / static_cast<float>(dim);
    f[i] = 1.0f / (static_cast<float>(ext[i]) * std::pow(theta, shape));
  }
  return t;
}

}  // namespace

absl::StatusOr<RopeTables> ComputeRope(const ModelConfig& c) {
  const RopeConfig& r = c.rope;
  const int64_t dim = r.rotary_dim > 0 ? r.rotary_dim : c.head_dim;
  if (dim % 2 != 0 || dim < 2 || dim > c.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("RoPE rotates ", dim, " dims of head_dim ", c.head_dim,
                     "; it needs an even number in [2, head_dim]"));
  }
  RopeTables out;
  ASSIGN_OR_RETURN(out.inv_freq, Tensor::Empty(DType::kF32, {dim / 2}));
  float* f = out.inv_freq.data_as<float>();
  const float theta = static_cast<float>(r.theta);
  switch (r.scaling) {
    case RopeScaling::kNone:
      DefaultInvFreq(theta, dim, f);
      break;
    case RopeScaling::kLinear:
      DefaultInvFreq(theta, dim, f);
      for (int64_t i = 0; i < dim / 2; ++i) {
        f[i] = f[i] / static_cast<float>(r.factor);
      }
      break;
    case RopeScaling::kLlama3:
      DefaultInvFreq(theta, dim, f);
      Llama3(r, dim, f);
      break;
    case RopeScaling::kYarn:
      Yarn(r, dim, f);
      break;
    case RopeScaling::kDynamic: {
      // The table transformers starts from (seq_len = the original context):
      // its base in double, theta * (factor * L / L - (factor - 1))^(d/(d-2)),
      // then the f32 table of it. Longer sequences get theirs per step.
      const double original = static_cast<double>(r.original_max_position);
      const double d = static_cast<double>(dim);
      const double base =
          r.theta * std::pow(r.factor * original / original - (r.factor - 1.0),
                             d / (d - 2.0));
      DefaultInvFreq(static_cast<float>(base), dim, f);
      RopeOptions& o = out.options;
      o.length_scaling = RopeLengthScaling::kDynamicNtk;
      o.original_max_len = static_cast<int32_t>(r.original_max_position);
      o.base = theta;
      o.factor = static_cast<float>(r.factor);
      o.factor_minus_one = static_cast<float>(r.factor - 1.0);
      o.exponent = static_cast<float>(d / (d - 2.0));
      break;
    }
    case RopeScaling::kLongRope: {
      ASSIGN_OR_RETURN(out.inv_freq,
                       LongRopeInvFreq(r, dim, r.short_factor, "short_factor"));
      ASSIGN_OR_RETURN(Tensor long_freq,
                       LongRopeInvFreq(r, dim, r.long_factor, "long_factor"));
      out.long_inv_freq = std::move(long_freq);
      out.options.length_scaling = RopeLengthScaling::kLongRope;
      out.options.original_max_len =
          static_cast<int32_t>(r.original_max_position);
      break;
    }
  }
  // transformers' attention_scaling: on the softmax where it is the same
  // function (see the header), else on cos and sin.
  if (r.attention_factor != 1.0) {
    if (dim == c.head_dim) {
      out.softmax_scale_factor = r.attention_factor * r.attention_factor;
    } else {
      out.options.cos_sin_scale = static_cast<float>(r.attention_factor);
    }
  }
  return out;
}

absl::StatusOr<Tensor> ComputeRopeInvFreq(const ModelConfig& config) {
  ASSIGN_OR_RETURN(RopeTables tables, ComputeRope(config));
  return std::move(tables.inv_freq);
}

}  // namespace tessera
