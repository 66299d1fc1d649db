// AsyncEngine: the thread-safe front of rank 0's Engine for a server.
//
// HTTP threads Submit requests and read their tokens from a RequestStream;
// one thread (rank 0's main thread, the only one that talks to the other
// ranks) runs Loop(), which moves new requests and cancellations into the
// engine between steps and steps while there is work. So HTTP threads never
// block the step loop, and the engine itself stays single-threaded.
//
// Admission: at most `max_pending` requests may be waiting to enter the
// engine or running in it; Submit beyond that is ResourceExhausted (the server
// answers 429). Shutdown: Drain() stops admission (Submit is Unavailable) and
// lets Loop() return once every accepted request has finished.
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

namespace tessera {

// One request's output as its reader sees it: events in order, then the
// result. Filled by the loop thread, read by one HTTP thread.
class RequestStream {
 public:
  // Waits up to `timeout` for the next event. nullopt when none arrived in
  // time or the request is over and every event was read (done() tells).
  std::optional<TokenEvent> Next(std::chrono::milliseconds timeout);
  // Whether the request has ended and every event has been read.
  bool done() const;
  // Waits for the end and returns the result (or the error that ended it).
  absl::StatusOr<GenerationResult> Wait();
  int64_t id() const { return id_; }

 private:
  friend class AsyncEngine;
  void Push(const TokenEvent& event);
  void Finish(absl::StatusOr<GenerationResult> result);

  int64_t id_ = 0;  // The AsyncEngine's id (not the engine's).
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  std::optional<absl::StatusOr<GenerationResult>> result_;
};

class AsyncEngine {
 public:
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
  AsyncEngine(Engine* engine, int64_t max_pending);

  // Any thread. Validation errors of the request come back through the
  // stream's result (the engine checks it when it enters); a full queue is
  // ResourceExhausted and a draining engine Unavailable, right here.
  absl::StatusOr<std::shared_ptr<RequestStream>> Submit(
      GenerationRequest request);
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

  // The loop thread: runs until Drain() and no work is left. An engine error
  // ends every open stream with it and is returned.
  absl::Status Loop();

  Stats stats() const;
  // Engine statistics, refreshed by the loop after every step and every
  // admission (any thread).
  Engine::Stats engine_stats() const;

 private:
  struct Pending {
    GenerationRequest request;
    std::shared_ptr<RequestStream> stream;
  };
  // Moves new requests and cancellations into the engine (loop thread).
  void Admit();

  Engine* engine_;
  const int64_t max_pending_;
  mutable std::mutex mu_;
  std::condition_variable work_;
  std::deque<Pending> inbox_;
  std::vector<int64_t> cancels_;
  bool draining_ = false;
  int64_t next_id_ = 1;
  int64_t open_ = 0;  // Accepted and not finished.
  Stats stats_;
  Engine::Stats engine_stats_;
  // Loop thread only: our id -> (engine id, stream).
  struct Live {
    int64_t engine_id;
    std::shared_ptr<RequestStream> stream;
  };
  absl::flat_hash_map<int64_t, Live> live_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_ASYNC_ENGINE_H_
