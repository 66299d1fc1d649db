#include "runtime/core/model_file.h"

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base != nullptr ? base : "/tmp") + "/" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

TEST(ModelFileTest, ReadsARegularFile) {
  const std::string path = TempDir("regular") + "/config.json";
  std::ofstream(path) << "{\"a\": 1}";
  absl::StatusOr<std::string> text = ReadRegularFile(path);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "{\"a\": 1}");
}

TEST(ModelFileTest, MissingIsNotFound) {
  absl::StatusOr<std::string> text =
      ReadRegularFile(TempDir("missing") + "/config.json");
  EXPECT_TRUE(absl::IsNotFound(text.status())) << text.status();
}

// Before: a plain open() of a FIFO with no writer blocked forever (ctest's
// timeout is the only thing that would end this test).
TEST(ModelFileTest, FifoIsRefusedAtOnce) {
  const std::string path = TempDir("fifo") + "/model.safetensors";
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
  absl::StatusOr<std::string> text = ReadRegularFile(path);
  EXPECT_TRUE(absl::IsInvalidArgument(text.status())) << text.status();
  EXPECT_THAT(text.status().message(),
              HasSubstr(path + " is a FIFO, not a regular file"));
  absl::StatusOr<ScopedFd> fd = OpenRegularFile(path);
  EXPECT_TRUE(absl::IsInvalidArgument(fd.status())) << fd.status();
}

TEST(ModelFileTest, DirectoryAndDeviceAreRefused) {
  const std::string dir = TempDir("dir") + "/tokenizer.json";
  ::mkdir(dir.c_str(), 0755);
  absl::StatusOr<std::string> text = ReadRegularFile(dir);
  EXPECT_THAT(text.status().message(), HasSubstr("is a directory"));
  text = ReadRegularFile("/dev/zero");
  EXPECT_THAT(text.status().message(),
              HasSubstr("/dev/zero is a character device, not a regular file"));
}

TEST(ModelFileTest, LargerThanTheLimitIsRefused) {
  const std::string path = TempDir("large") + "/config.json";
  std::ofstream(path) << std::string(100, 'x');
  absl::StatusOr<std::string> text = ReadRegularFile(path, 10);
  EXPECT_TRUE(absl::IsInvalidArgument(text.status())) << text.status();
  EXPECT_THAT(text.status().message(), HasSubstr("100 bytes"));
}

}  // namespace
}  // namespace tessera
