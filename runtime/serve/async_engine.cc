#include "runtime/serve/async_engine.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {

std::optional<TokenEvent> RequestStream::Next(std::chrono::milliseconds timeout,
                                              Clock::time_point* made_at) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout,
               [&] { return !events_.empty() || result_.has_value(); });
  if (events_.empty()) return std::nullopt;
  Made made = std::move(events_.front());
  events_.pop_front();
  if (made_at != nullptr) *made_at = made.at;
  return std::move(made.event);
}

bool RequestStream::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.empty() && result_.has_value();
}

bool RequestStream::WaitReady(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout,
                      [&] { return !events_.empty() || result_.has_value(); });
}

absl::StatusOr<GenerationResult> RequestStream::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return result_.has_value(); });
  return *result_;
}

void RequestStream::Push(const TokenEvent& event, Clock::time_point now,
                         Clock::duration interval) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (result_.has_value()) return;  // Ended (aborted) already.
    events_.push_back(Made{event, now});
    wake = event.finished || !woken_once_ || now - last_wake_ >= interval;
    if (wake) {
      woken_once_ = true;
      last_wake_ = now;
      held_back_ = false;
    } else {
      held_back_ = true;
    }
  }
  if (wake) cv_.notify_all();
}

void RequestStream::FlushIfDue(Clock::time_point now,
                               Clock::duration interval) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!held_back_ || now - last_wake_ < interval) return;
    last_wake_ = now;
    held_back_ = false;
  }
  cv_.notify_all();
}

void RequestStream::Finish(absl::StatusOr<GenerationResult> result) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!result_.has_value()) result_ = std::move(result);
  }
  cv_.notify_all();
}

AsyncEngine::AsyncEngine(Engine* engine, int64_t max_pending,
                         std::chrono::microseconds stream_interval)
    : engine_(engine),
      max_pending_(max_pending),
      max_group_parts_(std::max<int64_t>(1, max_pending / 2)),
      stream_interval_(stream_interval) {}

absl::StatusOr<std::shared_ptr<RequestStream>> AsyncEngine::Submit(
    GenerationRequest request) {
  std::vector<GenerationRequest> one;
  one.push_back(std::move(request));
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RequestStream>> streams,
                   SubmitGroup(std::move(one)));
  return std::move(streams.front());
}

absl::StatusOr<std::vector<std::shared_ptr<RequestStream>>>
AsyncEngine::SubmitGroup(
    std::vector<GenerationRequest> requests,
    std::optional<RequestStream::Clock::time_point> arrival) {
  const RequestStream::Clock::time_point now = RequestStream::Clock::now();
  const int64_t k = static_cast<int64_t>(requests.size());
  if (k == 0) return absl::InvalidArgumentError("no requests to submit");
  if (k > max_group_parts_) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request has ", k,
                     " parts (prompts x n); the server admits at most ",
                     max_group_parts_, " per request (half of --max-pending)"));
  }
  std::vector<std::shared_ptr<RequestStream>> streams;
  streams.reserve(requests.size());
  for (int64_t i = 0; i < k; ++i) {
    auto stream = std::make_shared<RequestStream>();
    stream->arrival_ = arrival.value_or(now);
    stream->submitted_ = now;
    stream->prompt_tokens_ =
        static_cast<int64_t>(requests[i].prompt_ids.size());
    stream->max_tokens_ = requests[i].max_tokens;
    streams.push_back(std::move(stream));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) {
      return absl::UnavailableError(failed_ ? "the engine has failed"
                                            : "the server is shutting down");
    }
    const bool multi = k > 1;
    if (open_ + k > max_pending_ ||
        (multi && open_multi_ + k > max_group_parts_)) {
      ++stats_.rejected;
      return absl::ResourceExhaustedError(
          multi ? absl::StrCat("the server is full (", open_, " of ",
                               max_pending_, " places taken, ", open_multi_,
                               " of the ", max_group_parts_,
                               " that requests with several prompts or "
                               "choices may share); retry later")
                : absl::StrCat("the server is full (", max_pending_,
                               " requests waiting or running); retry later"));
    }
    for (int64_t i = 0; i < k; ++i) {
      RequestStream& stream = *streams[i];
      stream.id_ = next_id_++;
      stream.multi_ = multi;
      open_streams_[stream.id_] = streams[i];
      inbox_.push_back(Pending{std::move(requests[i]), streams[i]});
    }
    open_ += k;
    if (multi) open_multi_ += k;
    stats_.accepted += k;
    stats_.waiting = static_cast<int64_t>(inbox_.size());
  }
  work_.notify_one();
  return streams;
}

