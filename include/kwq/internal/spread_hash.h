// File: kwq/internal/spread_hash.h
//
// FoldHash: the 32 bits kwq's tables keep of a key's hash (Hash{}(key)): the low 32 bits
// of the two halves of the 128-bit product of the hash and an odd 64-bit constant,
// xor-ed (Abseil's own mix), so every bit of the hash reaches the bits kept, the low ones
// too. (Xor-ing the halves of that again, tried next, collided keys whose two 32-bit
// halves are equal: 366,464 of 4,000,000 against about 1,900 for random keys; this
// stays near the random rate for every pattern tried: i, i << 32, i << 40, i << 42,
// i * (2^32 + 1), (i << 32) ^ 3i, i << 16, random.) They kept the hash's low 32 bits once, and keys
// whose hashes differ only above bit 31 (std::hash of a 64-bit integer is the integer) collided:
// adds slowed from 0.06 to 79 us at 40,000 such keys (an audit's measurement), and a ShardedQueue
// put them all in one shard. The top half of a 64-bit product, tried next, still left keys that
// differ only in their top bits with low bits of zero, which absl's tag and probe start are made
// of: 4.2 us per add at 4,096 keys i << 52 (a review's measurement).
//
// SpreadHash: a key's stored 32-bit hash (kwq's tables keep 32 bits per key) as the
// 64-bit hash absl's tables take. absl takes a probe's start from bits 7 and up, so the
// bare 32 bits reached only the first 2^25 groups of positions: past about 33 million
// keys every add probed into that part of the table, about 200 times slower (an audit
// measured 40 us per add). Multiplying by an odd 64-bit constant (Fibonacci hashing)
// spreads them over all 64 bits and leaves the low 7 bits, absl's tag, a bijection of the
// hash's own. Internal: used by the queues' key table and the limiters' failure table.

#ifndef KWQ_INTERNAL_SPREAD_HASH_H_
#define KWQ_INTERNAL_SPREAD_HASH_H_

#include <cstddef>
#include <cstdint>

namespace kwq::internal {

// A 128-bit product (`__extension__`: __int128 is a GNU extension, and a user's
// -Wpedantic build of a file including a queue header warned on it).
__extension__ typedef unsigned __int128 Uint128;

inline uint32_t FoldHash(size_t hash) {
  const Uint128 product = static_cast<Uint128>(static_cast<uint64_t>(hash)) * 0x9E3779B97F4A7C15ull;
  return static_cast<uint32_t>(static_cast<uint64_t>(product >> 64) ^
                               static_cast<uint64_t>(product));
}

inline size_t SpreadHash(uint32_t hash) {
  return static_cast<size_t>(uint64_t{hash} * 0x9E3779B97F4A7C15ull);
}

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_SPREAD_HASH_H_
