// The OpenAI server end to end over HTTP (cpp-httplib's client) on the demo
// checkpoint: completions equal offline greedy generation, streaming ends in
// [DONE] with the same text, 64 concurrent streaming clients all get their
// offline text, bad requests get OpenAI-shaped 400/404s, a full queue 429,
// a client that disconnects has its request cancelled (its KV blocks freed),
// and /metrics, /v1/models and /health answer.
#include "runtime/serve/openai_server.h"

#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "runtime/engine/local_executor.h"
#include "runtime/text/tokenizer.h"
#include "tests/test_paths.h"

namespace tessera {
namespace {

using json = nlohmann::json;

class ServerTest : public ::testing::Test {
 protected:
  void Start(int64_t max_pending = 256) {
    auto tokenizer = LoadTokenizer(DemoModelDir(), 1);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
    EngineOptions options;
    options.scheduler.max_num_seqs = 64;
    KvCacheOptions kv;
    kv.memory_bytes = int64_t{64} << 20;
    auto local =
        LocalEngine::Load(DemoModelDir(), &ops_, options, kv, tokenizer_.get());
    ASSERT_TRUE(local.ok()) << local.status();
    local_ = *std::move(local);
    async_ = std::make_unique<AsyncEngine>(&local_->engine(), max_pending);
    ServerOptions server_options;
    server_options.port = 0;
    server_options.served_model_name = "demo";
    server_ = std::make_unique<OpenAiServer>(server_options, async_.get(),
                                             local_->model().config(),
                                             tokenizer_.get(), std::nullopt);
    ASSERT_TRUE(server_->Start().ok());
    loop_ = std::thread([this] { EXPECT_TRUE(async_->Loop().ok()); });
  }
  void TearDown() override {
    if (async_) async_->Drain();
    if (loop_.joinable()) loop_.join();
    if (server_) server_->Stop();
  }

  httplib::Client Client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(60, 0);
    return c;
  }
  // Offline greedy text of `prompt` (BOS + pieces), `max_tokens` tokens.
  std::string Offline(const std::string& prompt, int max_tokens) {
    auto ids = tokenizer_->Encode(prompt);
    EXPECT_TRUE(ids.ok());
    ids->insert(ids->begin(), 1);
    GenerationRequest r;
    r.prompt_ids = *ids;
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0.0f;
    auto engine =
        LocalEngine::Load(DemoModelDir(), &ops_, EngineOptions{},
                          KvCacheOptions{.num_blocks = 64}, tokenizer_.get());
    EXPECT_TRUE(engine.ok());
    auto result = (*engine)->engine().Generate(r);
    EXPECT_TRUE(result.ok());
    return result->text.value_or("");
  }
  // The text of a streamed completion, checking the SSE framing.
  static std::string StreamedText(const std::string& body) {
    std::string text;
    std::vector<std::string> events = absl::StrSplit(body, "\n\n");
    EXPECT_GE(events.size(), 2u);
    bool done = false;
    for (const std::string& e : events) {
      if (e.empty()) continue;
      EXPECT_EQ(e.rfind("data: ", 0), 0u) << e;
      const std::string payload = e.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      EXPECT_FALSE(done) << "an event after [DONE]";
      const json chunk = json::parse(payload);
      for (const json& c : chunk["choices"])
        text += c["text"].get<std::string>();
    }
    EXPECT_TRUE(done);
    return text;
  }

