#include "tests/testing/thread_communicator.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tessera {

class ThreadGroup::Member final : public Communicator {
 public:
  Member(ThreadGroup* group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size_; }

  absl::Status AllReduceSum(const TensorView& inout) override {
    if (inout.dtype() != DType::kF32)
      return absl::InvalidArgumentError("AllReduceSum: f32 only");
    Publish(inout.data());
    const int64_t n = inout.numel();
    std::vector<float> sum(n, 0.0f);
    for (int r = 0; r < size();
         ++r) {  // Same order on every member: identical results.
      const float* in = static_cast<const float*>(group_->published_[r]);
      for (int64_t i = 0; i < n; ++i) sum[i] += in[i];
    }
    group_->Wait();  // Everyone has read every input.
    std::memcpy(inout.data(), sum.data(), n * sizeof(float));
    return absl::OkStatus();
  }

  absl::Status AllGather(const TensorView& in, const TensorView& out) override {
    if (out.nbytes() != in.nbytes() * size()) {
      return absl::InvalidArgumentError(
          "AllGather: out must be size() times in");
    }
    Publish(in.data());
    for (int r = 0; r < size(); ++r) {
      std::memcpy(static_cast<char*>(out.data()) + r * in.nbytes(),
                  group_->published_[r], in.nbytes());
    }
    group_->Wait();
    return absl::OkStatus();
  }

  absl::Status Send(const TensorView& tensor, int peer) override {
    std::lock_guard<std::mutex> lock(group_->mu_);
    group_->mailboxes_[{rank_, peer}].emplace_back(
        static_cast<const char*>(tensor.data()), tensor.nbytes());
    group_->cv_.notify_all();
    return absl::OkStatus();
  }

  absl::Status Recv(const TensorView& tensor, int peer) override {
    std::unique_lock<std::mutex> lock(group_->mu_);
    auto& box = group_->mailboxes_[{peer, rank_}];
    group_->cv_.wait(lock, [&] { return !box.empty(); });
    std::string bytes = std::move(box.front());
    box.pop_front();
    if (bytes.size() != tensor.nbytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Recv from ", peer, ": got ", bytes.size(),
                       " bytes, expected ", tensor.nbytes()));
    }
    std::memcpy(tensor.data(), bytes.data(), bytes.size());
    return absl::OkStatus();
  }

  absl::Status Barrier() override {
    group_->Wait();
    return absl::OkStatus();
  }

 private:
  // Publishes this member's input and waits until every member has published.
  void Publish(const void* data) {
    group_->Wait();  // The previous collective's readers are done with
                     // published_.
    {
      std::lock_guard<std::mutex> lock(group_->mu_);
      group_->published_[rank_] = data;
    }
    group_->Wait();
  }

  ThreadGroup* group_;
  int rank_;
};

ThreadGroup::ThreadGroup(int size) : size_(size), published_(size, nullptr) {
  for (int r = 0; r < size; ++r)
    members_.push_back(std::make_unique<Member>(this, r));
}

ThreadGroup::~ThreadGroup() = default;

Communicator* ThreadGroup::member(int rank) { return members_[rank].get(); }

void ThreadGroup::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t generation = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != generation; });
}

}  // namespace tessera