void AsyncEngine::EndedLocked(const RequestStream& stream) {
  // Once per request: Abort and the loop may both see it end.
  if (open_streams_.erase(stream.id_) == 0) return;
  --open_;
  if (stream.multi_) --open_multi_;
  RecordEndLocked(stream);
}

void AsyncEngine::RecordEndLocked(const RequestStream& stream) {
  if (observer_ == nullptr) return;
  using Clock = RequestStream::Clock;
  auto seconds = [](Clock::duration d) {
    return std::chrono::duration<double>(d).count();
  };
  const Clock::time_point now = Clock::now();
  RequestEnd end;
  end.prompt_tokens = stream.prompt_tokens_;
  end.max_tokens = stream.max_tokens_;
  end.generation_tokens = stream.generated_;
  end.e2e_seconds = seconds(now - stream.arrival_);
  {
    std::lock_guard<std::mutex> lock(stream.mu_);
    const GenerationResult* r =
        stream.result_.has_value() && stream.result_->ok() ? &**stream.result_
                                                           : nullptr;
    if (r == nullptr) {
      end.finish_reason = "error";
    } else {
      end.finish_reason = FinishReasonName(r->finish_reason);
      end.has_phases = true;
      end.generation_tokens = static_cast<int64_t>(r->output_ids.size());
      // The engine's clock starts at its Submit; the wait for admission
      // before it is queue time too.
      const double admission =
          stream.admitted_set_ ? seconds(stream.admitted_ - stream.submitted_)
                               : 0.0;
      end.queue_seconds = admission + r->queue_seconds;
      end.prefill_seconds =
          std::max(0.0, r->prefill_seconds - r->queue_seconds);
      end.decode_seconds = r->decode_seconds;
    }
  }
  observer_->OnRequestEnd(end);
}

void AsyncEngine::set_observer(std::shared_ptr<EngineObserver> observer) {
  std::lock_guard<std::mutex> lock(mu_);
  observer_ = std::move(observer);
}

int64_t AsyncEngine::Abort(const absl::Status& error) {
  int64_t ended = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    // Not yet in the engine: they end here and never enter it.
    for (Pending& p : inbox_) {
      p.stream->Finish(error);
      EndedLocked(*p.stream);
      ++ended;
    }
    inbox_.clear();
    stats_.waiting = 0;
    // In the engine: their readers are told now; the loop cancels them in
    // the engine (freeing their blocks) and counts them as ended.
    for (const auto& [id, stream] : open_streams_) {
      stream->Finish(error);
      cancels_.push_back(id);
      ++ended;
    }
  }
  work_.notify_one();
  return ended;
}

int64_t AsyncEngine::open_requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

AsyncEngine::State AsyncEngine::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  // A step that cannot finish (a stalled rank) fails the engine before the
  // step returns: /health must not answer 200 while the job is stuck.
  if (failed_ || !engine_->executor_making_progress()) return State::kFailed;
  return draining_ ? State::kDraining : State::kServing;
}

void AsyncEngine::Cancel(int64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
  }
  work_.notify_one();
}

void AsyncEngine::Drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
  }
  work_.notify_one();
}

AsyncEngine::Stats AsyncEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

Engine::Stats AsyncEngine::engine_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return engine_stats_;
}

