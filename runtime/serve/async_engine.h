// AsyncEngine: the thread-safe front of rank 0's Engine for a server.
//
// HTTP threads Submit requests and read their tokens from a RequestStream;
// one thread (rank 0's main thread, the only one that talks to the other
// ranks) runs Loop(), which moves new requests and cancellations into the
// engine between steps and steps while there is work. So HTTP threads never
// block the step loop, and the engine itself stays single-threaded.
//
// Admission is by group: the engine requests of one HTTP request (its
// prompts x n choices) enter together or not at all (SubmitGroup), so that a
// request is never half admitted. At most `max_pending` requests may be
// waiting to enter the engine or running in it, and a request with several
// parts must not starve single ones:
//  - a group of one is admitted while fewer than max_pending are open;
//  - a group of k > 1 is admitted while open + k <= max_pending and the parts
//    of all open multi-part groups, these k included, stay within
//    max_group_parts() = max(1, max_pending / 2). So multi-part requests
//    together hold at most half of the places, and single requests always
//    find the other half, however many prompts others send;
//  - a group larger than max_group_parts() can never be admitted:
//    InvalidArgument (the server answers 400, naming the limit) rather than a
//    429 that a client would retry forever.
// Refusals are ResourceExhausted (the server answers 429). Shutdown: Drain()
// stops admission (Submit is Unavailable) and lets Loop() return once every
// accepted request has finished; Abort() ends every open request at once with
// an error (the drain's deadline passed, or the job is failing), from any
// thread, even while the loop thread is stuck inside a step. state() says
// whether the engine serves, is draining, or has failed (GET /health answers
// 503 for the last two). Metrics: set_observer's EngineObserver
// (engine_observer.h) hears of every step, token and request end.
#ifndef TESSERA_RUNTIME_SERVE_ASYNC_ENGINE_H_
#define TESSERA_RUNTIME_SERVE_ASYNC_ENGINE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/engine/engine.h"
#include "runtime/serve/engine_observer.h"

namespace tessera {

// One request's output as its reader sees it: events in order, then the
// result. Filled by the loop thread, read by one HTTP thread.
//
// Waking the reader costs a futex call and a context switch per wake-up
// (tens of microseconds on a virtual machine), which is more than a decode
// step of a small model. So the reader is woken for the first event, the last
// one, and otherwise at most once per `stream_interval` (AsyncEngine's
// option): tokens that come faster are handed over together, at most one
// interval (or, during a longer step, that step) late. Each event keeps the
// time it was made, so latency metrics do not depend on the hand-over.
class RequestStream {
 public:
  using Clock = std::chrono::steady_clock;

  // Waits up to `timeout` for the next event. nullopt when none arrived in
  // time or the request is over and every event was read (done() tells).
  // `made_at` (optional) receives the time the engine produced the event.
  std::optional<TokenEvent> Next(std::chrono::milliseconds timeout,
                                 Clock::time_point* made_at = nullptr);
  // Whether the request has ended and every event has been read.
  bool done() const;
  // Waits up to `timeout` until an event can be read or the request has
  // ended (nothing is taken); true if so.
  bool WaitReady(std::chrono::milliseconds timeout);
  // Waits for the end and returns the result (or the error that ended it).
  absl::StatusOr<GenerationResult> Wait();
  int64_t id() const { return id_; }

  // The producer side (AsyncEngine's loop thread; public for tests). Push
  // adds an event made at `now` and wakes the reader per the interval
  // (above); FlushIfDue wakes it when events are held back and the last
  // wake-up is `interval` or more before `now`; Finish ends the stream and
  // always wakes. Only the first Finish counts, and events pushed after it
  // are dropped: an aborted stream ends with the abort's error, whatever the
  // engine still produces for it.
  void Push(const TokenEvent& event, Clock::time_point now,
            Clock::duration interval);
  void FlushIfDue(Clock::time_point now, Clock::duration interval);
  void Finish(absl::StatusOr<GenerationResult> result);

 private:
  friend class AsyncEngine;
  struct Made {
    TokenEvent event;
    Clock::time_point at;
  };

  int64_t id_ = 0;      // The AsyncEngine's id (not the engine's).
  bool multi_ = false;  // Part of a group of several (AsyncEngine's mu_).
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Made> events_;
  bool woken_once_ = false;      // The first event went out at once.
  Clock::time_point last_wake_;  // When the reader was last woken.
  bool held_back_ = false;       // Events pushed since then, not yet woken.
  std::optional<absl::StatusOr<GenerationResult>> result_;

  // For the EngineObserver. Set by SubmitGroup before the stream is shared;
  // then written only by the loop thread (admitted_, last_token_,
  // generated_), and read when the request ends (RecordEndLocked).
  Clock::time_point arrival_, submitted_, admitted_, last_token_;
  bool admitted_set_ = false;
  int64_t prompt_tokens_ = 0;
  int64_t max_tokens_ = 0;
  int64_t generated_ = 0;
};

class AsyncEngine {
 public:
  enum class State { kServing, kDraining, kFailed };

