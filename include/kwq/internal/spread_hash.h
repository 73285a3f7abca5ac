// File: kwq/internal/spread_hash.h
//
// FoldHash: the 32 bits kwq's tables keep of a key's hash (Hash{}(key)): the top half of
// the hash times an odd 64-bit constant, so every bit of the hash counts. They kept its low
// 32 bits once, and keys whose hashes differ only above bit 31 (std::hash of a 64-bit
// integer is the integer) collided: adds slowed from 0.06 to 79 us at 40,000 such keys
// (an audit's measurement), and a ShardedQueue put them all in one shard.
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

inline uint32_t FoldHash(size_t hash) {
  return static_cast<uint32_t>((static_cast<uint64_t>(hash) * 0x9E3779B97F4A7C15ull) >> 32);
}

inline size_t SpreadHash(uint32_t hash) {
  return static_cast<size_t>(uint64_t{hash} * 0x9E3779B97F4A7C15ull);
}

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_SPREAD_HASH_H_
