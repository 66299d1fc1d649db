#include "runtime/serve/http_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

thread_local bool t_over_capacity = false;
thread_local Connection* t_connection = nullptr;

// httplib deletes what its factory returns; the queue itself lives on in the
// server.
class ForwardingQueue final : public httplib::TaskQueue {
 public:
  explicit ForwardingQueue(ElasticTaskQueue* queue) : queue_(queue) {}
  void enqueue(std::function<void()> fn) override {
    queue_->enqueue(std::move(fn));
  }
  void shutdown() override { queue_->shutdown(); }

 private:
  ElasticTaskQueue* queue_;
};

void NameOf(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  const int r = peer
                    ? getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                    : getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  if (r != 0) return;
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host),
                  serv, sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host;
    port = std::atoi(serv);
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// ElasticTaskQueue

ElasticTaskQueue::ElasticTaskQueue(int max_tasks,
                                   std::chrono::milliseconds idle_timeout,
                                   int min_threads)
    : max_tasks_(std::max(1, max_tasks)),
      idle_timeout_(idle_timeout),
      min_threads_(std::max(0, min_threads)) {}

ElasticTaskQueue::~ElasticTaskQueue() { shutdown(); }

bool ElasticTaskQueue::OverCapacity() { return t_over_capacity; }

void ElasticTaskQueue::enqueue(std::function<void()> fn) {
  std::unique_lock<std::mutex> lock(mu_);
  JoinRetired();
  bool inline_run = shutdown_ || stats_.busy >= max_tasks_;
  if (!inline_run) {
    ++stats_.busy;
    stats_.peak_busy = std::max(stats_.peak_busy, stats_.busy);
    jobs_.push_back(std::move(fn));
    if (idle_ >= static_cast<int>(jobs_.size())) {
      cv_.notify_one();
      return;
    }
    try {
      threads_.emplace_back([this] { Work(); });
      ++stats_.threads;
      ++stats_.started;
      return;
    } catch (const std::system_error&) {
      // No thread to be had (a resource limit): refuse this one, unless an
      // existing thread will get to it.
      if (stats_.threads > 0) return;
      fn = std::move(jobs_.back());
      jobs_.pop_back();
      --stats_.busy;
      inline_run = true;
    }
  }
  ++stats_.refused;
  lock.unlock();
  t_over_capacity = true;
  fn();
  t_over_capacity = false;
}

void ElasticTaskQueue::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    ++idle_;
    const bool woken = cv_.wait_for(
        lock, idle_timeout_, [&] { return !jobs_.empty() || shutdown_; });
    --idle_;
    if (!jobs_.empty()) {
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      fn = nullptr;  // Whatever it holds goes outside the lock.
      lock.lock();
      --stats_.busy;
      continue;
    }
    if (shutdown_) break;
    if (!woken && stats_.threads > min_threads_) break;  // Retire.
  }
  --stats_.threads;
  retired_.push_back(std::this_thread::get_id());
  cv_.notify_all();  // shutdown() may wait for the last one.
}

void ElasticTaskQueue::JoinRetired() {
  // A retired thread has pushed its id under mu_ and released it for good,
  // so joining it here cannot wait on this lock.
  for (const std::thread::id id : retired_) {
    for (auto it = threads_.begin(); it != threads_.end(); ++it) {
      if (it->get_id() == id) {
        it->join();
        threads_.erase(it);
        break;
      }
    }
  }
  retired_.clear();
}

