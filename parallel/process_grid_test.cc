#include "parallel/process_grid.h"

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(ProcessGridTest, TpGroupsAreConsecutiveRanks) {
  auto grid = ProcessGrid::Create(8, 4, 2);
  ASSERT_TRUE(grid.ok());
  EXPECT_EQ(grid->Position(5).pp_stage, 1);
  EXPECT_EQ(grid->Position(5).tp_rank, 1);
  EXPECT_EQ(grid->Position(3).pp_stage, 0);
  EXPECT_EQ(grid->RankOf(1, 3), 7);
  for (int r = 0; r < 8; ++r) {
    const GridPosition p = grid->Position(r);
    EXPECT_EQ(grid->RankOf(p.pp_stage, p.tp_rank), r);
  }
}

TEST(ProcessGridTest, WorldMustEqualTpTimesPp) {
  EXPECT_FALSE(ProcessGrid::Create(3, 2, 2).ok());
  EXPECT_NE(ProcessGrid::Create(3, 2, 2).status().message().find("3 ranks"),
            std::string::npos);
  EXPECT_FALSE(ProcessGrid::Create(2, 0, 2).ok());
}

}  // namespace
}  // namespace tessera
