// AsyncEngine on the demo checkpoint: many threads submitting at once get the
// tokens each request gets alone; cancellation frees KV blocks; a full queue
// refuses; bad requests fail through their stream; draining finishes
// in-flight work and refuses new requests.
#include "runtime/serve/async_engine.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "runtime/executor/local_executor.h"
#include "tests/test_paths.h"

namespace tessera {
namespace {

std::unique_ptr<LocalEngine> Demo(Ops* ops) {
  EngineOptions options;
  options.scheduler.max_num_seqs = 16;
  options.scheduler.max_num_batched_tokens = 256;
  KvCacheOptions kv;
  kv.memory_bytes = int64_t{32} << 20;
  auto local = LocalEngine::Load(DemoModelDir(), ops, options, kv);
  EXPECT_TRUE(local.ok()) << local.status();
  return local.ok() ? *std::move(local) : nullptr;
}

GenerationRequest Greedy(int seed, int64_t max_tokens) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, 511);
  GenerationRequest r;
  r.prompt_ids = {1};
  for (int i = 0; i < 5 + seed % 20; ++i) r.prompt_ids.push_back(id(rng));
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  return r;
}

// Reads a stream to the end, collecting the streamed tokens.
std::vector<int32_t> Drain(RequestStream& stream) {
  std::vector<int32_t> tokens;
  while (!stream.done()) {
    std::optional<TokenEvent> e = stream.Next(std::chrono::milliseconds(100));
    if (e) tokens.push_back(e->token);
  }
  return tokens;
}

// The hand-over policy, with times given explicitly: the first event and the
// last wake a blocked reader at once; the ones between wait until the
// interval has passed since the last wake-up (FlushIfDue), unless a later
// Push comes after the interval.
TEST(RequestStream, WakesForTheFirstAndLastEventAndOncePerInterval) {
  using Clock = RequestStream::Clock;
  using std::chrono::milliseconds;
  RequestStream stream;
  const Clock::duration interval = std::chrono::seconds(1);
  const Clock::time_point t0 = Clock::now();
  TokenEvent event;
  std::atomic<int> received{0};
  std::vector<Clock::time_point> made(4);
  // A reader blocked in Next, as an HTTP thread is between tokens.
  auto read_one = [&](int index) {
    return std::thread([&, index] {
      if (stream.Next(milliseconds(20000), &made[index])) ++received;
    });
  };
  auto wait_for_count = [&](int want) {
    for (int i = 0; i < 2000 && received.load() < want; ++i) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    return received.load();
  };

  std::thread reader = read_one(0);
  std::this_thread::sleep_for(milliseconds(50));  // The reader is waiting.
  event.token = 10;
  stream.Push(event, t0, interval);
  EXPECT_EQ(wait_for_count(1), 1) << "the first event wakes the reader";
  reader.join();

  reader = read_one(1);
  std::this_thread::sleep_for(milliseconds(50));
  event.token = 11;
  stream.Push(event, t0 + milliseconds(1), interval);  // Within the interval.
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(received.load(), 1) << "an event within the interval is held";
  stream.FlushIfDue(t0 + milliseconds(500), interval);  // Not due yet.
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(received.load(), 1);
  stream.FlushIfDue(t0 + milliseconds(1000), interval);  // Due.
  EXPECT_EQ(wait_for_count(2), 2) << "a due flush wakes the reader";
  reader.join();

  reader = read_one(2);
  std::this_thread::sleep_for(milliseconds(50));
  event.token = 12;
  event.finished = true;  // The last event: at once, whatever the interval.
  stream.Push(event, t0 + milliseconds(1001), interval);
  EXPECT_EQ(wait_for_count(3), 3) << "the last event wakes the reader";
  reader.join();
  EXPECT_EQ(made[0], t0);
  EXPECT_EQ(made[1], t0 + milliseconds(1));
  EXPECT_EQ(made[2], t0 + milliseconds(1001));
}