void ElasticTaskQueue::shutdown() {
  std::unique_lock<std::mutex> lock(mu_);
  shutdown_ = true;
  cv_.notify_all();
  cv_.wait(lock, [&] { return stats_.threads == 0; });
  JoinRetired();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

ElasticTaskQueue::Stats ElasticTaskQueue::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

// ---------------------------------------------------------------------------
// Connection

Connection::Connection(int fd, const HttpLimits& limits,
                       const std::atomic<bool>* stopping)
    : fd_(fd), limits_(limits), stopping_(stopping), buffer_(16384) {
  BeginRequest();
}

int Connection::Poll(short events, Clock::time_point deadline,
                     bool stop_aware) const {
  while (true) {
    if (stop_aware && stopping_ != nullptr && stopping_->load()) return -1;
    const Clock::time_point now = Clock::now();
    // Slices of at most 100 ms, so that a stopping server is noticed.
    const int64_t left_ms =
        now >= deadline ? 0
                        : std::chrono::duration_cast<std::chrono::milliseconds>(
                              deadline - now)
                                  .count() +
                              1;
    pollfd p{fd_, events, 0};
    const int r =
        ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 100)));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r > 0) return 1;  // Ready, or hung up / failed: the call says which.
    if (Clock::now() >= deadline) return 0;
  }
}

bool Connection::is_readable() const {
  return buffer_begin_ < buffer_end_ || Poll(POLLIN, deadline_, true) > 0;
}

bool Connection::is_writable() const {
  return !PeerClosed() &&
         Poll(POLLOUT, Clock::now() + limits_.write_timeout, false) > 0;
}

ssize_t Connection::read(char* ptr, size_t size) {
  if (size == 0) return 0;
  if (buffer_begin_ == buffer_end_) {
    if (allowance_ <= 0) {  // More than the request may send.
      read_failed_ = true;
      return -1;
    }
    while (true) {
      if (Poll(POLLIN, deadline_, true) <= 0) {  // Too slow.
        read_failed_ = true;
        return -1;
      }
      const size_t want = static_cast<size_t>(
          std::min<int64_t>(static_cast<int64_t>(buffer_.size()), allowance_));
      const ssize_t n = ::recv(fd_, buffer_.data(), want, MSG_DONTWAIT);
      if (n < 0 &&
          (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
        continue;
      }
      if (n <= 0) {
        read_failed_ = true;
        return n;
      }
      allowance_ -= n;
      buffer_begin_ = 0;
      buffer_end_ = static_cast<size_t>(n);
      break;
    }
  }
  const size_t n = std::min(size, buffer_end_ - buffer_begin_);
  std::memcpy(ptr, buffer_.data() + buffer_begin_, n);
  buffer_begin_ += n;
  return static_cast<ssize_t>(n);
}

ssize_t Connection::write(const char* ptr, size_t size) {
  const Clock::time_point deadline = Clock::now() + limits_.write_timeout;
  while (true) {
    if (Poll(POLLOUT, deadline, false) <= 0) return -1;
    const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
      continue;
    }
    return n < 0 ? -1 : n;
  }
}

void Connection::get_remote_ip_and_port(std::string& ip, int& port) const {
  NameOf(fd_, /*peer=*/true, ip, port);
}

void Connection::get_local_ip_and_port(std::string& ip, int& port) const {
  NameOf(fd_, /*peer=*/false, ip, port);
}

bool Connection::PeerClosed() const {
  pollfd p{fd_, static_cast<short>(POLLIN | POLLRDHUP), 0};
  const int r = ::poll(&p, 1, 0);
  if (r < 0) return errno != EINTR && errno != EAGAIN;
  if (r == 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) return true;
  if (p.revents & POLLIN) {
    char c;
    const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }
  return false;
}

void Connection::BodyStarted() { allowance_ = limits_.max_body_wire_bytes; }

bool Connection::WaitForRequest(std::chrono::milliseconds timeout) {
  if (buffer_begin_ < buffer_end_) return true;
  return Poll(POLLIN, Clock::now() + timeout, true) > 0;
}

void Connection::BeginRequest() {
  read_failed_ = false;
  deadline_ = Clock::now() + limits_.request_timeout;
  allowance_ = limits_.max_head_bytes;
}

// ---------------------------------------------------------------------------
// HttpServer

