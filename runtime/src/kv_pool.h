// A paged KV cache's block pool, shared by the sessions of one model
// (kiln_model_options_t.kv_pool_tokens, or what a memory budget leaves): the rows of
// every layer's keys and values in blocks of 2^shift positions. A session maps its
// positions to blocks through its block table, takes blocks as its conversation
// grows and returns them when it shrinks or ends; kiln_session_fork shares a
// session's blocks (reference counts), and a session about to write into a block
// another one still reads, or a published one, copies it first.
//
// Full blocks are published: a session that starts with the same tokens (the same
// image and system prompt) finds them and maps them instead of prefilling. A block's
// content is identified exactly by its positions' ids, its parent (the block before
// it in the publishing session, with that block's generation, bumped whenever a
// block is taken again or written in place, so that children of changed content are
// never found) and, when it holds image tokens, the image's hash. A published block
// no session holds any more stays findable until it is taken again; free blocks are
// taken oldest-freed first. Thread-safe.
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
  // What a full block's keys and values depend on besides its ids.
  struct Tag {
    int32_t parent = -1;     // the block before it (-1: it starts the sequence)
    uint32_t parent_generation = 0;
    uint64_t image[2] = {0, 0};  // the image's hash when the block holds image tokens
  };

  // A pool of `blocks` blocks shaped as `shape` (layers, width, encoding, group);
  // its storage is allocated, not touched: pages become resident as blocks fill.
  // Null when out of memory.
  static KvPool* Create(const KvCache& shape, int32_t blocks, int32_t shift, Allocator* allocator);
  static void Destroy(KvPool* pool);
  // The bytes Create allocates.
  static uint64_t Bytes(const KvCache& shape, int64_t blocks, int32_t shift);

  // A free block with one reference (the one freed longest ago; a published one is
  // forgotten), or -1 when every block is taken.
  int32_t Acquire();
  void Retain(int32_t block);
  void Release(int32_t block);
  // Whether a session holding `block` may write into it in place: no other session
  // holds it and it is not published (a published block stays findable as it is).
  bool Writable(int32_t block);
  uint32_t Generation(int32_t block);

  // Makes full block `block` findable by its 2^shift ids and tag (nothing when it is,
  // or an equal block is).
  void Publish(int32_t block, const int32_t* ids, const Tag& tag);
  // A published block with these ids and tag, with one more reference, or -1.
  int32_t Find(const int32_t* ids, const Tag& tag);
  // The published block of this parent whose ids share the longest prefix with
  // ids[0, n) (n <= 2^shift), with one more reference, and that prefix's length in
  // *common (the image hash must match when the common ids reach ids[first_image]);
  // -1 when none shares one.
  int32_t FindPrefix(const int32_t* ids, int64_t n, int64_t first_image, const Tag& tag, int64_t* common);
  // `block` is about to be written in place: no longer findable, a new generation.
  void Forget(int32_t block);
  // Gives the pages of every free block back to the system (platform DiscardPages);
  // published ones are forgotten first. Returns the blocks trimmed.
  int32_t Trim();

  const KvCache& store() const { return store_; }  // blocks == nullptr
  int32_t capacity() const { return capacity_; }
  int32_t shift() const { return shift_; }
  int32_t used();

 private:
  KvPool() = default;
  uint64_t Key(const int32_t* ids, const Tag& tag) const;
  bool Same(int32_t block, uint64_t key, const int32_t* ids, const Tag& tag) const;
  int32_t FindLocked(uint64_t key, const int32_t* ids, const Tag& tag) const;
  void Unpublish(int32_t block);

  Allocator* allocator_ = nullptr;
  KvCache store_;
  int32_t capacity_ = 0, shift_ = 0;
  std::mutex mu_;
  int32_t* refs_ = nullptr;        // [capacity]
  uint32_t* generation_ = nullptr; // [capacity]
  // Free blocks, oldest first (a ring of capacity entries; an entry whose block was
  // found again meanwhile is skipped). Every block without references is in it.
  int32_t* ring_ = nullptr;
  uint8_t* in_ring_ = nullptr;
  int64_t ring_head_ = 0, ring_count_ = 0;
  int32_t free_count_ = 0;
  // Published blocks: their ids, tags and keys, and an open-addressing table of
  // block ids by key (linear probing, -1 empty).
  int32_t* ids_ = nullptr;  // [capacity << shift]
  Tag* tags_ = nullptr;
  uint64_t* keys_ = nullptr;
  uint8_t* published_ = nullptr;
  int32_t* table_ = nullptr;
  uint32_t table_mask_ = 0;
};

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_SRC_KV_POOL_H_
