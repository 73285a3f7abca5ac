#include "kwq/sharded_queue.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace kwq {
namespace {

TEST(ShardedQueueTest, RejectsBadShardCounts) {
  EXPECT_EQ(ShardedQueue<int>::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardedQueue<int>::Create(-3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardedQueue<int>::Create(5000).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ShardedQueue<int>::Create(1).ok());
}

TEST(ShardedQueueTest, KeyAlwaysMapsToOneShardAndShardsAreUsed) {
  auto q = *ShardedQueue<std::string>::Create(4);
  std::vector<int> per_shard(4);
  for (int i = 0; i < 4000; ++i) {
    const std::string key = absl::StrCat("default/object-", i);
    const int s = q->ShardOf(key);
    ASSERT_EQ(s, q->ShardOf(key));
    ++per_shard[s];
    q->Add(key);
  }
  for (int s = 0; s < 4; ++s) {
    EXPECT_GT(per_shard[s], 800) << "shard " << s;  // 1000 expected: roughly even
    EXPECT_EQ(q->shard(s).Len(), static_cast<size_t>(per_shard[s]));
  }
  EXPECT_EQ(q->Len(), 4000u);
}

TEST(ShardedQueueTest, DedupAndRequeueHoldPerKey) {
  auto q = *ShardedQueue<std::string>::Create(3);
  EXPECT_TRUE(q->Add("a"));
  EXPECT_FALSE(q->Add("a"));
  auto lease = q->TryGet(0);
  ASSERT_TRUE(lease.has_value());
  EXPECT_TRUE(q->Add("a"));
  for (int w = 0; w < 3; ++w) EXPECT_FALSE(q->TryGet(w).has_value());  // in flight
  lease->Done();
  EXPECT_TRUE(q->TryGet(1).has_value());
}

TEST(ShardedQueueTest, IdleWorkerStealsFromOtherShards) {
  auto q = *ShardedQueue<int>::Create(4);
  int key = 0;
  while (q->ShardOf(key) != 2) ++key;
  q->Add(key);
  auto lease = q->Get(0);  // shard 0 is empty: steals from shard 2 instead of sleeping
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(**lease, key);
  lease->Done();
  EXPECT_EQ(q->shard(2).InFlight(), 0u);  // the lease ended in the home shard
}

TEST(ShardedQueueTest, ShutDownWithDrainDrainsEveryShard) {
  auto q = *ShardedQueue<int>::Create(2);
  for (int i = 0; i < 100; ++i) q->Add(i);
  std::vector<std::thread> workers;
  std::atomic<int> seen{0};
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back([&, w] {
      while (auto lease = q->Get(w)) ++seen;
    });
  }
  EXPECT_TRUE(q->ShutDownWithDrain());
  for (auto& t : workers) t.join();
  EXPECT_EQ(seen.load(), 100);
  EXPECT_FALSE(q->Add(1));
}

TEST(ShardedQueueStressTest, NoKeyHeldByTwoWorkersWhileStealing) {
  constexpr int kShards = 4, kKeys = 64, kAdds = 40000;
  auto q = *ShardedQueue<int>::Create(kShards);
  std::vector<std::atomic<int>> busy(kKeys);
  std::vector<std::atomic<int>> added(kKeys), seen(kKeys);
  std::atomic<bool> overlap{false};
  std::vector<std::thread> workers;
  for (int w = 0; w < kShards; ++w) {
    workers.emplace_back([&, w] {
      while (auto lease = q->Get(w)) {
        const int k = **lease;
        if (busy[k].fetch_add(1) != 0) overlap = true;
        seen[k].store(added[k].load());
        busy[k].fetch_sub(1);
      }
    });
  }
  std::thread producer([&] {
    for (int i = 0; i < kAdds; ++i) {
      const int k = (i * 13) % kKeys;
      added[k].fetch_add(1);
      q->Add(k);
    }
  });
  producer.join();
  EXPECT_TRUE(q->ShutDownWithDrain());
  for (auto& t : workers) t.join();
  EXPECT_FALSE(overlap.load());
  for (int k = 0; k < kKeys; ++k) EXPECT_EQ(seen[k].load(), added[k].load()) << k;
}

}  // namespace
}  // namespace kwq