  struct Stats {
    int64_t waiting = 0;   // Submitted, not yet in the engine.
    int64_t accepted = 0;  // Ever accepted.
    int64_t rejected = 0;  // Refused because the queue was full.
    int64_t steps = 0;     // Engine steps run by Loop().
    // Wall time inside Engine::Step, and in the rest of Loop() while it had
    // work (admission, cancellation, statistics): what the server adds
    // between steps.
    double step_seconds = 0;
    double between_steps_seconds = 0;
  };

  // `engine` must outlive this object and be used by nothing else.
  // `stream_interval`: the longest a token may wait before its reader is
  // woken, when tokens come faster than that (0: wake for every token).
  AsyncEngine(
      Engine* engine, int64_t max_pending,
      std::chrono::microseconds stream_interval = std::chrono::microseconds(0));

  // Any thread. Validation errors of the request come back through the
  // stream's result (the engine checks it when it enters); a full queue is
  // ResourceExhausted and a draining engine Unavailable, right here.
  absl::StatusOr<std::shared_ptr<RequestStream>> Submit(
      GenerationRequest request);
  // Any thread: the parts of one HTTP request, admitted together under the
  // rule above (streams in the order of `requests`); InvalidArgument for an
  // empty group or one larger than max_group_parts(). `arrival`: when the
  // HTTP request arrived (its metrics' e2e and TTFT start there); unset: now.
  absl::StatusOr<std::vector<std::shared_ptr<RequestStream>>> SubmitGroup(
      std::vector<GenerationRequest> requests,
      std::optional<RequestStream::Clock::time_point> arrival = std::nullopt);
  int64_t max_pending() const { return max_pending_; }
  int64_t max_group_parts() const { return max_group_parts_; }
  // Any thread: the checks the engine will make when the request enters
  // (Engine::CheckRequest), so a bad request is refused before anything is
  // sent to the client.
  absl::Status Check(const GenerationRequest& request) const {
    return engine_->CheckRequest(request);
  }
  // Any thread: ends the request (finish reason "abort") and frees its KV
  // blocks at the next step boundary. Unknown or finished ids are ignored.
  void Cancel(int64_t id);
  // Any thread: stop admitting; Loop() returns when the last request ends.
  void Drain();
  // Any thread: stop admitting and end every open request now with `error`
  // (its reader sees the events pushed so far, then the error); the engine
  // frees their KV blocks at its next step boundary, and Loop() returns once
  // it has. Works while the loop thread is blocked in a step: the streams are
  // finished here, not by the loop. The first error a stream gets is the one
  // it keeps. Returns how many requests it ended.
  int64_t Abort(const absl::Status& error);
  // Any thread: requests accepted and not yet ended.
  int64_t open_requests() const;

  // The loop thread: runs until Drain() and no work is left. A request that
  // fails alone during a step (Engine: its last TokenEvent carries the
  // error) ends its own stream with that error, and the loop carries on; an
  // engine error (the job's) ends every open stream with it and is
  // returned.
  absl::Status Loop();

  Stats stats() const;
  // Any thread. kFailed once Loop() has returned an engine error, or while a
  // step cannot make progress (StepExecutor::making_progress); kDraining
  // after Drain(); kServing otherwise.
  State state() const;
  // Engine statistics, refreshed by the loop after every step and every
  // admission (any thread).
  Engine::Stats engine_stats() const;
  // Any thread: who hears of steps, tokens and request ends from now on
  // (null: nobody). The engine keeps its own reference while a step may
  // still use it, so the observer may be replaced or dropped at any time.
  void set_observer(std::shared_ptr<EngineObserver> observer);

 private:
  struct Pending {
    GenerationRequest request;
    std::shared_ptr<RequestStream> stream;
  };
  // Moves new requests and cancellations into the engine (loop thread).
  void Admit();

  // Wakes the readers of streams holding events longer than the interval.
  void FlushStreams();

  // One accepted request has ended (under mu_).
  void EndedLocked(const RequestStream& stream);
  // Tells the observer how a request that just ended went (under mu_).
  void RecordEndLocked(const RequestStream& stream);

  Engine* engine_;
  const int64_t max_pending_;
  const int64_t max_group_parts_;
  const RequestStream::Clock::duration stream_interval_;
  mutable std::mutex mu_;
  std::condition_variable work_;
  std::deque<Pending> inbox_;
  std::vector<int64_t> cancels_;
  bool draining_ = false;
  bool failed_ = false;
  int64_t open_multi_ = 0;  // Open parts of multi-part groups.
  int64_t next_id_ = 1;
  int64_t open_ = 0;  // Accepted and not finished.
  // The same requests by our id, for Abort (which may not touch live_).
  absl::flat_hash_map<int64_t, std::shared_ptr<RequestStream>> open_streams_;
  Stats stats_;
  Engine::Stats engine_stats_;
  std::shared_ptr<EngineObserver> observer_;  // Under mu_.
  // The loop thread's copy of observer_, taken at every admission, for the
  // token callbacks inside a step (which run without mu_).
  std::shared_ptr<EngineObserver> loop_observer_;
  // Loop thread only: our id -> (engine id, stream).
  struct Live {
    int64_t engine_id;
    std::shared_ptr<RequestStream> stream;
  };
  absl::flat_hash_map<int64_t, Live> live_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_ASYNC_ENGINE_H_