TEST(RequestStream, ZeroIntervalWakesForEveryEvent) {
  using Clock = RequestStream::Clock;
  RequestStream stream;
  const Clock::time_point t0 = Clock::now();
  TokenEvent event;
  for (int i = 0; i < 3; ++i) {
    std::atomic<bool> got{false};
    std::thread reader([&] {
      if (stream.Next(std::chrono::milliseconds(20000))) got = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    event.token = i;
    const Clock::time_point pushed = Clock::now();
    stream.Push(event, t0 + std::chrono::microseconds(i), Clock::duration{0});
    reader.join();
    // Woken at once, not at the end of its 20 s wait.
    EXPECT_LT(Clock::now() - pushed, std::chrono::seconds(5));
    EXPECT_TRUE(got.load());
  }
}

// The first Finish is the one a reader sees; events after it are dropped
// (an aborted request whose step still produced a token).
TEST(RequestStream, EventsAfterTheEndAreDropped) {
  RequestStream stream;
  const RequestStream::Clock::time_point now = RequestStream::Clock::now();
  TokenEvent event;
  event.token = 7;
  stream.Push(event, now, {});
  stream.Finish(absl::UnavailableError("aborted"));
  event.token = 8;
  stream.Push(event, now, {});
  stream.Finish(absl::InternalError("later"));
  std::optional<TokenEvent> got = stream.Next(std::chrono::milliseconds(0));
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->token, 7);
  EXPECT_FALSE(stream.Next(std::chrono::milliseconds(0)).has_value());
  EXPECT_TRUE(stream.done());
  EXPECT_EQ(stream.Wait().status(), absl::UnavailableError("aborted"));
}

TEST(AsyncEngine, ConcurrentSubmittersGetTheirOwnTokens) {
  CpuOps ops;
  std::unique_ptr<LocalEngine> reference = Demo(&ops);
  std::unique_ptr<LocalEngine> served = Demo(&ops);
  ASSERT_NE(reference, nullptr);
  ASSERT_NE(served, nullptr);
  constexpr int kClients = 24;
  std::vector<std::vector<int32_t>> want(kClients);
  for (int i = 0; i < kClients; ++i) {
    auto r = reference->engine().Generate(Greedy(i, 20 + i));
    ASSERT_TRUE(r.ok());
    want[i] = r->output_ids;
  }
  // A stream interval, so that tokens are also handed over in batches (by
  // Push after the interval and by the loop's flush after each step).
  AsyncEngine async(&served->engine(), 64, std::chrono::microseconds(2000));
  std::thread loop([&] { EXPECT_TRUE(async.Loop().ok()); });
  std::vector<std::vector<int32_t>> streamed(kClients), results(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      auto stream = async.Submit(Greedy(i, 20 + i));
      ASSERT_TRUE(stream.ok()) << stream.status();
      streamed[i] = Drain(**stream);
      auto result = (*stream)->Wait();
      ASSERT_TRUE(result.ok()) << result.status();
      results[i] = result->output_ids;
    });
  }
  for (std::thread& t : clients) t.join();
  async.Drain();
  loop.join();
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(results[i], want[i]) << "client " << i;
    EXPECT_EQ(streamed[i], want[i]) << "client " << i;
  }
  EXPECT_GT(async.engine_stats().scheduler.max_batch, 1);
  EXPECT_EQ(async.stats().accepted, kClients);
}

TEST(AsyncEngine, CancelEndsTheRequestAndFreesItsBlocks) {
  CpuOps ops;
  std::unique_ptr<LocalEngine> served = Demo(&ops);
  ASSERT_NE(served, nullptr);
  AsyncEngine async(&served->engine(), 8);
  std::thread loop([&] { EXPECT_TRUE(async.Loop().ok()); });
  auto stream = async.Submit(Greedy(1, 400));
  ASSERT_TRUE(stream.ok());
  int seen = 0;
  while (seen < 3) {
    if ((*stream)->Next(std::chrono::milliseconds(100))) ++seen;
  }
  async.Cancel((*stream)->id());
  auto result = (*stream)->Wait();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->finish_reason, FinishReason::kAbort);
  EXPECT_LT(result->output_ids.size(), 400u);
  async.Drain();
  loop.join();
  EXPECT_EQ(async.engine_stats().blocks.num_used_blocks, 0);
}

