// Exercises the MPI layer across ranks: MpiWorld, SplitGrid, ControlChannel and
// MpiCommunicator. Run under mpirun (see mpi_layer_test.sh) with any number of
// ranks; checks that need a particular size say so and pass trivially
// elsewhere.
//
// Every check runs on every rank; the ranks' verdicts are gathered and rank 0
// prints one line per check: "PASS <name>" or "FAIL <name> (ranks ...)", and a
// failing rank prints its reason on stderr. The exit code is non-zero if any
// check failed anywhere. Rank 0 prints "RUN <name>" before each check, so a
// hang (cut short by the script's timeout) shows where it happened.
//
// With --large, tensors above 2 GiB exercise the chunked paths at full size.
// With --verbose, every error that a check expects is printed as well.
// With --abort, rank 1 calls MpiWorld::Abort while rank 0 waits in a barrier
// that can never complete: the job must end at once with the abort's line.
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "parallel/control_channel.h"
#include "parallel/fault_monitor.h"
#include "parallel/mpi_communicator.h"
#include "parallel/mpi_world.h"
#include "parallel/process_grid.h"
#include "parallel/testdata/framing_test.pb.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"

namespace tessera {
namespace {

using ::tessera::parallel::testing::TestMessage;

constexpr int kTag = 11;

// --verbose: print every error a check expected, so that a person can read
// the messages users will see.
bool verbose = false;

absl::Status Require(bool condition, absl::string_view what) {
  if (condition) return absl::OkStatus();
  return absl::InternalError(what);
}

// OK when `status` has `code` and every piece of text in `parts`.
absl::Status ExpectError(const absl::Status& status, absl::StatusCode code,
                         std::initializer_list<absl::string_view> parts) {
  if (verbose) {
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "rank %d expected error: %s\n", rank,
                 status.ToString().c_str());
  }
  if (status.code() != code) {
    return absl::InternalError(absl::StrCat("expected ",
                                            absl::StatusCodeToString(code),
                                            ", got ", status.ToString()));
  }
  for (absl::string_view part : parts) {
    if (status.message().find(part) == absl::string_view::npos) {
      return absl::InternalError(
          absl::StrCat("error lacks \"", part, "\": ", status.ToString()));
    }
  }
  return absl::OkStatus();
}

std::string Pattern(size_t bytes, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string out(bytes, '\0');
  for (char& c : out) c = static_cast<char>(gen());
  return out;
}

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> out(n);
  for (float& v : out) v = dist(gen);
  return out;
}

TestMessage MakeMessage(int id, size_t payload_bytes) {
  TestMessage msg;
  msg.set_id(id);
  msg.set_text(absl::StrCat("message ", id));
  msg.set_payload(Pattern(payload_bytes, 1000 + id));
  msg.add_values(id);
  // -id * 2^33, a value past 32 bits (as a product: a left shift of a
  // negative value is undefined behaviour, and UBSan stops on it).
  msg.add_values(int64_t{id} * -(int64_t{1} << 33));
  return msg;
}

absl::Status SameMessage(const TestMessage& got, const TestMessage& want) {
  return Require(
      got.SerializeAsString() == want.SerializeAsString(),
      absl::StrCat("message id ", got.id(), " (", got.payload().size(),
                   "-byte payload) differs "
                   "from the expected id ",
                   want.id(), " (", want.payload().size(), " bytes)"));
}

class Suite {
 public:
  explicit Suite(MpiWorld* world) : world_(world) {}