HttpServer::HttpServer(HttpLimits limits)
    : limits_(limits),
      queue_(std::make_unique<ElasticTaskQueue>(
          limits_.max_connections,
          std::chrono::duration_cast<std::chrono::milliseconds>(
              limits_.idle_thread_timeout))) {
  ElasticTaskQueue* queue = queue_.get();
  new_task_queue = [queue] { return new ForwardingQueue(queue); };
  // Only what httplib writes into the Keep-Alive response header; the loop
  // below enforces both.
  set_keep_alive_max_count(
      static_cast<size_t>(std::max(1, limits_.keep_alive_max_requests)));
  set_keep_alive_timeout(
      std::max<time_t>(1, std::chrono::duration_cast<std::chrono::seconds>(
                              limits_.keep_alive_timeout)
                              .count()));
}

HttpServer::~HttpServer() = default;

Connection* HttpServer::CurrentConnection() { return t_connection; }

int HttpServer::Bind(const std::string& host, int port) {
  int listen_fd = -1;
  // Tokens are small writes that must leave at once: no Nagle delay
  // (accepted sockets inherit the option from the listening one).
  set_tcp_nodelay(true);
  set_socket_options([&listen_fd](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd = sock;
  });
  int bound = -1;
  if (port == 0) {
    bound = bind_to_any_port(host.c_str());
  } else if (bind_to_port(host.c_str(), port)) {
    bound = port;
  }
  set_socket_options(httplib::default_socket_options);
  if (bound <= 0) return -1;
  if (listen_fd >= 0 && ::listen(listen_fd, SOMAXCONN) != 0) return -1;
  return bound;
}

void HttpServer::Stop() {
  stopping_.store(true);
  stop();
}

void HttpServer::Refuse(int fd) {
  static const std::string kResponse = [] {
    const std::string body =
        R"({"error":{"message":"the server has too many open connections; )"
        R"(retry later","type":"service_unavailable","param":null,)"
        R"("code":null}})";
    return "HTTP/1.1 503 Service Unavailable\r\n"
           "Content-Type: application/json\r\n"
           "Content-Length: " +
           std::to_string(body.size()) +
           "\r\nRetry-After: 1\r\nConnection: close\r\n\r\n" + body;
  }();
  // Never blocks: a client that cannot take these few bytes at once gets
  // nothing (the close may reach it as a reset, as may unread request bytes).
  (void)::send(fd, kResponse.data(), kResponse.size(),
               MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  if (ElasticTaskQueue::OverCapacity()) {
    Refuse(sock);
    return false;
  }
  open_connections_.fetch_add(1);
  bool ret = false;
  bool linger = false;
  {
    Connection connection(sock, limits_, &stopping_);
    t_connection = &connection;
    int remaining = std::max(1, limits_.keep_alive_max_requests);
    while (!stopping_.load() && remaining > 0 &&
           connection.WaitForRequest(limits_.keep_alive_timeout)) {
      connection.BeginRequest();
      bool closed = false;
      ret = process_request(connection, /*close_connection=*/remaining == 1,
                            closed, nullptr);
      if (connection.close_after_response()) linger = true;
      if (!ret || closed || linger || connection.read_failed()) break;
      --remaining;
    }
    t_connection = nullptr;
  }
  if (linger) {
    // The client may still be sending a body that was not read (a 413):
    // closing now, with unread bytes, would reset the connection and could
    // destroy the response before the client reads it. Send FIN, then read
    // and drop what comes for a moment (a lingering close).
    ::shutdown(sock, SHUT_WR);
    const Clock::time_point until = Clock::now() + std::chrono::seconds(2);
    char sink[16384];
    int64_t dropped = 0;
    while (Clock::now() < until && dropped < (int64_t{8} << 20)) {
      pollfd p{sock, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = ::recv(sock, sink, sizeof(sink), MSG_DONTWAIT);
      if (n == 0) break;
      if (n < 0 && errno != EINTR && errno != EAGAIN) break;
      if (n > 0) dropped += n;
    }
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  open_connections_.fetch_sub(1);
  return ret;
}

}  // namespace tessera
