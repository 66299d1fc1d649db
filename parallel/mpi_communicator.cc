#include "parallel/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "parallel/fault_monitor.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

// What precedes every Send's data. Fixed-width fields: both ends are the same
// build on the same architecture, so a memcpy of the struct is the format.
struct TensorHeader {
  uint64_t magic;
  uint64_t nbytes;
  uint64_t chunk_bytes;
  uint32_t dtype;
  uint32_t reserved;
};
static_assert(sizeof(TensorHeader) == 32, "TensorHeader must have no padding");
constexpr uint64_t kTensorMagic = 0x31524e5354535254ull;  // "TRSTSNR1"

std::string Describe(const TensorView& t) {
  return absl::StrCat(DTypeName(t.dtype()), " ", t.shape().ToString());
}

// Owns a committed derived datatype.
class ScopedType {
 public:
  ScopedType() = default;
  ScopedType(const ScopedType&) = delete;
  ScopedType& operator=(const ScopedType&) = delete;
  ~ScopedType() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }
  MPI_Datatype* out() { return &type_; }
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

// `bytes` contiguous bytes whose extent is `stride`: one element of it per
// rank lands rank r's piece at offset r * stride, which is how a chunk of
// each rank's block is gathered into its place in the output.
absl::Status MakeStridedBytes(int bytes, size_t stride, ScopedType* type) {
  ScopedType contiguous;
  int rc = MPI_Type_contiguous(bytes, MPI_BYTE, contiguous.out());
  if (rc != MPI_SUCCESS) {
    return MpiError(rc, "MPI_Type_contiguous",
                    absl::StrCat("building a ", bytes, "-byte datatype"));
  }
  rc = MPI_Type_create_resized(contiguous.get(), 0,
                               static_cast<MPI_Aint>(stride), type->out());
  if (rc != MPI_SUCCESS) {
    return MpiError(rc, "MPI_Type_create_resized",
                    absl::StrCat("giving a ", bytes, "-byte datatype a ",
                                 stride, "-byte extent"));
  }
  rc = MPI_Type_commit(type->out());
  if (rc != MPI_SUCCESS) {
    return MpiError(rc, "MPI_Type_commit",
                    absl::StrCat("committing a ", bytes, "-byte datatype"));
  }
  return absl::OkStatus();
}

bool Overlaps(const char* a, size_t a_bytes, const char* b, size_t b_bytes) {
  return a < b + b_bytes && b < a + a_bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(
    MpiComm comm, MpiCommunicatorOptions options) {
  if (comm.is_null()) {
    return absl::InvalidArgumentError(
        "MpiCommunicator::Create: the communicator is MPI_COMM_NULL");
  }
  if (options.max_chunk_bytes < 16 ||
      options.max_chunk_bytes > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MpiCommunicator: max_chunk_bytes ", options.max_chunk_bytes,
        " is outside [16, ", INT_MAX, "] (MPI counts are int)"));
  }
  return std::unique_ptr<MpiCommunicator>(
      new MpiCommunicator(std::move(comm), options));
}