  // Runs `check` on this rank and gathers every rank's verdict.
  void Run(const std::string& name,
           const std::function<absl::Status()>& check) {
    if (rank() == 0) {
      std::printf("RUN %s\n", name.c_str());
      std::fflush(stdout);
    }
    const absl::Status status = check();
    if (!status.ok()) {
      std::fprintf(stderr, "rank %d: %s: %s\n", rank(), name.c_str(),
                   std::string(status.message()).c_str());
      std::fflush(stderr);
    }
    int ok = status.ok() ? 1 : 0;
    std::vector<int> all(size());
    const int rc =
        MPI_Allgather(&ok, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
    std::vector<int> failed_ranks;
    for (int r = 0; r < size(); ++r) {
      if (rc != MPI_SUCCESS || all[r] == 0) failed_ranks.push_back(r);
    }
    if (failed_ranks.empty()) {
      ++passed_;
    } else {
      ++failed_;
    }
    if (rank() == 0) {
      if (failed_ranks.empty()) {
        std::printf("PASS %s\n", name.c_str());
      } else {
        std::printf("FAIL %s (ranks %s)\n", name.c_str(),
                    absl::StrJoin(failed_ranks, ",").c_str());
      }
      std::fflush(stdout);
    }
  }

  int rank() const { return world_->rank(); }
  int size() const { return world_->size(); }
  int passed() const { return passed_; }
  int failed() const { return failed_; }

 private:
  MpiWorld* world_;
  int passed_ = 0;
  int failed_ = 0;
};

// ---- world and grid --------------------------------------------------------

absl::Status CheckWorld(const MpiWorld& world) {
  RETURN_IF_ERROR(Require(world.rank() >= 0 && world.rank() < world.size(),
                          "rank outside [0, size)"));
  const char* size_env = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (size_env != nullptr) {
    RETURN_IF_ERROR(
        Require(std::atoi(size_env) == world.size(),
                absl::StrCat("size ", world.size(),
                             " but OMPI_COMM_WORLD_SIZE=", size_env)));
  }
  const char* local_env = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (local_env != nullptr) {
    RETURN_IF_ERROR(
        Require(std::atoi(local_env) == world.local_rank(),
                absl::StrCat("local_rank ", world.local_rank(),
                             " but OMPI_COMM_WORLD_LOCAL_RANK=", local_env)));
  }
  return Require(world.local_rank() >= 0 &&
                     world.local_rank() < world.local_size() &&
                     world.local_size() <= world.size(),
                 absl::StrCat("local_rank ", world.local_rank(), " of ",
                              world.local_size()));
}

// The world ranks of `comm`'s members, in the order of their rank in it.
absl::StatusOr<std::vector<int>> Members(const MpiComm& comm, int world_rank) {
  std::vector<int> out(comm.size());
  const int rc = MPI_Allgather(&world_rank, 1, MPI_INT, out.data(), 1, MPI_INT,
                               comm.get());
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Allgather", "members");
  return out;
}

absl::Status CheckGridSplit(int world_rank, int world_size, int tp, int pp) {
  ASSIGN_OR_RETURN(const ProcessGrid grid,
                   ProcessGrid::Create(world_size, tp, pp));
  ASSIGN_OR_RETURN(GridComms comms, SplitGrid(grid, world_rank));
  const GridPosition pos = grid.Position(world_rank);
  ASSIGN_OR_RETURN(const std::vector<int> tp_members,
                   Members(comms.tp, world_rank));
  ASSIGN_OR_RETURN(const std::vector<int> pp_members,
                   Members(comms.pp, world_rank));
  std::vector<int> want_tp, want_pp;
  for (int t = 0; t < tp; ++t) want_tp.push_back(grid.RankOf(pos.pp_stage, t));
  for (int s = 0; s < pp; ++s) want_pp.push_back(grid.RankOf(s, pos.tp_rank));
  // The design's example, spelled out rather than derived from the same
  // arithmetic as ProcessGrid.
  if (world_size == 4 && tp == 2 && pp == 2) {
    const std::vector<std::vector<int>> tp_groups = {{0, 1}, {2, 3}};
    const std::vector<std::vector<int>> pp_groups = {{0, 2}, {1, 3}};
    want_tp = tp_groups[world_rank / 2];
    want_pp = pp_groups[world_rank % 2];
  }
  RETURN_IF_ERROR(
      Require(tp_members == want_tp,
              absl::StrCat("TP group {", absl::StrJoin(tp_members, ","),
                           "}, expected {", absl::StrJoin(want_tp, ","), "}")));
  RETURN_IF_ERROR(
      Require(pp_members == want_pp,
              absl::StrCat("PP group {", absl::StrJoin(pp_members, ","),
                           "}, expected {", absl::StrJoin(want_pp, ","), "}")));
  return Require(
      comms.tp.rank() == pos.tp_rank && comms.pp.rank() == pos.pp_stage,
      "group ranks differ from the grid position");
}

absl::Status CheckGridMismatch(int world_rank, int world_size) {
  ASSIGN_OR_RETURN(const ProcessGrid grid,
                   ProcessGrid::Create(2 * world_size, 2 * world_size, 1));
  return ExpectError(SplitGrid(grid, world_rank).status(),
                     absl::StatusCode::kInvalidArgument,
                     {absl::StrCat("the job has ", world_size, " ranks")});
}

absl::Status CheckCommRaii(const MpiWorld& world) {
  ASSIGN_OR_RETURN(MpiComm dup, MpiComm::Dup(world.comm(), "dup"));
  int result = MPI_UNEQUAL;
  MPI_Comm_compare(dup.get(), MPI_COMM_WORLD, &result);
  RETURN_IF_ERROR(Require(result == MPI_CONGRUENT, "Dup is not congruent"));
  MpiComm moved = std::move(dup);
  RETURN_IF_ERROR(Require(dup.is_null() && !moved.is_null(),  // NOLINT
                          "moved-from MpiComm still holds a communicator"));
  // Borrowed world: destroying the wrapper must leave MPI_COMM_WORLD usable.
  {
    ASSIGN_OR_RETURN(MpiComm borrowed,
                     MpiComm::Borrow(MPI_COMM_WORLD, "borrowed world"));
  }
  return Require(MPI_Barrier(MPI_COMM_WORLD) == MPI_SUCCESS,
                 "MPI_COMM_WORLD unusable after a borrowed wrapper died");
}

// ---- control channel -------------------------------------------------------

absl::Status CheckBroadcastLarge(ControlChannel& channel) {
  const TestMessage want = MakeMessage(5, 5 << 20);
  TestMessage msg;
  if (channel.rank() == 0) msg = want;
  RETURN_IF_ERROR(channel.Broadcast(&msg, 0));
  RETURN_IF_ERROR(SameMessage(msg, want));
  // From another root, into messages that already hold something.
  const int root = channel.size() - 1;
  const TestMessage small = MakeMessage(77, 100);
  TestMessage other = MakeMessage(1, 10);
  if (channel.rank() == root) other = small;
  RETURN_IF_ERROR(channel.Broadcast(&other, root));
  return SameMessage(other, small);
}

absl::Status CheckBroadcastEmpty(ControlChannel& channel) {
  TestMessage msg = MakeMessage(3, 10);
  if (channel.rank() == 0) msg.Clear();
  RETURN_IF_ERROR(channel.Broadcast(&msg, 0));
  return Require(msg.ByteSizeLong() == 0,
                 "an empty broadcast left fields behind");
}

absl::Status CheckSendRecv(ControlChannel& channel) {
  if (channel.size() < 2) return absl::OkStatus();
  if (channel.rank() == 0) {
    for (int r = 1; r < channel.size(); ++r) {
      RETURN_IF_ERROR(channel.Send(MakeMessage(r, 1000 * r), r, kTag));
    }
    // Replies come in any order; kAnySource + `from` sorts them out.
    std::vector<bool> seen(channel.size(), false);
    for (int i = 1; i < channel.size(); ++i) {
      TestMessage reply;
      int from = -1;
      RETURN_IF_ERROR(
          channel.Recv(ControlChannel::kAnySource, kTag + 1, &reply, &from));
      RETURN_IF_ERROR(Require(from >= 1 && from < channel.size() && !seen[from],
                              absl::StrCat("reply from rank ", from)));
      seen[from] = true;
      RETURN_IF_ERROR(SameMessage(reply, MakeMessage(100 + from, 1 << 20)));
    }
    return absl::OkStatus();
  }
  TestMessage msg;
  RETURN_IF_ERROR(channel.Recv(0, kTag, &msg));
  RETURN_IF_ERROR(
      SameMessage(msg, MakeMessage(channel.rank(), 1000 * channel.rank())));
  return channel.Send(MakeMessage(100 + channel.rank(), 1 << 20), 0, kTag + 1);
}

absl::Status CheckPoll(ControlChannel& channel) {
  if (channel.size() < 2) return absl::OkStatus();
  const int last = channel.size() - 1;
  if (channel.rank() == last) {
    return channel.Send(MakeMessage(9, 10), 0, kTag + 2);
  }
  if (channel.rank() != 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(bool waiting, channel.Poll(last, kTag + 3));
  RETURN_IF_ERROR(Require(!waiting, "Poll saw a message nobody sent"));
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!waiting && std::chrono::steady_clock::now() < deadline) {
    ASSIGN_OR_RETURN(waiting,
                     channel.Poll(ControlChannel::kAnySource, kTag + 2));
  }
  RETURN_IF_ERROR(Require(waiting, "Poll never saw the message"));
  TestMessage msg;
  RETURN_IF_ERROR(channel.Recv(last, kTag + 2, &msg));
  return SameMessage(msg, MakeMessage(9, 10));
}

absl::Status CheckSendOversized(const MpiWorld& world) {
  ControlChannelOptions options;
  options.max_message_bytes = 1024;
  ASSIGN_OR_RETURN(ControlChannel channel,
                   ControlChannel::Create(world.comm(), options));
  if (channel.size() < 2) return absl::OkStatus();
  const TestMessage big = MakeMessage(1, 4096);
  const std::string size = absl::StrCat(big.ByteSizeLong(), " bytes");
  if (channel.rank() == 0) {
    RETURN_IF_ERROR(ExpectError(channel.Send(big, 1, kTag),
                                absl::StatusCode::kInvalidArgument,
                                {size, "limit of 1024 bytes"}));
    // The channel is still in step: the next message gets through.
    RETURN_IF_ERROR(channel.Send(MakeMessage(2, 10), 1, kTag));
  } else if (channel.rank() == 1) {
    TestMessage msg;
    // The receiver learns why instead of waiting forever.
    RETURN_IF_ERROR(ExpectError(
        channel.Recv(0, kTag, &msg), absl::StatusCode::kDataLoss,
        {"control message from rank 0", "could not send it", size}));
    RETURN_IF_ERROR(channel.Recv(0, kTag, &msg));
    RETURN_IF_ERROR(SameMessage(msg, MakeMessage(2, 10)));
  }
  // Broadcast: the root refuses, everyone else hears why.
  TestMessage msg = big;
  const absl::Status status = channel.Broadcast(&msg, 0);
  if (channel.rank() == 0) {
    RETURN_IF_ERROR(ExpectError(status, absl::StatusCode::kInvalidArgument,
                                {size, "limit of 1024 bytes"}));
  } else {
    RETURN_IF_ERROR(ExpectError(
        status, absl::StatusCode::kDataLoss,
        {"control message from rank 0 (broadcast)", "could not send it"}));
  }
  TestMessage after = channel.rank() == 0 ? MakeMessage(4, 100) : TestMessage();
  RETURN_IF_ERROR(channel.Broadcast(&after, 0));
  return SameMessage(after, MakeMessage(4, 100));
}

absl::Status CheckReceiverLimitSmaller(const MpiWorld& world) {
  // Rank 0 may send 1 MiB; the others accept only 1 KiB.
  ControlChannelOptions options;
  options.max_message_bytes = world.rank() == 0 ? (1 << 20) : 1024;
  ASSIGN_OR_RETURN(ControlChannel channel,
                   ControlChannel::Create(world.comm(), options));
  if (channel.size() < 2) return absl::OkStatus();
  const TestMessage big = MakeMessage(1, 4096);
  if (channel.rank() == 0) {
    RETURN_IF_ERROR(channel.Send(big, 1, kTag));
    RETURN_IF_ERROR(channel.Send(MakeMessage(2, 10), 1, kTag));
  } else if (channel.rank() == 1) {
    TestMessage msg;
    RETURN_IF_ERROR(ExpectError(channel.Recv(0, kTag, &msg),
                                absl::StatusCode::kDataLoss,
                                {"control message from rank 0 (tag 11)",
                                 absl::StrCat(big.ByteSizeLong(), "-byte"),
                                 "above this rank's limit of 1024 bytes"}));
    // The oversized frame was consumed, so the next one is the next message.
    RETURN_IF_ERROR(channel.Recv(0, kTag, &msg));
    RETURN_IF_ERROR(SameMessage(msg, MakeMessage(2, 10)));
  }
  TestMessage msg = channel.rank() == 0 ? big : TestMessage();
  const absl::Status status = channel.Broadcast(&msg, 0);
  if (channel.rank() == 0) {
    RETURN_IF_ERROR(status);
  } else {
    RETURN_IF_ERROR(ExpectError(status, absl::StatusCode::kDataLoss,
                                {"control message from rank 0 (broadcast)",
                                 "above the limit of 1024 bytes"}));
  }
  // Every rank took part in the payload broadcast, so they are still in step.
  TestMessage after = channel.rank() == 0 ? MakeMessage(4, 100) : TestMessage();
  RETURN_IF_ERROR(channel.Broadcast(&after, 0));
  return SameMessage(after, MakeMessage(4, 100));
}

absl::Status CheckRecvCorruptFrames(ControlChannel& channel) {
  if (channel.size() < 2) return absl::OkStatus();
  if (channel.rank() == 0) {
    // Bytes that no EncodeFrame produces, straight onto the channel's
    // communicator.
    const std::string garbage = std::string("\x0b\0\0\0\0\0\0\0", 8) +
                                "\x0f\xff\xff\xff\xff\xff"
                                "\xff\xff\xff\xff\xff";
    const std::string truncated =
        std::string("\x64\0\0\0\0\0\0\0", 8) + std::string(10, 'a');
    for (const std::string* bytes : {&garbage, &truncated}) {
      const int rc = MPI_Send(bytes->data(), static_cast<int>(bytes->size()),
                              MPI_BYTE, 1, kTag, channel.comm());
      if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Send", "raw bytes");
    }
    return absl::OkStatus();
  }
  if (channel.rank() != 1) return absl::OkStatus();
  TestMessage msg;
  RETURN_IF_ERROR(ExpectError(channel.Recv(0, kTag, &msg),
                              absl::StatusCode::kDataLoss,
                              {"control message from rank 0",
                               "does not parse as "
                               "tessera.parallel.testing.TestMessage"}));
  return ExpectError(channel.Recv(0, kTag, &msg), absl::StatusCode::kDataLoss,
                     {"control message from rank 0", "truncated",
                      "says 100 bytes but 10 follow"});
}

absl::Status CheckMpiErrorsAreStatuses(ControlChannel& channel) {
  // An invalid tag is refused by MPI itself: the Status must carry the call,
  // MPI's own text and what was being done — and the job must survive.
  const absl::Status status =
      channel.Send(MakeMessage(1, 1), channel.size() - 1, -5);
  RETURN_IF_ERROR(ExpectError(status, absl::StatusCode::kInternal,
                              {"MPI_Isend failed", "MPI_ERR_TAG",
                               "sending control message", "tag -5"}));
  return ExpectError(channel.Send(MakeMessage(1, 1), channel.size(), kTag),
                     absl::StatusCode::kInvalidArgument, {"is not a rank of"});
}

// ---- MpiCommunicator -------------------------------------------------------

MpiCommunicatorOptions ChunkedAt(size_t chunk) {
  MpiCommunicatorOptions options;
  options.max_chunk_bytes = chunk;
  return options;
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> WorldCommunicator(
    const MpiWorld& world, size_t chunk = size_t{1} << 30) {
  ASSIGN_OR_RETURN(MpiComm dup, MpiComm::Dup(world.comm(), "world-dup"));
  return MpiCommunicator::Create(std::move(dup), ChunkedAt(chunk));
}

// Sums random f32 over `comm`, whose members have world ranks `members`, and
// compares with the sum this rank computes from everyone's seed.
absl::Status CheckAllReduce(MpiCommunicator& comm,
                            const std::vector<int>& members, int world_rank,
                            size_t n) {
  std::vector<float> data = RandomFloats(n, 1234 + world_rank);
  RETURN_IF_ERROR(comm.AllReduceSum(
      TensorView(data.data(), DType::kF32, Shape{static_cast<int64_t>(n)})));
  std::vector<double> want(n, 0.0), scale(n, 0.0);
  for (int member : members) {
    const std::vector<float> theirs = RandomFloats(n, 1234 + member);
    for (size_t i = 0; i < n; ++i) {
      want[i] += theirs[i];
      scale[i] += std::fabs(theirs[i]);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    // f32 sums in MPI's order versus exact: a few ulps of the magnitudes.
    if (std::fabs(data[i] - want[i]) > 1e-6 * (scale[i] + 1e-3)) {
      return absl::InternalError(absl::StrCat("element ", i, ": got ", data[i],
                                              ", expected ", want[i]));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckAllReduceGroups(const MpiWorld& world, size_t chunk) {
  ASSIGN_OR_RETURN(auto all, WorldCommunicator(world, chunk));
  std::vector<int> everyone;
  for (int r = 0; r < world.size(); ++r) everyone.push_back(r);
  RETURN_IF_ERROR(
      Annotate(CheckAllReduce(*all, everyone, world.rank(), 100003), "world"));
  // And over both groups of the grid: tp = 2 where the world is even.
  const int tp = world.size() % 2 == 0 ? 2 : 1;
  ASSIGN_OR_RETURN(const ProcessGrid grid,
                   ProcessGrid::Create(world.size(), tp, world.size() / tp));
  ASSIGN_OR_RETURN(GridComms comms, SplitGrid(grid, world.rank()));
  ASSIGN_OR_RETURN(const std::vector<int> tp_members,
                   Members(comms.tp, world.rank()));
  ASSIGN_OR_RETURN(const std::vector<int> pp_members,
                   Members(comms.pp, world.rank()));
  ASSIGN_OR_RETURN(auto tp_comm, MpiCommunicator::Create(std::move(comms.tp),
                                                         ChunkedAt(chunk)));
  ASSIGN_OR_RETURN(auto pp_comm, MpiCommunicator::Create(std::move(comms.pp),
                                                         ChunkedAt(chunk)));
  RETURN_IF_ERROR(Annotate(
      CheckAllReduce(*tp_comm, tp_members, world.rank(), 4099), "tp group"));
  return Annotate(CheckAllReduce(*pp_comm, pp_members, world.rank(), 4099),
                  "pp group");
}

absl::Status CheckAllReduceRejectsBf16(const MpiWorld& world) {
  ASSIGN_OR_RETURN(auto comm, WorldCommunicator(world));
  uint16_t data[4] = {};
  return ExpectError(
      comm->AllReduceSum(TensorView(data, DType::kBF16, Shape{4})),
      absl::StatusCode::kInvalidArgument, {"bf16 [4]", "f32 only"});
}

absl::Status CheckAllGather(const MpiWorld& world, size_t chunk) {
  ASSIGN_OR_RETURN(auto comm, WorldCommunicator(world, chunk));
  const int n = comm->size();
  const int me = comm->rank();
  // f32 into a separate output.
  std::vector<float> in(15), out(15 * n, -1.0f);
  for (int i = 0; i < 15; ++i) in[i] = me * 1000 + i;
  RETURN_IF_ERROR(
      comm->AllGather(TensorView(in.data(), DType::kF32, Shape{3, 5}),
                      TensorView(out.data(), DType::kF32, Shape{3 * n, 5})));
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < 15; ++i) {
      if (out[r * 15 + i] != r * 1000 + i) {
        return absl::InternalError(
            absl::StrCat("f32 out[", r * 15 + i, "] = ", out[r * 15 + i]));
      }
    }
  }
  // i32, in place: this rank's block already sits at its slot of out.
  std::vector<int32_t> gathered(15 * n, -1);
  for (int i = 0; i < 15; ++i) gathered[me * 15 + i] = -(me * 1000 + i);
  const TensorView whole(gathered.data(), DType::kI32, Shape{3 * n, 5});
  RETURN_IF_ERROR(comm->AllGather(whole.Rows(3 * me, 3 * me + 3), whole));
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < 15; ++i) {
      if (gathered[r * 15 + i] != -(r * 1000 + i)) {
        return absl::InternalError(absl::StrCat("in-place i32 out[", r * 15 + i,
                                                "] = ", gathered[r * 15 + i]));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckAllGatherRejectsBadShapes(const MpiWorld& world) {
  ASSIGN_OR_RETURN(auto comm, WorldCommunicator(world));
  const int n = comm->size();
  std::vector<float> in(15), out(15 * n + 5);
  RETURN_IF_ERROR(ExpectError(
      comm->AllGather(TensorView(in.data(), DType::kF32, Shape{3, 5}),
                      TensorView(out.data(), DType::kF32, Shape{3 * n + 1, 5})),
      absl::StatusCode::kInvalidArgument,
      {"outer dimension must be", absl::StrCat(3 * n)}));
  RETURN_IF_ERROR(ExpectError(
      comm->AllGather(TensorView(in.data(), DType::kF32, Shape{3, 5}),
                      TensorView(out.data(), DType::kI32, Shape{3 * n, 5})),
      absl::StatusCode::kInvalidArgument, {"dtypes differ"}));
  return ExpectError(
      comm->AllGather(TensorView(in.data(), DType::kF32, Shape{3, 5}),
                      TensorView(out.data(), DType::kF32, Shape{3 * n, 4})),
      absl::StatusCode::kInvalidArgument, {"dimension 1 differs"});
}

// Pairs ranks (0,1), (2,3), ...; a rank without a partner sits out.
int Partner(const MpiCommunicator& comm) {
  const int partner = comm.rank() ^ 1;
  return partner < comm.size() ? partner : -1;
}

absl::Status CheckTensorSendRecv(const MpiWorld& world, size_t chunk,
                                 int64_t rows) {
  ASSIGN_OR_RETURN(auto comm, WorldCommunicator(world, chunk));
  const int partner = Partner(*comm);
  if (partner < 0) return absl::OkStatus();
  const size_t n = static_cast<size_t>(rows) * 33;
  const std::vector<float> mine = RandomFloats(n, 50 + comm->rank());
  const std::vector<float> theirs = RandomFloats(n, 50 + partner);
  std::vector<float> got(n, 0.0f);
  const TensorView send(const_cast<float*>(mine.data()), DType::kF32,
                        Shape{rows, 33});
  const TensorView recv(got.data(), DType::kF32, Shape{rows, 33});
  // Even ranks send first, so the blocking pair cannot deadlock.
  if (comm->rank() % 2 == 0) {
    RETURN_IF_ERROR(comm->Send(send, partner));
    RETURN_IF_ERROR(comm->Recv(recv, partner));
  } else {
    RETURN_IF_ERROR(comm->Recv(recv, partner));
    RETURN_IF_ERROR(comm->Send(send, partner));
  }
  return Require(got == theirs, "received tensor differs from the peer's");
}

absl::Status CheckTensorMismatch(const MpiWorld& world, size_t chunk) {
  ASSIGN_OR_RETURN(auto comm, WorldCommunicator(world, chunk));
  const int partner = Partner(*comm);
  if (partner < 0) return absl::OkStatus();
  std::vector<float> hundred(100, 1.5f), ninety_nine(99, 0.0f);
  std::vector<int32_t> ints(4, 0);
  const std::vector<float> follow_up = RandomFloats(8, 99);
  std::vector<float> got(8, 0.0f);
  if (comm->rank() % 2 == 0) {
    // The sender cannot know; its Sends succeed.
    RETURN_IF_ERROR(comm->Send(
        TensorView(hundred.data(), DType::kF32, Shape{100}), partner));
    RETURN_IF_ERROR(
        comm->Send(TensorView(hundred.data(), DType::kF32, Shape{4}), partner));
    RETURN_IF_ERROR(comm->Send(
        TensorView(const_cast<float*>(follow_up.data()), DType::kF32, Shape{8}),
        partner));
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(ExpectError(
      comm->Recv(TensorView(ninety_nine.data(), DType::kF32, Shape{99}),
                 partner),
      absl::StatusCode::kInvalidArgument,
      {"sent 400 bytes of f32", "expected 396 bytes of f32",
       absl::StrCat("from rank ", partner)}));
  RETURN_IF_ERROR(ExpectError(
      comm->Recv(TensorView(ints.data(), DType::kI32, Shape{4}), partner),
      absl::StatusCode::kInvalidArgument,
      {"sent 16 bytes of f32", "expected 16 bytes of i32"}));
  // Both refused transfers were consumed: the next Recv gets the next Send.
  RETURN_IF_ERROR(
      comm->Recv(TensorView(got.data(), DType::kF32, Shape{8}), partner));
  return Require(got == follow_up, "the transfer after a mismatch differs");
}

absl::Status CheckTensorBadPeers(const MpiWorld& world) {
  ASSIGN_OR_RETURN(auto comm, WorldCommunicator(world));
  float x = 0;
  const TensorView t(&x, DType::kF32, Shape{1});
  RETURN_IF_ERROR(ExpectError(comm->Send(t, comm->rank()),
                              absl::StatusCode::kInvalidArgument,
                              {"is this rank itself"}));
  return ExpectError(comm->Recv(t, comm->size()),
                     absl::StatusCode::kInvalidArgument,
                     {"is not a rank of the group"});
}

// Activations down the pipeline: each stage adds its stage number and passes
// the tensor on, as the PP forward pass does.
absl::Status CheckPipeline(const MpiWorld& world) {
  ASSIGN_OR_RETURN(const ProcessGrid grid,
                   ProcessGrid::Create(world.size(), 1, world.size()));
  ASSIGN_OR_RETURN(GridComms comms, SplitGrid(grid, world.rank()));
  ASSIGN_OR_RETURN(auto pp, MpiCommunicator::Create(std::move(comms.pp)));
  std::vector<float> act(1000, 0.0f);
  const TensorView view(act.data(), DType::kF32, Shape{10, 100});
  const int stage = pp->rank();
  if (stage > 0) RETURN_IF_ERROR(pp->Recv(view, stage - 1));
  for (float& v : act) v += stage;
  if (stage + 1 < pp->size()) RETURN_IF_ERROR(pp->Send(view, stage + 1));
  const float want = stage * (stage + 1) / 2.0f;
  return Require(act.front() == want && act.back() == want,
                 absl::StrCat("stage ", stage, " holds ", act.front(),
                              ", expected ", want));
}

absl::Status CheckBarrier(const MpiWorld& world) {
  ASSIGN_OR_RETURN(auto comm, WorldCommunicator(world));
  RETURN_IF_ERROR(comm->Barrier());
  if (comm->rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(comm->Barrier());
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  // Everyone else must have waited for rank 0's late arrival.
  return Require(comm->rank() == 0 || waited > 0.2,
                 absl::StrCat("left the barrier after ", waited,
                              " s while rank 0 slept 0.3 s"));
}

// With a FaultMonitor installed and a step armed, a wait for a peer that never
// sends (every rank waits on its partner) ends at the step's deadline as a
// stall fault naming the wait, instead of blocking forever; with no step
// armed the same polled waits still complete normally.
absl::Status CheckFaultDeadline(const MpiWorld& world) {
  ASSIGN_OR_RETURN(auto comm, WorldCommunicator(world));
  const int partner = Partner(*comm);
  FaultMonitorOptions options;
  options.step_timeout_seconds = 0.5;
  ASSIGN_OR_RETURN(std::unique_ptr<FaultMonitor> monitor,
                   FaultMonitor::Create(world, options));
  FaultMonitor::Install(monitor.get());
  absl::Cleanup uninstall = [] { FaultMonitor::Install(nullptr); };
  RETURN_IF_ERROR(comm->Barrier());  // A polled wait, unarmed: completes.
  // A rank without a partner (odd world) only joins the closing barrier.
  if (partner < 0) return comm->Barrier();
  float value = 0;
  const TensorView view(&value, DType::kF32, Shape{1});
  // The first step has a longer limit (fault_monitor.h): run one first.
  monitor->BeginStep(6);
  monitor->EndStep();
  monitor->BeginStep(7);
  const auto start = std::chrono::steady_clock::now();
  const absl::Status waited = comm->Recv(view, partner);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  monitor->EndStep();
  RETURN_IF_ERROR(
      Require(IsStallFault(waited) && IsRankLocal(waited),
              absl::StrCat("not a stall fault: ", waited.ToString())));
  RETURN_IF_ERROR(ExpectError(waited, absl::StatusCode::kDeadlineExceeded,
                              {"step 7 ran past its limit of 0.5 s", "Recv of",
                               absl::StrCat("from rank ", partner)}));
  RETURN_IF_ERROR(Require(took >= 0.45 && took < 3.0,
                          absl::StrCat("the deadline hit after ", took, " s")));
  RETURN_IF_ERROR(Require(monitor->stalled() || took < 0.6,
                          "the watchdog did not mark the step stalled"));
  RETURN_IF_ERROR(Require(monitor->Name(partner).find(
                              absl::StrCat("rank ", partner, " (host ")) == 0,
                          monitor->Name(partner)));
  // A step of more tokens than any before gets a limit in proportion: 60 ms
  // for one token, then a 1000-token step may take 4 × 60 s.
  monitor->BeginStep(8, /*tokens=*/1);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  monitor->EndStep();
  monitor->BeginStep(9, /*tokens=*/1000);
  const double scaled = monitor->limit_seconds();
  monitor->EndStep();
  RETURN_IF_ERROR(Require(scaled >= 4 * 0.06 * 1000,
                          absl::StrCat("a 1000-token step's limit is ", scaled,
                                       " s after 60 ms for one token")));
  return comm->Barrier();
}

// Startup's progress-based deadline (fault_monitor.h, "Startup"): a peer's
// progress beacons keep a wait alive past the limit; without progress the
// wait ends at the limit, naming the phase.
absl::Status CheckFaultStartup(const MpiWorld& world) {
  ASSIGN_OR_RETURN(auto comm, WorldCommunicator(world));
  const int partner = Partner(*comm);
  FaultMonitorOptions options;
  options.step_timeout_seconds = 0.5;
  options.startup_timeout_seconds = 0.4;
  ASSIGN_OR_RETURN(std::unique_ptr<FaultMonitor> monitor,
                   FaultMonitor::Create(world, options));
  FaultMonitor::Install(monitor.get());
  absl::Cleanup uninstall = [] { FaultMonitor::Install(nullptr); };
  RETURN_IF_ERROR(comm->Barrier());
  float value = 0;
  const TensorView view(&value, DType::kF32, Shape{1});
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  if (partner >= 0) {
    // The lower rank of the pair "loads" for 1.2 s (three limits), making
    // progress every 20 ms, then sends; the higher one waits all along.
    monitor->BeginStartup("test phase");
    const auto start = Clock::now();
    if (comm->rank() < partner) {
      while (seconds_since(start) < 1.2) {
        monitor->Progress();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      RETURN_IF_ERROR(comm->Send(view, partner));
    } else {
      RETURN_IF_ERROR(comm->Recv(view, partner));
      const double took = seconds_since(start);
      RETURN_IF_ERROR(Require(
          took >= 1.1, absl::StrCat("the wait ended after ", took, " s")));
    }
  }
  monitor->EndStartup();
  RETURN_IF_ERROR(comm->Barrier());
  if (partner >= 0) {
    // Nobody makes progress: both ranks' waits end at the limit.
    monitor->BeginStartup("test phase");
    const auto start = Clock::now();
    const absl::Status waited = comm->Recv(view, partner);
    const double took = seconds_since(start);
    monitor->EndStartup();
    RETURN_IF_ERROR(
        Require(IsStallFault(waited) && IsRankLocal(waited),
                absl::StrCat("not a stall fault: ", waited.ToString())));
    RETURN_IF_ERROR(ExpectError(
        waited, absl::StatusCode::kDeadlineExceeded,
        {"startup (test phase) made no progress on any rank for 0.4 s",
         "Recv of", absl::StrCat("from rank ", partner)}));
    RETURN_IF_ERROR(
        Require(took >= 0.35 && took < 3.0,
                absl::StrCat("the deadline hit after ", took, " s")));
  }
  return comm->Barrier();
}

// ---- --large: tensors beyond an int count of bytes
// --------------------------- Not part of the Bazel test (a few GiB per rank
// and seconds of copying): mpirun -np 2 mpi_layer_test_bin --large, on a
// machine with ~8 GiB free.

constexpr size_t kLargeBytes = size_t{9} << 28;  // 2.25 GiB > INT_MAX.

absl::Status CheckLargeAllReduce(const MpiWorld& world) {
  ASSIGN_OR_RETURN(auto comm, WorldCommunicator(world));
  const size_t n = kLargeBytes / sizeof(float);
  std::vector<float> data(n);
  // Small integers: every partial sum is exact, so any order must agree.
  for (size_t i = 0; i < n; ++i) data[i] = (i % 1024) + world.rank();
  RETURN_IF_ERROR(comm->AllReduceSum(
      TensorView(data.data(), DType::kF32, Shape{static_cast<int64_t>(n)})));
  const int size = world.size();
  for (size_t i = 0; i < n; i += 4093) {
    const float want = size * (i % 1024) + size * (size - 1) / 2.0f;
    if (data[i] != want) {
      return absl::InternalError(
          absl::StrCat("element ", i, ": got ", data[i], ", expected ", want));
    }
  }
  const float last = size * ((n - 1) % 1024) + size * (size - 1) / 2.0f;
  return Require(data[n - 1] == last, "last element wrong");
}

absl::Status CheckLargeAllGather(const MpiWorld& world) {
  ASSIGN_OR_RETURN(auto comm, WorldCommunicator(world));
  const size_t block = kLargeBytes / 2 + 3;  // Above 1 GiB, odd.
  std::vector<uint8_t> in(block);
  for (size_t i = 0; i < block; ++i) in[i] = (i * 7 + world.rank() * 13) & 0xff;
  std::vector<uint8_t> out(block * world.size());
  RETURN_IF_ERROR(comm->AllGather(
      TensorView(in.data(), DType::kU8, Shape{static_cast<int64_t>(block)}),
      TensorView(out.data(), DType::kU8,
                 Shape{static_cast<int64_t>(block * world.size())})));
  for (int r = 0; r < world.size(); ++r) {
    for (size_t i = 0; i < block; i += (i + 1 < block ? 4099 : 1)) {
      const uint8_t want = (i * 7 + r * 13) & 0xff;
      if (out[r * block + i] != want) {
        return absl::InternalError(absl::StrCat("rank ", r, " byte ", i));
      }
    }
    if (out[r * block + block - 1] != (((block - 1) * 7 + r * 13) & 0xff)) {
      return absl::InternalError(absl::StrCat("rank ", r, " last byte"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLargeSendRecv(const MpiWorld& world) {
  ASSIGN_OR_RETURN(auto comm, WorldCommunicator(world));
  const int partner = Partner(*comm);
  if (partner < 0) return absl::OkStatus();
  const size_t n = kLargeBytes / sizeof(int32_t) + 1;
  std::vector<int32_t> data(n);
  const TensorView view(data.data(), DType::kI32,
                        Shape{static_cast<int64_t>(n)});
  if (comm->rank() % 2 == 0) {
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<int32_t>(i * 3);
    return comm->Send(view, partner);
  }
  RETURN_IF_ERROR(comm->Recv(view, partner));
  for (size_t i = 0; i < n; i += 4091) {
    if (data[i] != static_cast<int32_t>(i * 3)) {
      return absl::InternalError(absl::StrCat("element ", i));
    }
  }
  return Require(data[n - 1] == static_cast<int32_t>((n - 1) * 3),
                 "last element wrong");
}

int RunLargeSuite(MpiWorld& world) {
  Suite suite(&world);
  suite.Run("large_allreduce_sum_2.25gib",
            [&] { return CheckLargeAllReduce(world); });
  suite.Run("large_allgather_1.1gib_blocks",
            [&] { return CheckLargeAllGather(world); });
  suite.Run("large_tensor_send_recv_2.25gib",
            [&] { return CheckLargeSendRecv(world); });
  if (world.rank() == 0) {
    std::printf("mpi_layer_test --large: %d ranks: %d passed, %d failed\n",
                world.size(), suite.passed(), suite.failed());
  }
  return suite.failed() == 0 ? 0 : 1;
}

int RunSuite(MpiWorld& world) {
  Suite suite(&world);
  const int r = world.rank(), n = world.size();
  suite.Run("world_rank_size_local_rank", [&] { return CheckWorld(world); });
  suite.Run("comm_raii_dup_move_borrow", [&] { return CheckCommRaii(world); });
  for (int tp = 1; tp <= n; ++tp) {
    if (n % tp != 0) continue;
    suite.Run(absl::StrCat("grid_split_tp", tp, "_pp", n / tp),
              [&] { return CheckGridSplit(r, n, tp, n / tp); });
  }
  suite.Run("grid_split_rejects_wrong_world",
            [&] { return CheckGridMismatch(r, n); });

  absl::StatusOr<ControlChannel> channel = ControlChannel::Create(world.comm());
  if (!channel.ok()) world.Abort(1, channel.status().ToString());
  suite.Run("control_broadcast_5mb_bytes",
            [&] { return CheckBroadcastLarge(*channel); });
  suite.Run("control_broadcast_empty",
            [&] { return CheckBroadcastEmpty(*channel); });
  suite.Run("control_send_recv", [&] { return CheckSendRecv(*channel); });
  suite.Run("control_poll", [&] { return CheckPoll(*channel); });
  suite.Run("control_oversized_rejected_on_send",
            [&] { return CheckSendOversized(world); });
  suite.Run("control_receiver_limit_smaller",
            [&] { return CheckReceiverLimitSmaller(world); });
  suite.Run("control_corrupt_frames",
            [&] { return CheckRecvCorruptFrames(*channel); });
  suite.Run("control_mpi_errors_are_statuses",
            [&] { return CheckMpiErrorsAreStatuses(*channel); });

  suite.Run("allreduce_sum_f32",
            [&] { return CheckAllReduceGroups(world, size_t{1} << 30); });
  suite.Run("allreduce_sum_f32_chunked",
            [&] { return CheckAllReduceGroups(world, 4096); });
  suite.Run("allreduce_rejects_bf16",
            [&] { return CheckAllReduceRejectsBf16(world); });
  suite.Run("allgather",
            [&] { return CheckAllGather(world, size_t{1} << 30); });
  suite.Run("allgather_chunked", [&] { return CheckAllGather(world, 16); });
  suite.Run("allgather_rejects_bad_shapes",
            [&] { return CheckAllGatherRejectsBadShapes(world); });
  suite.Run("tensor_send_recv",
            [&] { return CheckTensorSendRecv(world, size_t{1} << 30, 64); });
  suite.Run("tensor_send_recv_chunked",
            [&] { return CheckTensorSendRecv(world, 1 << 20, 25000); });
  suite.Run("tensor_size_mismatch_reported",
            [&] { return CheckTensorMismatch(world, size_t{1} << 30); });
  suite.Run("tensor_size_mismatch_reported_chunked",
            [&] { return CheckTensorMismatch(world, 16); });
  suite.Run("tensor_bad_peers", [&] { return CheckTensorBadPeers(world); });
  suite.Run("pipeline_send_recv", [&] { return CheckPipeline(world); });
  suite.Run("barrier", [&] { return CheckBarrier(world); });
  suite.Run("fault_deadline", [&] { return CheckFaultDeadline(world); });
  suite.Run("fault_startup", [&] { return CheckFaultStartup(world); });

  if (r == 0) {
    std::printf("mpi_layer_test: %d ranks: %d passed, %d failed\n", n,
                suite.passed(), suite.failed());
  }
  return suite.failed() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  absl::StatusOr<std::unique_ptr<tessera::MpiWorld>> world =
      tessera::MpiWorld::Init(&argc, &argv);
  if (!world.ok()) {
    std::fprintf(stderr, "mpi_layer_test: %s\n",
                 world.status().ToString().c_str());
    return 1;
  }
  tessera::verbose = argc > 1 && std::strcmp(argv[1], "--verbose") == 0;
  if (argc > 1 && std::strcmp(argv[1], "--abort") == 0) {
    if ((*world)->rank() == 1) {
      (*world)->Abort(3, "deliberate abort from mpi_layer_test");
    }
    // Never completes: rank 1 does not come. Only the abort ends this.
    MPI_Barrier(MPI_COMM_WORLD);
    std::fprintf(stderr, "rank %d: left a barrier that rank 1 never joined\n",
                 (*world)->rank());
    return 1;
  }
  if (argc > 1 && std::strcmp(argv[1], "--large") == 0) {
    return tessera::RunLargeSuite(**world);
  }
  return tessera::RunSuite(**world);
}