void AsyncEngine::Admit() {
  std::deque<Pending> inbox;
  std::vector<int64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox.swap(inbox_);
    cancels.swap(cancels_);
    stats_.waiting = 0;
    loop_observer_ = observer_;
  }
  const RequestStream::Clock::time_point admitted = RequestStream::Clock::now();
  std::vector<std::shared_ptr<RequestStream>> ended;
  for (Pending& p : inbox) {
    const int64_t id = p.stream->id_;
    std::shared_ptr<RequestStream> stream = p.stream;
    stream->admitted_ = admitted;
    stream->admitted_set_ = true;
    // The engine calls back on this thread, inside Step().
    absl::StatusOr<int64_t> engine_id =
        engine_->Submit(p.request, [this, id, stream](const TokenEvent& event) {
          const RequestStream::Clock::time_point now =
              RequestStream::Clock::now();
          if (event.error.ok()) {  // A token (not a failure's last event).
            if (loop_observer_ != nullptr) {
              const std::chrono::duration<double> since =
                  now - (stream->generated_ == 0 ? stream->arrival_
                                                 : stream->last_token_);
              if (stream->generated_ == 0) {
                loop_observer_->OnFirstToken(stream->prompt_tokens_,
                                             since.count());
              } else {
                loop_observer_->OnNextToken(since.count());
              }
            }
            ++stream->generated_;
            stream->last_token_ = now;
          }
          stream->Push(event, now, stream_interval_);
          if (!event.finished) return;
          auto it = live_.find(id);
          if (it == live_.end()) return;
          stream->Finish(engine_->TakeResult(it->second.engine_id));
          live_.erase(it);
          std::lock_guard<std::mutex> lock(mu_);
          EndedLocked(*stream);
        });
    if (!engine_id.ok()) {
      stream->Finish(engine_id.status());
      ended.push_back(stream);
      continue;
    }
    live_[id] = Live{*engine_id, stream};
  }
  for (int64_t id : cancels) {
    auto it = live_.find(id);
    if (it == live_.end()) continue;  // Finished already, or unknown.
    if (engine_->Cancel(it->second.engine_id).ok()) {
      it->second.stream->Finish(engine_->TakeResult(it->second.engine_id));
    }
    ended.push_back(it->second.stream);
    live_.erase(it);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& stream : ended) EndedLocked(*stream);
  engine_stats_ = engine_->stats();  // Cancellations free blocks too.
}

void AsyncEngine::FlushStreams() {
  if (stream_interval_ == RequestStream::Clock::duration::zero()) return;
  const RequestStream::Clock::time_point now = RequestStream::Clock::now();
  for (auto& [id, live] : live_) {
    live.stream->FlushIfDue(now, stream_interval_);
  }
}

absl::Status AsyncEngine::Loop() {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::duration d) {
    return std::chrono::duration<double>(d).count();
  };
  // The end of the previous step, while work continued since then.
  std::optional<Clock::time_point> last_step_end;
  // The engine is unusable: end every open request with the error.
  // Its readers are told that the engine failed (a server error, whatever
  // the code inside: the request itself was fine).
  const auto fail = [&](const absl::Status& error) {
    const absl::Status told = absl::InternalError(
        absl::StrCat("the engine failed: ", error.message()));
    for (auto& [id, live] : live_) live.stream->Finish(told);
    live_.clear();
    std::lock_guard<std::mutex> lock(mu_);
    for (Pending& p : inbox_) p.stream->Finish(told);
    inbox_.clear();
    for (const auto& [id, stream] : open_streams_) {
      stream->Finish(told);
      RecordEndLocked(*stream);
    }
    open_streams_.clear();
    draining_ = true;
    failed_ = true;
    open_ = 0;
    open_multi_ = 0;
    return error;
  };
  while (true) {
    Admit();
    if (engine_->HasWork()) {
      const Clock::time_point step_start = Clock::now();
      const absl::Status stepped = engine_->Step();
      const Clock::time_point step_end = Clock::now();
      {
        std::lock_guard<std::mutex> lock(mu_);
        engine_stats_ = engine_->stats();
        if (stepped.ok() && observer_ != nullptr &&
            engine_stats_.last_step_tokens > 0) {
          observer_->OnStep(engine_stats_.last_step_tokens);
        }
        ++stats_.steps;
        stats_.step_seconds += seconds(step_end - step_start);
        if (last_step_end) {
          stats_.between_steps_seconds += seconds(step_start - *last_step_end);
        }
      }
      last_step_end = step_end;
      FlushStreams();
      if (!stepped.ok()) return fail(stepped);
      continue;
    }
    last_step_end.reset();  // Idle time is not the server's overhead.
    // A parallel job's heartbeat: the other ranks know rank 0 is alive.
    const absl::Status idle = engine_->Idle();
    if (!idle.ok()) return fail(idle);
    std::unique_lock<std::mutex> lock(mu_);
    if (draining_ && open_ == 0 && inbox_.empty()) return absl::OkStatus();
    work_.wait_for(lock, std::chrono::milliseconds(50), [&] {
      return !inbox_.empty() || !cancels_.empty() || draining_;
    });
  }
}

}  // namespace tessera
