#include "kernels/cuda/gemm/gemm_plans.h"

#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/gemm/fp8_gemm.h"
#include "runtime/core/status.h"

namespace tessera {
namespace cuda {
namespace {

// "cublasLtMatmul failed while multiplying [4, 64] by [128, 64]ᵀ: ... (7)"
absl::Status LtStatus(cublasStatus_t status, absl::string_view call,
                      absl::string_view doing) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, " failed while ", doing, ": ",
                                          cublasGetStatusString(status), " (",
                                          static_cast<int>(status), ")"));
}

cublasLtHandle_t Handle(void* handle) {
  return static_cast<cublasLtHandle_t>(handle);
}

bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

}  // namespace

struct GemmPlans::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo;
  // The heuristic's candidates, best guess first; emptied once the fastest
  // of them is chosen (Tune) or when the plan is not tuned.
  std::vector<cublasLtMatmulAlgo_t> candidates;
  // fp8 plans: whether D is f32 (else bf16), and D's leading dimension.
  bool d_f32 = true;
  int64_t ldd = 0;
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    for (cublasLtMatrixLayout_t l : {a, b, c}) {
      if (l) cublasLtMatrixLayoutDestroy(l);
    }
  }
};

GemmPlans::GemmPlans(void* handle) : handle_(handle) {}

absl::StatusOr<std::unique_ptr<GemmPlans>> GemmPlans::Create() {
  cublasLtHandle_t handle;
  RETURN_IF_ERROR(LtStatus(cublasLtCreate(&handle), "cublasLtCreate",
                           "creating the cuBLASLt handle"));
  return std::unique_ptr<GemmPlans>(new GemmPlans(handle));
}

GemmPlans::~GemmPlans() {
  plans_.clear();  // The descriptors before the handle.
  if (handle_ != nullptr) cublasLtDestroy(Handle(handle_));
}