TEST(AsyncEngine, FullQueueRefusesAndBadRequestsFailThroughTheStream) {
  CpuOps ops;
  std::unique_ptr<LocalEngine> served = Demo(&ops);
  ASSERT_NE(served, nullptr);
  AsyncEngine async(&served->engine(), 2);
  // The loop is not running yet: both stay pending, the third is refused.
  auto a = async.Submit(Greedy(1, 5));
  GenerationRequest empty;
  empty.max_tokens = 5;
  auto b = async.Submit(empty);
  auto c = async.Submit(Greedy(2, 5));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(async.stats().rejected, 1);
  std::thread loop([&] { EXPECT_TRUE(async.Loop().ok()); });
  EXPECT_TRUE((*a)->Wait().ok());
  EXPECT_EQ((*b)->Wait().status().code(), absl::StatusCode::kInvalidArgument);
  // Room again once they are done.
  auto d = async.Submit(Greedy(3, 5));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE((*d)->Wait().ok());
  async.Drain();
  EXPECT_EQ(async.Submit(Greedy(4, 5)).status().code(),
            absl::StatusCode::kUnavailable);
  loop.join();
}

TEST(AsyncEngine, DrainFinishesInFlightRequests) {
  CpuOps ops;
  std::unique_ptr<LocalEngine> served = Demo(&ops);
  ASSERT_NE(served, nullptr);
  AsyncEngine async(&served->engine(), 8);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) {
    auto s = async.Submit(Greedy(i, 30));
    ASSERT_TRUE(s.ok());
    streams.push_back(*s);
  }
  async.Drain();  // Before the loop even starts: accepted work still runs.
  std::thread loop([&] { EXPECT_TRUE(async.Loop().ok()); });
  for (auto& s : streams) {
    auto r = s->Wait();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->output_ids.size(), 30u);
  }
  loop.join();
}

// Abort ends every open request with its error while the loop runs: the
// readers see the tokens so far, then the error; the engine frees their
// blocks, admission stops, and the loop returns.
TEST(AsyncEngine, AbortEndsEveryOpenRequestWithTheError) {
  CpuOps ops;
  std::unique_ptr<LocalEngine> served = Demo(&ops);
  ASSERT_NE(served, nullptr);
  AsyncEngine async(&served->engine(), 8);
  std::thread loop([&] { EXPECT_TRUE(async.Loop().ok()); });
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) {
    auto s = async.Submit(Greedy(i, 400));
    ASSERT_TRUE(s.ok());
    streams.push_back(*s);
  }
  // Every request is decoding.
  for (auto& s : streams) ASSERT_TRUE(s->Next(std::chrono::seconds(30)));
  EXPECT_EQ(async.open_requests(), 4);
  EXPECT_EQ(async.Abort(absl::UnavailableError("shutting down")), 4);
  for (auto& s : streams) {
    const std::vector<int32_t> rest = Drain(*s);
    EXPECT_LT(rest.size(), 399u);
    auto r = s->Wait();
    EXPECT_EQ(r.status(), absl::UnavailableError("shutting down"));
  }
  EXPECT_EQ(async.Submit(Greedy(9, 5)).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(async.state(), AsyncEngine::State::kDraining);
  loop.join();  // Returns: the aborted requests left the engine.
  EXPECT_EQ(async.open_requests(), 0);
  EXPECT_EQ(async.engine_stats().blocks.num_used_blocks, 0);
}

