// The system protoc and libprotobuf are wired through Bazel's native proto
// rules: a message survives serialization unchanged, and truncated bytes are
// rejected rather than misread.
#include <string>

#include "gtest/gtest.h"
#include "proto/tessera.pb.h"

namespace tessera {
namespace {

TEST(TesseraProtoTest, ManifestRoundTrips) {
  proto::ModelManifest m;
  m.set_model_type("qwen3");
  m.set_num_layers(28);
  m.set_head_dim(128);
  m.set_rms_norm_eps(1e-6);
  m.set_tensor_parallel(2);
  const std::string bytes = m.SerializeAsString();
  proto::ModelManifest back;
  ASSERT_TRUE(back.ParseFromString(bytes));
  EXPECT_EQ(back.model_type(), "qwen3");
  EXPECT_EQ(back.num_layers(), 28);
  EXPECT_EQ(back.tensor_parallel(), 2);
  EXPECT_FALSE(back.ParseFromString(bytes.substr(0, bytes.size() - 3)));
}

}  // namespace
}  // namespace tessera
