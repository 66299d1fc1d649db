// HttpServer: cpp-httplib's Server with connection handling that no client
// can exhaust, for the OpenAI front end (openai_server.h).
//
// Debian's cpp-httplib 0.11.4 serves each connection on one thread of a
// fixed pool, reads with a per-recv timeout only, and waits with select()
// (undefined for descriptors >= FD_SETSIZE). So 256 slow clients (a head or
// body trickled a byte at a time, idle keep-alives) take every thread and
// /health stops answering, and streams beyond the pool wait in its queue
// while the scheduler sees nothing. Here instead:
//
//  - Threads follow connections: an ElasticTaskQueue starts a thread when no
//    idle one is there and lets idle threads retire. Concurrency is then
//    bounded by the engine's admission (--max-num-seqs, --max-pending: 429
//    beyond them), not by the HTTP layer.
//  - At most `max_connections` connections are open; one more is answered
//    with a canned 503 JSON body on the accepting thread (a non-blocking
//    send, then close): cheap, and no thread is started for it.
//  - A client has `request_timeout` from the first byte of a request to the
//    last byte of its body, whatever it trickles; an idle connection (before
//    its first request or between keep-alive requests) is closed after
//    `keep_alive_timeout`, and after `keep_alive_max_requests` requests.
//    One write may block `write_timeout` (a client that stops reading).
//  - The head (request line and headers) may take `max_head_bytes`; what a
//    body may take is the handler's to check (see Connection::BodyStarted).
//  - Every wait is poll(), so descriptors beyond FD_SETSIZE are fine.
//
// How: httplib's listen loop accepts and hands each socket to the task queue,
// which calls the virtual process_and_close_socket(sock). This subclass
// overrides it with its own keep-alive loop over its own Stream (a
// Connection), calling httplib's process_request for each request, so
// parsing, routing and response writing stay httplib's. The Connection of
// the request a thread is handling is reachable from the handler
// (HttpServer::CurrentConnection(), a thread-local: httplib calls handlers
// and content providers synchronously on the connection's thread), which is
// how a handler finds out, without reading, that its client went away
// (Connection::PeerClosed) — httplib 0.11.4 has no such call.
#ifndef TESSERA_RUNTIME_SERVE_HTTP_SERVER_H_
#define TESSERA_RUNTIME_SERVE_HTTP_SERVER_H_

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tessera {

// A TaskQueue with a thread per task on demand: enqueue hands the task to an
// idle thread or starts one; a thread idle for `idle_timeout` retires (but
// `min_threads` stay). At most `max_tasks` tasks run or wait at once; one
// more runs inline on the enqueuing thread with OverCapacity() true there,
// so that it can refuse its work cheaply (HttpServer answers 503).
class ElasticTaskQueue : public httplib::TaskQueue {
 public:
  ElasticTaskQueue(int max_tasks, std::chrono::milliseconds idle_timeout,
                   int min_threads = 4);
  ~ElasticTaskQueue() override;

  void enqueue(std::function<void()> fn) override;
  // Waits for every task to finish and every thread to end.
  void shutdown() override;

  // True on a thread running a task inline because the queue was full.
  static bool OverCapacity();

  struct Stats {
    int64_t threads = 0;    // Alive now.
    int64_t busy = 0;       // Running or waiting tasks.
    int64_t started = 0;    // Threads ever started.
    int64_t refused = 0;    // Tasks run inline over capacity.
    int64_t peak_busy = 0;  // The most tasks at once.
  };
  Stats stats() const;

 private:
  void Work();
  void JoinRetired();  // Under mu_.

  const int max_tasks_;
  const std::chrono::milliseconds idle_timeout_;
  const int min_threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  int idle_ = 0;
  bool shutdown_ = false;
  Stats stats_;
  std::list<std::thread> threads_;
  std::vector<std::thread::id> retired_;  // Ended; to be joined.
};

struct HttpLimits {
  // Open connections; one more gets 503 and is closed at once.
  int max_connections = 4096;
  // From a request's first byte to its body's last.
  std::chrono::milliseconds request_timeout{30000};
  // The longest one write may wait for the client to read.
  std::chrono::milliseconds write_timeout{30000};
  // Idle before a connection's first request and between requests.
  std::chrono::milliseconds keep_alive_timeout{5000};
  int keep_alive_max_requests = 1000;
  // Request line and headers together.
  int64_t max_head_bytes = 64 << 10;
  // What the body may take on the wire (chunk framing, compression
  // included), as a backstop: handlers check the decoded size themselves.
  int64_t max_body_wire_bytes = int64_t{64} << 20;
  // Idle HTTP threads retire after this.
  std::chrono::milliseconds idle_thread_timeout{30000};
};

// One client connection: httplib's Stream over the socket, with the limits
// above. Used on the connection's thread only (PeerClosed from a handler).
class Connection final : public httplib::Stream {
 public:
  Connection(int fd, const HttpLimits& limits,
             const std::atomic<bool>* stopping);

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  // httplib 0.11.4 uses this only to refuse descriptors >= FD_SETSIZE (its
  // own streams select()); this one polls, so it reports no descriptor
  // (INVALID_SOCKET) and any descriptor number works.
  socket_t socket() const override { return INVALID_SOCKET; }

  // Whether the client has closed or reset the connection, found without
  // reading: poll() for POLLRDHUP/POLLHUP/POLLERR, and a readable socket
  // whose recv(MSG_PEEK) sees the end of the stream. Bytes the client sent
  // ahead (a pipelined request) do not count as closed.
  bool PeerClosed() const;
  // Called when the head is parsed (routing starts): the body's allowance
  // (max_body_wire_bytes) replaces the head's.
  void BodyStarted();
  // The connection closes after this response (its body was not read, or
  // the request was refused).
  void CloseAfterResponse() { close_after_response_ = true; }

  // The keep-alive loop's side (HttpServer).
  // Waits up to `timeout` for the next request's first byte; false when
  // none came, the client closed, or the server stops.
  bool WaitForRequest(std::chrono::milliseconds timeout);
  void BeginRequest();
  // Whether the request could not be read in full (too slow, too large, cut
  // short): what is left on the wire is no request, so the connection ends.
  bool read_failed() const { return read_failed_; }
  bool close_after_response() const { return close_after_response_; }
  int fd() const { return fd_; }

 private:
  using Clock = std::chrono::steady_clock;
  // poll() for `events` until `deadline` in slices, giving up when the
  // server stops (`stop_aware`). >0 ready, 0 timed out, <0 error.
  int Poll(short events, Clock::time_point deadline, bool stop_aware) const;

  const int fd_;
  const HttpLimits& limits_;
  const std::atomic<bool>* stopping_;
  std::vector<char> buffer_;
  size_t buffer_begin_ = 0, buffer_end_ = 0;
  Clock::time_point deadline_;
  int64_t allowance_ = 0;  // Bytes the request may still read.
  bool close_after_response_ = false;
  bool read_failed_ = false;
};

class HttpServer : public httplib::Server {
 public:
  explicit HttpServer(HttpLimits limits);
  ~HttpServer() override;

  // The connection whose request this thread is handling: valid inside a
  // handler or content provider of this server, null elsewhere.
  static Connection* CurrentConnection();

  const HttpLimits& limits() const { return limits_; }

  // Binds `host`:`port` (0: any free port) with SO_REUSEADDR and TCP_NODELAY,
  // and listens with a backlog of SOMAXCONN (httplib's is 5, so a burst of
  // clients connecting at once would be reset). The bound port, or -1.
  // Then listen_after_bind() serves.
  int Bind(const std::string& host, int port);
  ElasticTaskQueue::Stats queue_stats() const { return queue_->stats(); }
  int64_t open_connections() const { return open_connections_.load(); }

  // Stops accepting (httplib's stop()); reads in progress and idle
  // keep-alive waits give up at once, writes finish within write_timeout.
  // listen_after_bind() returns once every connection has ended.
  void Stop();

 private:
  bool process_and_close_socket(socket_t sock) override;
  // The canned 503 for a connection over the cap (non-blocking).
  static void Refuse(int fd);

  const HttpLimits limits_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> open_connections_{0};
  // httplib deletes the queue its factory makes when listening ends; it gets
  // a forwarder to this one, so that statistics outlive the loop.
  std::unique_ptr<ElasticTaskQueue> queue_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_HTTP_SERVER_H_
