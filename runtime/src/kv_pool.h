// A paged KV cache's block pool, shared by the sessions of one model
// (kiln_model_options_t.kv_pool_tokens, or what a memory budget leaves): the rows of
// every layer's keys and values in blocks of 2^shift positions. A session maps its
// positions to blocks through its block table, takes blocks as its conversation
// grows and returns them when it shrinks or ends; kiln_session_fork shares a
// session's blocks (reference counts), and a session about to write into a block
// another one still reads copies it first. Thread-safe.
#ifndef KILN_RUNTIME_SRC_KV_POOL_H_
#define KILN_RUNTIME_SRC_KV_POOL_H_

#include <cstdint>
#include <mutex>
#include <type_traits>

#include "kv_cache.h"
#include "support/allocator.h"

namespace kiln::rt {

class KvPool {
 public:
  // A pool of `blocks` blocks shaped as `shape` (layers, width, encoding, group);
  // its storage is allocated, not touched: pages become resident as blocks fill.
  // Null when out of memory.
  static KvPool* Create(const KvCache& shape, int32_t blocks, int32_t shift, Allocator* allocator);
  static void Destroy(KvPool* pool);
  // The bytes Create allocates.
  static uint64_t Bytes(const KvCache& shape, int64_t blocks, int32_t shift);

  // A free block with one reference, or -1 when every block is taken.
  int32_t Acquire();
  void Retain(int32_t block);
  void Release(int32_t block);
  bool Shared(int32_t block);

  const KvCache& store() const { return store_; }  // blocks == nullptr
  int32_t capacity() const { return capacity_; }
  int32_t shift() const { return shift_; }
  int32_t used();

 private:
  KvPool() = default;
  Allocator* allocator_ = nullptr;
  KvCache store_;
  int32_t capacity_ = 0, shift_ = 0;
  std::mutex mu_;
  int32_t* refs_ = nullptr;  // [capacity]
  int32_t* free_ = nullptr;  // a stack of free blocks
  int32_t free_count_ = 0;
};

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_SRC_KV_POOL_H_
