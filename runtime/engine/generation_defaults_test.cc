#include "runtime/engine/generation_defaults.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(GenerationDefaultsTest, ReadsVllmFieldsAndIgnoresTheRest) {
  absl::StatusOr<GenerationDefaults> d = ParseGenerationDefaults(
      R"({"do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
          "min_p": 0.0, "repetition_penalty": 1.05, "max_new_tokens": 2048,
          "eos_token_id": [151645, 151643], "num_beams": 1})");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FLOAT_EQ(*d->temperature, 0.6f);
  EXPECT_FLOAT_EQ(*d->top_p, 0.95f);
  EXPECT_EQ(*d->top_k, 20);
  EXPECT_FLOAT_EQ(*d->min_p, 0.0f);
  EXPECT_FLOAT_EQ(*d->repetition_penalty, 1.05f);
  EXPECT_EQ(*d->max_tokens, 2048);
  EXPECT_FALSE(d->empty());
  EXPECT_NE(d->Describe().find("temperature=0.6"), std::string::npos);
}

TEST(GenerationDefaultsTest, AbsentAndNullAreUnset) {
  absl::StatusOr<GenerationDefaults> d =
      ParseGenerationDefaults(R"({"bos_token_id": 1, "temperature": null})");
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->empty());
  EXPECT_EQ(d->Describe(), "none");
}

TEST(GenerationDefaultsTest, TopKMinusOneIsOff) {
  absl::StatusOr<GenerationDefaults> d =
      ParseGenerationDefaults(R"({"top_k": -1})");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d->top_k, 0);
}

TEST(GenerationDefaultsTest, BadValuesNameTheKey) {
  for (const char* text :
       {R"({"temperature": -1})", R"({"top_p": 0})", R"({"top_p": 1.5})",
        R"({"top_k": 2.5})", R"({"top_k": -2})", R"({"min_p": 2})",
        R"({"repetition_penalty": 0})", R"({"max_new_tokens": 0})",
        R"({"temperature": "hot"})",
        R"({"max_new_tokens": 18446744073709551615})", R"([1, 2])",
        R"({"temperature": )"}) {
    absl::StatusOr<GenerationDefaults> d = ParseGenerationDefaults(text);
    EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << text;
  }
  absl::StatusOr<GenerationDefaults> d =
      ParseGenerationDefaults(R"({"top_p": 7})");
  EXPECT_NE(d.status().message().find("top_p"), std::string::npos);
}

TEST(GenerationDefaultsTest, Modes) {
  const std::string dir =
      std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR")
                                             : "/tmp") +
      "/gen_defaults";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/generation_config.json") << R"({"temperature": 0.7})";
  absl::StatusOr<GenerationDefaults> d = LoadGenerationDefaults(dir, "auto");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FLOAT_EQ(*d->temperature, 0.7f);
  EXPECT_TRUE(LoadGenerationDefaults(dir, "vllm")->empty());
  EXPECT_TRUE(LoadGenerationDefaults(dir, "none")->empty());
  // A folder named by the flag.
  d = LoadGenerationDefaults("/nonexistent-model", dir);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FLOAT_EQ(*d->temperature, 0.7f);
  // auto without a file: no defaults.
  const std::string empty_dir = dir + "/empty";
  std::filesystem::create_directories(empty_dir);
  EXPECT_TRUE(LoadGenerationDefaults(empty_dir, "auto")->empty());
  EXPECT_TRUE(
      absl::IsNotFound(LoadGenerationDefaults(dir, empty_dir).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      LoadGenerationDefaults(dir, "/no/such/folder").status()));
  // A malformed file is an error, not "no defaults".
  std::ofstream(empty_dir + "/generation_config.json") << "{";
  EXPECT_TRUE(absl::IsInvalidArgument(
      LoadGenerationDefaults(empty_dir, "auto").status()));
}

}  // namespace
}  // namespace tessera