absl::StatusOr<GemmPlans::Plan*> GemmPlans::Find(int64_t t, int64_t n,
                                                 int64_t k, DType dtype) {
  const uint64_t key = (static_cast<uint64_t>(t) << 42) ^
                       (static_cast<uint64_t>(n) << 21) ^
                       static_cast<uint64_t>(k) ^
                       (dtype == DType::kBF16 ? (uint64_t{1} << 63) : 0);
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t in_type =
      dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  // Row-major out[T, N] = x[T, K] · W[N, K]ᵀ is, column-major,
  // out[N, T] = W[K, N]ᵀ · x[K, T].
  RETURN_IF_ERROR(LtStatus(
      cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
      "cublasLtMatmulDescCreate", "planning a matrix product"));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  RETURN_IF_ERROR(LtStatus(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                     &trans_a, sizeof(trans_a)),
      "cublasLtMatmulDescSetAttribute", "planning a matrix product"));
  RETURN_IF_ERROR(LtStatus(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                     &trans_b, sizeof(trans_b)),
      "cublasLtMatmulDescSetAttribute", "planning a matrix product"));
  RETURN_IF_ERROR(
      LtStatus(cublasLtMatrixLayoutCreate(&plan->a, in_type, k, n, k),
               "cublasLtMatrixLayoutCreate", "describing the weight"));
  RETURN_IF_ERROR(
      LtStatus(cublasLtMatrixLayoutCreate(&plan->b, in_type, k, t, k),
               "cublasLtMatrixLayoutCreate", "describing the input"));
  RETURN_IF_ERROR(
      LtStatus(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_32F, n, t, n),
               "cublasLtMatrixLayoutCreate", "describing the output"));
  cublasLtMatmulPreference_t pref;
  RETURN_IF_ERROR(LtStatus(cublasLtMatmulPreferenceCreate(&pref),
                           "cublasLtMatmulPreferenceCreate",
                           "planning a matrix product"));
  const size_t ws = kWorkspaceBytes;
  const cublasStatus_t set_workspace = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  if (set_workspace != CUBLAS_STATUS_SUCCESS) {
    cublasLtMatmulPreferenceDestroy(pref);
    return LtStatus(set_workspace, "cublasLtMatmulPreferenceSetAttribute",
                    "bounding the matrix product's workspace");
  }
  const bool tune = dtype == DType::kBF16 && t <= kMaxTunedRows;
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates];
  int found = 0;
  const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(
      Handle(handle_), plan->desc, plan->a, plan->b, plan->c, plan->c, pref,
      tune ? kTuneCandidates : 1, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  RETURN_IF_ERROR(LtStatus(heuristic, "cublasLtMatmulAlgoGetHeuristic",
                           absl::StrCat("finding an algorithm for [", t, ", ",
                                        k, "] x [", n, ", ", k, "]")));
  if (found == 0) {
    return absl::InternalError(absl::StrCat("cuBLASLt has no algorithm for [",
                                            t, ", ", k, "] x [", n, ", ", k,
                                            "] in ", DTypeName(dtype)));
  }
  plan->algo = results[0].algo;
  if (tune && found > 1) {
    for (int i = 0; i < found; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS) {
        plan->candidates.push_back(results[i].algo);
      }
    }
  }
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status GemmPlans::Tune(Plan* plan,
                             absl::FunctionRef<bool(const void* algo)> run,
                             cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    return absl::InternalError("cudaStreamIsCapturing failed before tuning");
  }
  // Timing needs a synchronization, which a capture cannot record: a product
  // first seen while capturing keeps the heuristic's first choice.
  if (capture != cudaStreamCaptureStatusNone) return absl::OkStatus();
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess ||
      cudaEventCreate(&stop) != cudaSuccess) {
    if (start != nullptr) cudaEventDestroy(start);
    cudaGetLastError();
    return absl::InternalError("cudaEventCreate failed while tuning a product");
  }
  float best_ms = -1.0f;
  cublasLtMatmulAlgo_t best = plan->algo;
  for (const cublasLtMatmulAlgo_t& algo : plan->candidates) {
    // One untimed run (first-touch costs), then the fastest of a few timed
    // ones: the choice needs only an ordering of the candidates.
    if (!run(&algo)) continue;
    float ms = -1.0f;
    for (int rep = 0; rep < kTuneRepetitions; ++rep) {
      float rep_ms = 0.0f;
      if (cudaEventRecord(start, stream) != cudaSuccess || !run(&algo) ||
          cudaEventRecord(stop, stream) != cudaSuccess ||
          cudaEventSynchronize(stop) != cudaSuccess ||
          cudaEventElapsedTime(&rep_ms, start, stop) != cudaSuccess) {
        ms = -1.0f;
        break;
      }
      if (ms < 0.0f || rep_ms < ms) ms = rep_ms;
    }
    if (ms >= 0.0f && (best_ms < 0.0f || ms < best_ms)) {
      best_ms = ms;
      best = algo;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  // A candidate that failed left its error behind; the chosen one runs next.
  cudaGetLastError();
  plan->algo = best;
  plan->candidates.clear();
  return absl::OkStatus();
}

absl::Status GemmPlans::Matmul(int64_t t, int64_t n, int64_t k, DType dtype,
                               const void* x, const void* w, float* out,
                               void* workspace, cudaStream_t stream) {
  ASSIGN_OR_RETURN(Plan * plan, Find(t, n, k, dtype));
  const float alpha = 1.0f, beta = 0.0f;
  if (!plan->candidates.empty()) {
    RETURN_IF_ERROR(Tune(
        plan,
        [&](const void* algo) {
          return cublasLtMatmul(Handle(handle_), plan->desc, &alpha, w, plan->a,
                                x, plan->b, &beta, out, plan->c, out, plan->c,
                                static_cast<const cublasLtMatmulAlgo_t*>(algo),
                                workspace, kWorkspaceBytes,
                                stream) == CUBLAS_STATUS_SUCCESS;
        },
        stream));
  }
  return LtStatus(
      cublasLtMatmul(Handle(handle_), plan->desc, &alpha, w, plan->a, x,
                     plan->b, &beta, out, plan->c, out, plan->c, &plan->algo,
                     workspace, kWorkspaceBytes, stream),
      "cublasLtMatmul",
      absl::StrCat("multiplying [", t, ", ", k, "] by [", n, ", ", k, "]ᵀ"));
}

int64_t GemmPlans::Fp8BlockScaleStride(int64_t k) {
  return RoundUp((k + 127) / 128, 4);
}

const char* GemmPlans::Fp8ScalingName(Fp8Scaling scaling) {
  return scaling == Fp8Scaling::kOuterVector
             ? "per-token x per-channel (OUTER_VEC_32F)"
             : "1x128-group x 128x128-block (VEC128_32F x BLK128x128_32F)";
}

absl::StatusOr<GemmPlans::Plan*> GemmPlans::FindFp8(const Fp8Key& key,
                                                    const float* x_scale,
                                                    const float* w_scale) {
  auto it = fp8_plans_.find(key);
  if (it != fp8_plans_.end()) return it->second.get();
  const int64_t t = key.t, n = key.n, k = key.k;
  const std::string shape =
      absl::StrCat("[", t, ", ", k, "] x [", n, ", ", k, "]ᵀ with ",
                   Fp8ScalingName(key.scaling), " scaling");
  const std::string doing = absl::StrCat("planning the fp8 product ", shape);
  auto plan = std::make_unique<Plan>();
  RETURN_IF_ERROR(LtStatus(
      cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
      "cublasLtMatmulDescCreate", doing));
  // cuBLASLt's fp8 kernels take "TN" only: A = w [k, n] column-major
  // transposed, B = x [k, t], D [n, t] column-major = row-major out [t, n].
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  const bool outer = key.scaling == Fp8Scaling::kOuterVector;
  const int32_t a_mode = outer ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                               : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const int32_t b_mode = outer ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                               : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const struct {
    cublasLtMatmulDescAttributes_t attribute;
    const void* value;
    size_t size;
  } attributes[] = {
      {CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)},
      {CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)},
      {CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)},
      {CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)},
      {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof(w_scale)},
      {CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale, sizeof(x_scale)},
  };
  for (const auto& a : attributes) {
    RETURN_IF_ERROR(LtStatus(cublasLtMatmulDescSetAttribute(
                                 plan->desc, a.attribute, a.value, a.size),
                             "cublasLtMatmulDescSetAttribute", doing));
  }
  RETURN_IF_ERROR(
      LtStatus(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_8F_E4M3, k, n, k),
               "cublasLtMatrixLayoutCreate", doing));
  RETURN_IF_ERROR(
      LtStatus(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_8F_E4M3, k, t, k),
               "cublasLtMatrixLayoutCreate", doing));
  cublasLtMatmulPreference_t pref;
  RETURN_IF_ERROR(LtStatus(cublasLtMatmulPreferenceCreate(&pref),
                           "cublasLtMatmulPreferenceCreate", doing));
  const size_t ws = kWorkspaceBytes;
  const cublasStatus_t set_workspace = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  if (set_workspace != CUBLAS_STATUS_SUCCESS) {
    cublasLtMatmulPreferenceDestroy(pref);
    return LtStatus(set_workspace, "cublasLtMatmulPreferenceSetAttribute",
                    doing);
  }
  const bool tune = t <= kMaxTunedRows;
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates];
  int found = 0;
  // f32 D first (the output as the op wants it); bf16 D where cuBLASLt has
  // no f32 algorithm for this mode and shape.
  const bool try_f32 = !key.bf16_only && !force_fp8_bf16_;
  absl::Status error;
  for (const bool f32 : {true, false}) {
    if (f32 && !try_f32) continue;
    const int64_t ldd = f32 ? n : RoundUp(n, 8);  // 16-byte columns.
    cublasLtMatrixLayout_t c = nullptr;
    error = LtStatus(cublasLtMatrixLayoutCreate(
                         &c, f32 ? CUDA_R_32F : CUDA_R_16BF, n, t, ldd),
                     "cublasLtMatrixLayoutCreate", doing);
    if (!error.ok()) break;
    found = 0;
    const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(
        Handle(handle_), plan->desc, plan->a, plan->b, c, c, pref,
        tune ? kTuneCandidates : 1, results, &found);
    // NOT_SUPPORTED is the heuristic's way of saying "none" for a mode and
    // shape it has no kernel for; anything else is an error.
    if (heuristic != CUBLAS_STATUS_SUCCESS &&
        heuristic != CUBLAS_STATUS_NOT_SUPPORTED) {
      error = LtStatus(heuristic, "cublasLtMatmulAlgoGetHeuristic", doing);
    }
    if (error.ok() && heuristic == CUBLAS_STATUS_SUCCESS && found > 0) {
      plan->c = c;
      plan->d_f32 = f32;
      plan->ldd = ldd;
      break;
    }
    cublasLtMatrixLayoutDestroy(c);
    found = 0;
    if (!error.ok()) break;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  RETURN_IF_ERROR(error);
  if (found == 0) {
    return absl::UnimplementedError(
        absl::StrCat("cuBLASLt offers no fp8 algorithm (",
                     try_f32 ? "f32 or bf16" : "bf16", " output) for ", shape));
  }
  plan->algo = results[0].algo;
  if (tune && found > 1) {
    for (int i = 0; i < found; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS) {
        plan->candidates.push_back(results[i].algo);
      }
    }
  }
  Plan* raw = plan.get();
  fp8_plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status GemmPlans::RunFp8(Plan* plan, const Fp8Key& key, const void* x,
                               const float* x_scale, const void* w,
                               const float* w_scale, void* d, void* workspace,
                               cudaStream_t stream) {
  // The scale pointers are this call's (the plan was made with the first
  // call's); cuBLASLt reads the descriptor when the product is enqueued.
  RETURN_IF_ERROR(LtStatus(cublasLtMatmulDescSetAttribute(
                               plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                               &w_scale, sizeof(w_scale)),
                           "cublasLtMatmulDescSetAttribute",
                           "setting an fp8 weight scale"));
  RETURN_IF_ERROR(LtStatus(cublasLtMatmulDescSetAttribute(
                               plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                               &x_scale, sizeof(x_scale)),
                           "cublasLtMatmulDescSetAttribute",
                           "setting an fp8 input scale"));
  const float alpha = 1.0f, beta = 0.0f;
  auto run = [&](const cublasLtMatmulAlgo_t* algo) {
    return cublasLtMatmul(Handle(handle_), plan->desc, &alpha, w, plan->a, x,
                          plan->b, &beta, d, plan->c, d, plan->c, algo,
                          workspace, kWorkspaceBytes, stream);
  };
  if (!plan->candidates.empty()) {
    RETURN_IF_ERROR(Tune(
        plan,
        [&](const void* algo) {
          return run(static_cast<const cublasLtMatmulAlgo_t*>(algo)) ==
                 CUBLAS_STATUS_SUCCESS;
        },
        stream));
  }
  return LtStatus(run(&plan->algo), "cublasLtMatmul",
                  absl::StrCat("multiplying fp8 [", key.t, ", ", key.k,
                               "] by [", key.n, ", ", key.k, "]ᵀ with ",
                               Fp8ScalingName(key.scaling), " scaling"));
}