absl::Status MpiCommunicator::AllReduceSum(const TensorView& inout) {
  if (inout.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllReduceSum over ", comm_.Describe(), ": ", Describe(inout),
        " is not f32; the MPI communicator sums "
        "f32 only"));
  }
  const size_t count = static_cast<size_t>(inout.numel());
  if (count == 0) return absl::OkStatus();
  if (inout.data() == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllReduceSum over ", comm_.Describe(), ": ",
                     Describe(inout), " has no data"));
  }
  // A group of one sums to itself; skipping MPI also keeps the no-op free.
  if (size() == 1) return absl::OkStatus();
  float* data = inout.data_as<float>();
  const size_t chunk = options_.max_chunk_bytes / sizeof(float);
  for (size_t begin = 0; begin < count; begin += chunk) {
    const int n = static_cast<int>(std::min(chunk, count - begin));
    const auto what = [&] {
      return absl::StrCat("AllReduceSum of ", Describe(inout), " (elements ",
                          begin, "..", begin + n, ") over ", comm_.Describe());
    };
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, data + begin, n, MPI_FLOAT,
                                  MPI_SUM, comm_.get(), &request);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Iallreduce", what());
    RETURN_IF_ERROR(WaitRequest(&request, nullptr, what));
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::AllGather(const TensorView& in,
                                        const TensorView& out) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllGather over ", comm_.Describe(), " of ", Describe(in),
                     " into ", Describe(out), ": ", why));
  };
  if (in.dtype() != out.dtype()) return bad("the dtypes differ");
  if (in.shape().rank() < 1) return bad("`in` needs an outer dimension");
  if (out.shape().rank() != in.shape().rank()) return bad("the ranks differ");
  if (out.shape()[0] != size() * in.shape()[0]) {
    return bad(absl::StrCat("out's outer dimension must be ", size(), " × ",
                            in.shape()[0], " = ", size() * in.shape()[0]));
  }
  for (int d = 1; d < in.shape().rank(); ++d) {
    if (in.shape()[d] != out.shape()[d]) {
      return bad(absl::StrCat("dimension ", d, " differs"));
    }
  }
  const size_t block = in.nbytes();
  if (block == 0) return absl::OkStatus();
  if (in.data() == nullptr || out.data() == nullptr) {
    return bad("a tensor has no data");
  }
  const char* in_bytes = static_cast<const char*>(in.data());
  char* out_bytes = static_cast<char*>(out.data());
  // MPI forbids aliasing send and receive buffers except through
  // MPI_IN_PLACE, which means "my block is already at its slot of out".
  const bool in_place = in_bytes == out_bytes + rank() * block;
  if (!in_place && Overlaps(in_bytes, block, out_bytes, out.nbytes())) {
    return bad("`in` overlaps `out` but is not this rank's slot of it");
  }
  const auto failed = [&](int rc, absl::string_view call, size_t offset) {
    const size_t end = std::min(block, offset + options_.max_chunk_bytes);
    return MpiError(
        rc, call,
        absl::StrCat("AllGather of ", Describe(in), " (bytes ", offset, "..",
                     end, " of each rank) over ", comm_.Describe()));
  };
  // A nonblocking gather + a polled wait (fault_monitor.h).
  const auto wait = [&](MPI_Request* request, size_t offset) {
    return WaitRequest(request, nullptr, [&] {
      return absl::StrCat("AllGather of ", Describe(in), " (from byte ", offset,
                          " of each rank) over ", comm_.Describe());
    });
  };
  if (block <= options_.max_chunk_bytes) {
    const int n = static_cast<int>(block);
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc =
        MPI_Iallgather(in_place ? MPI_IN_PLACE : in_bytes, n, MPI_BYTE,
                       out_bytes, n, MPI_BYTE, comm_.get(), &request);
    if (rc != MPI_SUCCESS) return failed(rc, "MPI_Iallgather", 0);
    return wait(&request, 0);
  }
  // Each rank's block is too large for one int count: gather it piece by
  // piece, each piece landing at the same offset in every rank's slot.
  for (size_t offset = 0; offset < block; offset += options_.max_chunk_bytes) {
    const int n =
        static_cast<int>(std::min(options_.max_chunk_bytes, block - offset));
    ScopedType strided;
    RETURN_IF_ERROR(
        Annotate(MakeStridedBytes(n, block, &strided),
                 absl::StrCat("AllGather over ", comm_.Describe())));
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : in_bytes + offset,
                                  n, MPI_BYTE, out_bytes + offset, 1,
                                  strided.get(), comm_.get(), &request);
    if (rc != MPI_SUCCESS) return failed(rc, "MPI_Iallgather", offset);
    RETURN_IF_ERROR(wait(&request, offset));
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::CheckPeer(absl::string_view op, int peer) const {
  if (peer < 0 || peer >= size() || peer == rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, " on ", comm_.Describe(), ": peer ", peer,
                     peer == rank() ? " is this rank itself"
                                    : " is not a rank of the group"));
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Send(const TensorView& tensor, int peer) {
  RETURN_IF_ERROR(CheckPeer("Send", peer));
  const size_t nbytes = tensor.nbytes();
  if (nbytes > 0 && tensor.data() == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("Send of ", Describe(tensor), " to rank ", peer, " on ",
                     comm_.Describe(), ": the tensor has no data"));
  }
  const auto failed = [&](int rc, absl::string_view part) {
    return MpiError(rc, "MPI_Isend",
                    absl::StrCat("Send of ", Describe(tensor), " (", part,
                                 ") to rank ", peer, " on ", comm_.Describe()));
  };
  const TensorHeader header{kTensorMagic, nbytes, options_.max_chunk_bytes,
                            static_cast<uint32_t>(tensor.dtype()), 0};
  // Each piece is a nonblocking send + a polled wait (fault_monitor.h), so a
  // peer that never receives cannot hold this rank past the step's deadline.
  const auto send = [&](const void* bytes, int n,
                        const std::string& part) -> absl::Status {
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc =
        MPI_Isend(bytes, n, MPI_BYTE, peer, kTensorTag, comm_.get(), &request);
    if (rc != MPI_SUCCESS) return failed(rc, part);
    return WaitRequest(&request, nullptr, [&] {
      return absl::StrCat("Send of ", Describe(tensor), " (", part,
                          ") to rank ", peer, " on ", comm_.Describe());
    });
  };
  RETURN_IF_ERROR(send(&header, sizeof(header), "header"));
  const char* data = static_cast<const char*>(tensor.data());
  for (size_t offset = 0; offset < nbytes; offset += options_.max_chunk_bytes) {
    const int n =
        static_cast<int>(std::min(options_.max_chunk_bytes, nbytes - offset));
    RETURN_IF_ERROR(send(data + offset, n,
                         absl::StrCat("bytes ", offset, "..", offset + n)));
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Discard(int peer, size_t nbytes,
                                      size_t chunk_bytes) {
  std::vector<char> scratch;
  for (size_t offset = 0; offset < nbytes; offset += chunk_bytes) {
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    RETURN_IF_ERROR(
        WaitProbe(peer, kTensorTag, comm_.get(), &message, &status, [&] {
          return absl::StrCat("discarding a refused tensor from rank ", peer,
                              " on ", comm_.Describe());
        }));
    int count = 0;
    int rc = MPI_Get_count(&status, MPI_BYTE, &count);
    if (rc == MPI_SUCCESS) {
      // Received in full, never truncated: Open MPI 4.1 crashes when a large
      // message is received into a smaller buffer.
      scratch.resize(std::max(count, 1));
      rc = MPI_Mrecv(scratch.data(), count, MPI_BYTE, &message, &status);
    }
    if (rc != MPI_SUCCESS) {
      return MpiError(rc, "MPI_Mrecv",
                      absl::StrCat("discarding a refused tensor from rank ",
                                   peer, " on ", comm_.Describe()));
    }
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Recv(const TensorView& tensor, int peer) {
  RETURN_IF_ERROR(CheckPeer("Recv", peer));
  const size_t nbytes = tensor.nbytes();
  const auto context = [&] {
    return absl::StrCat("Recv of ", Describe(tensor), " (", nbytes,
                        " bytes) from rank ", peer, " on ", comm_.Describe());
  };
  if (nbytes > 0 && tensor.data() == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(context(), ": the tensor has no data"));
  }
  // Probes each message before receiving it: MPI_Get_count says what the
  // peer sent, so a mismatch is reported, never truncated into the tensor.
  MPI_Message message = MPI_MESSAGE_NULL;
  MPI_Status status;
  int count = 0;
  const auto probe = [&]() -> absl::Status {
    RETURN_IF_ERROR(
        WaitProbe(peer, kTensorTag, comm_.get(), &message, &status, context));
    const int rc = MPI_Get_count(&status, MPI_BYTE, &count);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Get_count", context());
    return absl::OkStatus();
  };

  RETURN_IF_ERROR(probe());
  TensorHeader header{};
  if (count != static_cast<int>(sizeof(header))) {
    // Not a header: the two ranks' Send/Recv sequences disagree. Take the
    // message anyway so that it does not stay in the way.
    std::vector<char> scratch(std::max(count, 1));
    const int rc =
        MPI_Mrecv(scratch.data(), count, MPI_BYTE, &message, &status);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Mrecv", context());
    return absl::DataLossError(
        absl::StrCat(context(), ": expected the peer's ", sizeof(header),
                     "-byte tensor header, got a ", count,
                     "-byte message (the ranks' "
                     "Send/Recv sequences disagree)"));
  }
  int rc = MPI_Mrecv(&header, sizeof(header), MPI_BYTE, &message, &status);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Mrecv", context());
  if (header.magic != kTensorMagic || header.chunk_bytes == 0 ||
      header.chunk_bytes > static_cast<uint64_t>(INT_MAX)) {
    return absl::DataLossError(
        absl::StrCat(context(), ": the peer's tensor header is corrupt"));
  }
  const DType sent_dtype = static_cast<DType>(header.dtype);
  if (header.nbytes != nbytes || sent_dtype != tensor.dtype()) {
    RETURN_IF_ERROR(Discard(peer, header.nbytes, header.chunk_bytes));
    return absl::InvalidArgumentError(absl::StrCat(
        context(), ": the peer sent ", header.nbytes, " bytes of ",
        DTypeName(sent_dtype), ", this rank expected ", nbytes, " bytes of ",
        DTypeName(tensor.dtype()),
        " (the ranks disagree on the shape or dtype; the data was discarded)"));
  }
  // The sender's chunking decides the pieces, so the two ends agree even if
  // their options differ.
  char* data = static_cast<char*>(tensor.data());
  const size_t chunk = header.chunk_bytes;
  for (size_t offset = 0; offset < nbytes; offset += chunk) {
    const int expected = static_cast<int>(std::min(chunk, nbytes - offset));
    RETURN_IF_ERROR(probe());
    if (count != expected) {
      std::vector<char> scratch(std::max(count, 1));
      rc = MPI_Mrecv(scratch.data(), count, MPI_BYTE, &message, &status);
      if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Mrecv", context());
      return absl::DataLossError(absl::StrCat(context(), ": the piece at byte ",
                                              offset, " has ", count,
                                              " bytes, expected ", expected));
    }
    rc = MPI_Mrecv(data + offset, count, MPI_BYTE, &message, &status);
    if (rc != MPI_SUCCESS) {
      return MpiError(rc, "MPI_Mrecv",
                      absl::StrCat(context(), " (bytes ", offset, "..",
                                   offset + count, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Barrier() {
  const auto what = [&] {
    return absl::StrCat("Barrier over ", comm_.Describe());
  };
  MPI_Request request = MPI_REQUEST_NULL;
  const int rc = MPI_Ibarrier(comm_.get(), &request);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Ibarrier", what());
  return WaitRequest(&request, nullptr, what);
}

}  // namespace tessera