  CpuOps ops_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<LocalEngine> local_;
  std::unique_ptr<AsyncEngine> async_;
  std::unique_ptr<OpenAiServer> server_;
  std::thread loop_;
};

TEST_F(ServerTest, CompletionsEqualOfflineGenerationStreamedOrNot) {
  Start();
  const std::string want = Offline("Once upon a time", 24);
  httplib::Client c = Client();
  const json body = {{"model", "demo"},
                     {"prompt", "Once upon a time"},
                     {"max_tokens", 24},
                     {"temperature", 0}};
  auto res = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json j = json::parse(res->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], want);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 24);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);

  // Logprob tokens are the text's pieces, word-boundary spaces included.
  json with_logprobs = body;
  with_logprobs["logprobs"] = 2;
  auto lres =
      c.Post("/v1/completions", with_logprobs.dump(), "application/json");
  ASSERT_TRUE(lres);
  ASSERT_EQ(lres->status, 200) << lres->body;
  const json lj = json::parse(lres->body)["choices"][0];
  std::string joined;
  for (const json& t : lj["logprobs"]["tokens"]) joined += t.get<std::string>();
  EXPECT_EQ(joined, want);
  EXPECT_EQ(lj["logprobs"]["top_logprobs"].size(), 24u);

  json streamed = body;
  streamed["stream"] = true;
  auto sres = c.Post("/v1/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(sres);
  ASSERT_EQ(sres->status, 200);
  EXPECT_NE(sres->get_header_value("Content-Type").find("text/event-stream"),
            std::string::npos);
  EXPECT_EQ(StreamedText(sres->body), want);
}

// Several choices in one stream: each index's pieces add up to its text.
TEST_F(ServerTest, StreamedChoicesKeepTheirIndices) {
  Start();
  const std::string want = Offline("Once upon a time", 24);
  const json body = {{"model", "demo"},  {"prompt", "Once upon a time"},
                     {"max_tokens", 24}, {"temperature", 0},
                     {"n", 4},           {"stream", true}};
  auto res = Client().Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  std::vector<std::string> texts(4);
  std::vector<int> finished(4, 0);
  for (absl::string_view e : absl::StrSplit(res->body, "\n\n")) {
    if (!absl::StartsWith(e, "data: {")) continue;
    const json chunk = json::parse(std::string(e.substr(6)));
    for (const json& c : chunk["choices"]) {
      const int index = c["index"];
      ASSERT_GE(index, 0);
      ASSERT_LT(index, 4);
      texts[index] += c["text"].get<std::string>();
      if (!c["finish_reason"].is_null()) ++finished[index];
    }
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(texts[i], want) << "choice " << i;
    EXPECT_EQ(finished[i], 1) << "choice " << i;
  }
}

TEST_F(ServerTest, SixtyFourConcurrentStreamsGetTheirOfflineText) {
  Start();
  const std::vector<std::string> prompts = {"Once upon a time", "Lily and Ben",
                                            "The cat", "One day"};
  std::vector<std::string> want;
  for (const std::string& p : prompts) want.push_back(Offline(p, 32));
  std::vector<std::string> got(64);
  std::vector<std::thread> clients;
  for (int i = 0; i < 64; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client c = Client();
      const json body = {{"model", "demo"},
                         {"prompt", prompts[i % 4]},
                         {"max_tokens", 32},
                         {"temperature", 0},
                         {"stream", true}};
      auto res = c.Post("/v1/completions", body.dump(), "application/json");
      ASSERT_TRUE(res) << "client " << i << ": "
                       << httplib::to_string(res.error());
      ASSERT_EQ(res->status, 200) << res->body;
      got[i] = StreamedText(res->body);
    });
  }
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < 64; ++i) EXPECT_EQ(got[i], want[i % 4]) << "client " << i;
  EXPECT_GT(async_->engine_stats().scheduler.max_batch, 8);
}