absl::Status GemmPlans::MatmulFp8(
    int64_t t, int64_t n, int64_t k, Fp8Scaling scaling, Fp8Operand x,
    Fp8Operand w, float* out, void* workspace,
    absl::FunctionRef<absl::StatusOr<void*>()> bf16_scratch,
    cudaStream_t stream) {
  const bool block = scaling == Fp8Scaling::kBlock;
  if (t <= 0 || n <= 0 || k <= 0 || k % 16 != 0 || n % 4 != 0 ||
      (block && t % 4 != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MatmulFp8: [", t, ", ", k, "] x [", n, ", ", k, "]ᵀ with ",
        Fp8ScalingName(scaling), " scaling needs k % 16 == 0, n % 4 == 0",
        block ? " and t % 4 == 0" : ""));
  }
  for (const void* p :
       {x.data, static_cast<const void*>(x.scale), w.data,
        static_cast<const void*>(w.scale), static_cast<const void*>(out),
        static_cast<const void*>(workspace)}) {
    if (p == nullptr || !Aligned16(p)) {
      return absl::InvalidArgumentError(
          "MatmulFp8: an operand, scale, output or workspace pointer is null "
          "or not 16-byte aligned");
    }
  }
  const Fp8Key key{t, n, k, scaling, false};
  ASSIGN_OR_RETURN(Plan * plan, FindFp8(key, x.scale, w.scale));
  if (plan->d_f32) {
    return RunFp8(plan, key, x.data, x.scale, w.data, w.scale, out, workspace,
                  stream);
  }
  // bf16 output: column chunks (weight rows) of at most max_cols through the
  // scratch, each widened into its columns of out.
  const int64_t max_cols = static_cast<int64_t>(kFp8Bf16ScratchBytes /
                                                (2 * static_cast<size_t>(t))) /
                           128 * 128;
  if (max_cols < 128) {
    return absl::FailedPreconditionError(absl::StrCat(
        "MatmulFp8: ", t, " rows with bf16 output need more than the ",
        kFp8Bf16ScratchBytes, " bytes of scratch of a 128-column chunk"));
  }
  ASSIGN_OR_RETURN(void* scratch, bf16_scratch());
  if (scratch == nullptr || !Aligned16(scratch)) {
    return absl::InvalidArgumentError(
        "MatmulFp8: the bf16 scratch is null or not 16-byte aligned");
  }
  const int64_t stride = Fp8BlockScaleStride(k);
  for (int64_t n0 = 0; n0 < n; n0 += max_cols) {
    const int64_t cols = std::min(max_cols, n - n0);
    const Fp8Key chunk{t, cols, k, scaling, true};
    // n0 is a multiple of 128: every offset below stays 16-byte aligned and
    // a block scale's row block starts at n0 / 128.
    const float* w_scale = block ? w.scale + (n0 / 128) * stride : w.scale + n0;
    const void* w_data = static_cast<const uint8_t*>(w.data) + n0 * k;
    Plan* p = plan;
    if (cols != n) {
      ASSIGN_OR_RETURN(p, FindFp8(chunk, x.scale, w_scale));
    }
    RETURN_IF_ERROR(RunFp8(p, cols != n ? chunk : key, x.data, x.scale, w_data,
                           w_scale, scratch, workspace, stream));
    RETURN_IF_ERROR(CudaStatus(
        LaunchWidenBf16Rows(t, cols, scratch, p->ldd, out + n0, n, stream),
        "LaunchWidenBf16Rows", "widening an fp8 product's bf16 output"));
  }
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace tessera
