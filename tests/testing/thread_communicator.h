// ThreadGroup: an in-process Communicator group whose members are threads of
// one process. Tests use it to run tensor- and pipeline-parallel shards side by
// side without MPI, so the sharding arithmetic is checked on its own before the
// MPI transport is involved.
//
// Each member must be used by exactly one thread. Collectives block until every
// member has arrived; Send is buffered (it copies and returns), Recv blocks
// until the matching Send.
#ifndef TESSERA_TESTS_TESTING_THREAD_COMMUNICATOR_H_
#define TESSERA_TESTS_TESTING_THREAD_COMMUNICATOR_H_

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/communicator.h"

namespace tessera {

class ThreadGroup {
 public:
  explicit ThreadGroup(int size);
  ~ThreadGroup();
  Communicator* member(int rank);
  int size() const { return size_; }

 private:
  class Member;
  friend class Member;

  // Blocks until all `size_` members have called it (reusable).
  void Wait();

  const int size_;
  std::vector<std::unique_ptr<Member>> members_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<const void*>
      published_;  // One input pointer per member, per collective.
  std::map<std::pair<int, int>, std::deque<std::string>>
      mailboxes_;  // (from, to) -> bytes.
};

}  // namespace tessera

#endif  // TESSERA_TESTS_TESTING_THREAD_COMMUNICATOR_H_
