// Checks the NCCL and CUDA wrapping: prints the NCCL library version and, where
// GPUs are present, runs a single-process all-reduce over every visible GPU
// (ncclCommInitAll) and checks the sum. Without a GPU it says so and exits 0 (a
// build-and-link check).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <vector>

namespace {

bool Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    std::fprintf(stderr, "nccl_smoke: %s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}
bool Check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    std::fprintf(stderr, "nccl_smoke: %s: %s\n", what, ncclGetErrorString(r));
  return r == ncclSuccess;
}

}  // namespace

int main() {
  int version = 0;
  if (!Check(ncclGetVersion(&version), "ncclGetVersion")) return 1;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf(
        "nccl_smoke: NCCL %d linked; no CUDA device, all-reduce skipped\n",
        version);
    return 0;
  }
  constexpr size_t kCount = 1 << 20;
  std::vector<ncclComm_t> comms(devices);
  std::vector<int> ids(devices);
  for (int d = 0; d < devices; ++d) ids[d] = d;
  if (!Check(ncclCommInitAll(comms.data(), devices, ids.data()),
             "ncclCommInitAll"))
    return 1;
  std::vector<float*> buffers(devices);
  std::vector<cudaStream_t> streams(devices);
  for (int d = 0; d < devices; ++d) {
    std::vector<float> host(kCount, static_cast<float>(d + 1));
    if (!Check(cudaSetDevice(d), "cudaSetDevice") ||
        !Check(cudaMalloc(&buffers[d], kCount * sizeof(float)), "cudaMalloc") ||
        !Check(cudaMemcpy(buffers[d], host.data(), kCount * sizeof(float),
                          cudaMemcpyHostToDevice),
               "cudaMemcpy") ||
        !Check(cudaStreamCreate(&streams[d]), "cudaStreamCreate")) {
      return 1;
    }
  }
  if (!Check(ncclGroupStart(), "ncclGroupStart")) return 1;
  for (int d = 0; d < devices; ++d) {
    if (!Check(ncclAllReduce(buffers[d], buffers[d], kCount, ncclFloat, ncclSum,
                             comms[d], streams[d]),
               "ncclAllReduce")) {
      return 1;
    }
  }
  if (!Check(ncclGroupEnd(), "ncclGroupEnd")) return 1;
  const float want = devices * (devices + 1) / 2.0f;
  bool ok = true;
  for (int d = 0; d < devices; ++d) {
    std::vector<float> host(kCount);
    cudaSetDevice(d);
    ok &= Check(cudaStreamSynchronize(streams[d]), "cudaStreamSynchronize") &&
          Check(cudaMemcpy(host.data(), buffers[d], kCount * sizeof(float),
                           cudaMemcpyDeviceToHost),
                "cudaMemcpy");
    for (float v : host) ok &= v == want;
    cudaFree(buffers[d]);
    cudaStreamDestroy(streams[d]);
    ncclCommAbort(
        comms[d]);  // Abort, not destroy: teardown must never wait on a peer.
  }
  std::printf("nccl_smoke: NCCL %d, %d device(s), all-reduce %s\n", version,
              devices, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