TEST_F(ServerTest, BadRequestsGetOpenAiShapedErrors) {
  Start();
  httplib::Client c = Client();
  auto expect = [&](const std::string& path, const std::string& body,
                    int status, const std::string& param) {
    auto res = c.Post(path, body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, status) << body << " -> " << res->body;
    const json j = json::parse(res->body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << res->body;
    ASSERT_TRUE(j.contains("error")) << res->body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    if (!param.empty()) EXPECT_EQ(j["error"]["param"], param) << res->body;
  };
  expect("/v1/completions", "{not json", 400, "");
  expect("/v1/completions",
         R"({"model":"demo","prompt":"x","temperature":"hot"})", 400,
         "temperature");
  expect("/v1/completions", R"({"model":"demo","prompt":"x","top_p":0})", 400,
         "top_p");
  expect("/v1/completions", R"({"model":"other","prompt":"x"})", 404, "");
  // Longer than the context (512): refused before anything runs.
  std::string long_prompt;
  for (int i = 0; i < 600; ++i) long_prompt += "Lily ";
  expect("/v1/completions",
         json({{"model", "demo"}, {"prompt", long_prompt}}).dump(), 400, "");
  // No chat template in the demo folder.
  expect("/v1/chat/completions",
         R"({"model":"demo","messages":[{"role":"user","content":"hi"}]})", 400,
         "");
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "demo");
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(ServerTest, DisconnectCancelsTheRequestAndFreesItsBlocks) {
  Start();
  {
    httplib::Client c = Client();
    const json body = {{"model", "demo"},   {"prompt", "Once upon a time"},
                       {"max_tokens", 400}, {"ignore_eos", true},
                       {"temperature", 0},  {"stream", true}};
    int chunks = 0;
    // Reading stops (and the connection closes) after a few chunks.
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      return ++chunks < 3;
    };
    httplib::Response res;
    httplib::Error error;
    EXPECT_FALSE(c.send(req, res, error));  // Cancelled by the reader.
    EXPECT_EQ(chunks, 3);
  }
  // The server notices at its next write and cancels the request.
  for (int i = 0; i < 200 && async_->engine_stats().blocks.num_used_blocks > 0;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(async_->engine_stats().blocks.num_used_blocks, 0);
  EXPECT_EQ(async_->engine_stats().running, 0);
  auto metrics = Client().Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("tessera_kv_blocks_used 0"), std::string::npos)
      << metrics->body;
}

// Not streamed: the server finds out at its next keep-alive space that the
// client is gone, and cancels every choice.
TEST_F(ServerTest, NonStreamingDisconnectCancelsToo) {
  Start();
  {
    httplib::Client c = Client();
    c.set_read_timeout(0, 300000);  // Gives up after 0.3 s.
    const json body = {{"model", "demo"},   {"prompt", "Once upon a time"},
                       {"max_tokens", 500}, {"ignore_eos", true},
                       {"n", 128},          {"temperature", 0.7},
                       {"seed", 1}};
    auto res = c.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_FALSE(res);
  }
  for (int i = 0;
       i < 400 && (async_->engine_stats().blocks.num_used_blocks > 0 ||
                   async_->engine_stats().waiting > 0);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(async_->engine_stats().blocks.num_used_blocks, 0);
  auto metrics = Client().Get("/metrics");
  ASSERT_TRUE(metrics);
  // Cancelled, not finished: counted as an error, no tokens reported.
  EXPECT_NE(metrics->body.find("tessera_requests_total{status=\"error\"} 1"),
            std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find("tessera_generation_tokens_total 0"),
            std::string::npos)
      << metrics->body;
}

TEST_F(ServerTest, FullQueueAnswers429) {
  Start(/*max_pending=*/1);
  httplib::Client slow = Client();
  std::thread hog([&] {
    const json body = {{"model", "demo"},
                       {"prompt", "Once upon a time"},
                       {"max_tokens", 300},
                       {"ignore_eos", true},
                       {"temperature", 0}};
    slow.Post("/v1/completions", body.dump(), "application/json");
  });
  // Wait until the first request holds the only place.
  for (int i = 0; i < 200 && async_->stats().accepted == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto res = Client().Post(
      "/v1/completions",
      json({{"model", "demo"}, {"prompt", "x"}, {"max_tokens", 2}}).dump(),
      "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429) << res->body;
  hog.join();
}

}  // namespace
}  // namespace tessera