// Abort does not need the loop thread (it may be stuck in a step): requests
// waiting to enter and requests in the engine are told at once; a loop that
// runs later only cleans up.
TEST(AsyncEngine, AbortTellsReadersWithoutTheLoop) {
  CpuOps ops;
  std::unique_ptr<LocalEngine> served = Demo(&ops);
  ASSERT_NE(served, nullptr);
  AsyncEngine async(&served->engine(), 8);
  auto first = async.Submit(Greedy(1, 400));
  ASSERT_TRUE(first.ok());
  // One step's worth of admission, then the loop "hangs" (is not running).
  std::thread one_round([&] {
    async.Drain();  // Loop returns once nothing is open...
    // ...which is after Abort below; until then it steps the request.
    EXPECT_TRUE(async.Loop().ok());
  });
  ASSERT_TRUE((*first)->Next(std::chrono::seconds(30)));
  auto late = async.Submit(Greedy(2, 5));  // Draining: refused.
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(async.Abort(absl::InternalError("the job failed")), 1);
  EXPECT_EQ((*first)->Wait().status(), absl::InternalError("the job failed"));
  one_round.join();
  EXPECT_EQ(async.engine_stats().blocks.num_used_blocks, 0);

  // Nothing running at all: the waiting requests end at once.
  AsyncEngine idle(&served->engine(), 8);
  auto a = idle.Submit(Greedy(3, 5));
  auto b = idle.Submit(Greedy(4, 5));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(idle.Abort(absl::UnavailableError("bye")), 2);
  EXPECT_EQ((*a)->Wait().status(), absl::UnavailableError("bye"));
  EXPECT_EQ((*b)->Wait().status(), absl::UnavailableError("bye"));
  EXPECT_EQ(idle.open_requests(), 0);
  EXPECT_TRUE(idle.Loop().ok());  // Nothing left: returns at once.
  EXPECT_EQ(idle.stats().steps, 0);
}

// Renders id i as "<i>"; decoding `bad` fails (a tokenizer that cannot
// render one id).
class FailingTokenizer final : public Tokenizer {
 public:
  std::string TokenBytes(int32_t) const override { return std::string(); }
  explicit FailingTokenizer(int32_t bad) : bad_(bad) {}
  absl::StatusOr<std::vector<int32_t>> Encode(
      absl::string_view) const override {
    return absl::UnimplementedError("no Encode");
  }
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool) const override {
    std::string text;
    for (int32_t id : ids) {
      if (id == bad_) {
        return absl::DataLossError(absl::StrCat("cannot decode token ", id));
      }
      absl::StrAppend(&text, "<", id, ">");
    }
    return text;
  }
  int32_t vocab_size() const override { return 512; }
  bool IsSpecial(int32_t) const override { return false; }
  int32_t TokenToId(absl::string_view) const override { return -1; }
  int32_t bos_id() const override { return 1; }
  int32_t eos_id() const override { return 2; }

 private:
  int32_t bad_;
};

