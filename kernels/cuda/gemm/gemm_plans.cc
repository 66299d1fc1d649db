#include "kernels/cuda/gemm/gemm_plans.h"

#include <cublasLt.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
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

}  // namespace

struct GemmPlans::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo;
  // The heuristic's candidates, best guess first; emptied once the fastest
  // of them is chosen (Tune) or when the plan is not tuned.
  std::vector<cublasLtMatmulAlgo_t> candidates;
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

absl::Status GemmPlans::Tune(Plan* plan, const void* x, const void* w,
                             float* out, void* workspace, cudaStream_t stream) {
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
  const float alpha = 1.0f, beta = 0.0f;
  float best_ms = -1.0f;
  cublasLtMatmulAlgo_t best = plan->algo;
  for (const cublasLtMatmulAlgo_t& algo : plan->candidates) {
    auto run = [&]() {
      return cublasLtMatmul(Handle(handle_), plan->desc, &alpha, w, plan->a, x,
                            plan->b, &beta, out, plan->c, out, plan->c, &algo,
                            workspace, kWorkspaceBytes, stream);
    };
    // One untimed run (first-touch costs), then the fastest of a few timed
    // ones: the choice needs only an ordering of the candidates.
    if (run() != CUBLAS_STATUS_SUCCESS) continue;
    float ms = -1.0f;
    for (int rep = 0; rep < kTuneRepetitions; ++rep) {
      float rep_ms = 0.0f;
      if (cudaEventRecord(start, stream) != cudaSuccess ||
          run() != CUBLAS_STATUS_SUCCESS ||
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
  if (!plan->candidates.empty()) {
    RETURN_IF_ERROR(Tune(plan, x, w, out, workspace, stream));
  }
  const float alpha = 1.0f, beta = 0.0f;
  return LtStatus(
      cublasLtMatmul(Handle(handle_), plan->desc, &alpha, w, plan->a, x,
                     plan->b, &beta, out, plan->c, out, plan->c, &plan->algo,
                     workspace, kWorkspaceBytes, stream),
      "cublasLtMatmul",
      absl::StrCat("multiplying [", t, ", ", k, "] by [", n, ", ", k, "]ᵀ"));
}

}  // namespace cuda
}  // namespace tessera