// A request that fails during a step (its detokenizer) ends its stream with
// the error, its last event carrying it; the request beside it streams to
// the end, the loop keeps running, and Drain still finds nothing open.
TEST(AsyncEngine, ARequestThatFailsInAStepEndsOnlyItsStream) {
  CpuOps ops;
  std::unique_ptr<LocalEngine> reference = Demo(&ops);
  ASSERT_NE(reference, nullptr);
  const GenerationRequest victim = Greedy(3, 30), other = Greedy(4, 30);
  auto want_victim = reference->engine().Generate(victim);
  auto want_other = reference->engine().Generate(other);
  ASSERT_TRUE(want_victim.ok() && want_other.ok());
  auto shows = [](const std::vector<int32_t>& ids, int32_t t) {
    return std::find(ids.begin(), ids.end(), t) != ids.end();
  };
  int32_t bad = -1;
  for (int32_t t : want_victim->output_ids) {
    if (!shows(other.prompt_ids, t) && !shows(want_other->output_ids, t) &&
        !shows(victim.prompt_ids, t)) {
      bad = t;
      break;
    }
  }
  ASSERT_GE(bad, 0);
  FailingTokenizer tokenizer(bad);
  EngineOptions options;
  options.scheduler.max_num_seqs = 16;
  options.scheduler.max_num_batched_tokens = 256;
  KvCacheOptions kv;
  kv.memory_bytes = int64_t{32} << 20;
  auto served =
      LocalEngine::Load(DemoModelDir(), &ops, options, kv, &tokenizer);
  ASSERT_TRUE(served.ok()) << served.status();
  AsyncEngine async(&(*served)->engine(), 8);
  auto failing = async.Submit(victim);
  auto fine = async.Submit(other);
  ASSERT_TRUE(failing.ok() && fine.ok());
  std::thread loop([&] { EXPECT_TRUE(async.Loop().ok()); });
  std::vector<TokenEvent> events;
  while (!(*failing)->done()) {
    if (auto e = (*failing)->Next(std::chrono::milliseconds(100))) {
      events.push_back(*e);
    }
  }
  const absl::StatusOr<GenerationResult> failed = (*failing)->Wait();
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kDataLoss)
      << failed.status();
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(events.back().finished);
  EXPECT_EQ(events.back().error, failed.status());
  EXPECT_EQ(Drain(**fine), want_other->output_ids);
  auto result = (*fine)->Wait();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->output_ids, want_other->output_ids);
  // The loop still serves.
  auto after = async.Submit(other);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE((*after)->Wait().ok());
  async.Drain();
  loop.join();
  EXPECT_EQ(async.engine_stats().blocks.num_used_blocks, 0);
}

// Requests with several parts share half of max_pending, so single requests
// always find room however many prompts others send; a group is admitted
// whole or not at all, and one that could never fit is InvalidArgument.
TEST(AsyncEngine, ManyPartRequestsCannotStarveSingleOnes) {
  CpuOps ops;
  auto local = Demo(&ops);
  ASSERT_NE(local, nullptr);
  AsyncEngine async(&local->engine(), /*max_pending=*/8);
  EXPECT_EQ(async.max_group_parts(), 4);
  auto group = [](int k) {
    std::vector<GenerationRequest> requests;
    for (int i = 0; i < k; ++i) requests.push_back(Greedy(i, 400));
    return requests;
  };
  auto too_big = async.SubmitGroup(group(5));
  EXPECT_TRUE(absl::IsInvalidArgument(too_big.status())) << too_big.status();
  auto first = async.SubmitGroup(group(4));
  ASSERT_TRUE(first.ok()) << first.status();
  // The many-part share is taken: another group waits (429)...
  EXPECT_TRUE(absl::IsResourceExhausted(async.SubmitGroup(group(2)).status()));
  // ...but single requests still get the other half.
  std::vector<std::shared_ptr<RequestStream>> singles;
  for (int i = 0; i < 4; ++i) {
    auto s = async.Submit(Greedy(10 + i, 400));
    ASSERT_TRUE(s.ok()) << "single " << i << ": " << s.status();
    singles.push_back(*s);
  }
  EXPECT_TRUE(absl::IsResourceExhausted(async.Submit(Greedy(20, 4)).status()));
  EXPECT_EQ(async.stats().accepted, 8);
  // Once the group ends, its share is free again.
  std::thread loop([&] { EXPECT_TRUE(async.Loop().ok()); });
  for (const auto& s : *first) async.Cancel(s->id());
  for (const auto& s : *first) (void)s->Wait();
  bool admitted = false;
  for (int i = 0; i < 200 && !admitted; ++i) {
    auto again = async.SubmitGroup(group(3));
    if (again.ok()) {
      admitted = true;
      for (const auto& s : *again) async.Cancel(s->id());
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  EXPECT_TRUE(admitted);
  for (const auto& s : singles) async.Cancel(s->id());
  async.Drain();
  loop.join();
  EXPECT_EQ(async.state(), AsyncEngine::State::kDraining);
}

}  // namespace
}  // namespace tessera
