#include "kv_pool.h"

#include <cstring>
#include <new>

namespace kiln::rt {

void KvCache::CopyRows(int64_t from, int64_t to, int64_t n) const {
  const size_t codes = static_cast<size_t>(n) * row_bytes(), scales = static_cast<size_t>(n) * row_scales() * 4;
  for (int64_t l = 0; l < layers; ++l) {
    std::memcpy(K(l, to), K(l, from), codes);
    std::memcpy(V(l, to), V(l, from), codes);
    if (scales > 0) {
      std::memcpy(KS(l, to), KS(l, from), scales);
      std::memcpy(VS(l, to), VS(l, from), scales);
    }
  }
}

namespace {
uint64_t Half(const KvCache& c) { return static_cast<uint64_t>(c.layers) * c.rows * c.row_bytes(); }
uint64_t HalfScales(const KvCache& c) { return static_cast<uint64_t>(c.layers) * c.rows * c.row_scales() * 4; }
}  // namespace

uint64_t KvPool::Bytes(const KvCache& shape, int64_t blocks, int32_t shift) {
  KvCache c = shape;
  c.rows = blocks << shift;
  // Keys and values, codes and scales, the reference counts and the free stack.
  return 2 * (Half(c) + HalfScales(c)) + 2 * static_cast<uint64_t>(blocks) * 4 + sizeof(KvPool);
}

KvPool* KvPool::Create(const KvCache& shape, int32_t blocks, int32_t shift, Allocator* allocator) {
  void* mem = allocator->Alloc(sizeof(KvPool), 64);
  if (mem == nullptr) return nullptr;
  KvPool* p = new (mem) KvPool();
  p->allocator_ = allocator;
  p->store_ = shape;
  p->store_.blocks = nullptr;
  p->store_.rows = static_cast<int64_t>(blocks) << shift;
  p->store_.context = p->store_.rows;
  p->capacity_ = blocks;
  p->shift_ = shift;
  const uint64_t half = Half(p->store_), scales = HalfScales(p->store_);
  bool ok = true;
  auto alloc = [&](uint64_t bytes, auto** out) {
    if (!ok) return;
    if (bytes == 0) return;
    *out = static_cast<std::remove_reference_t<decltype(**out)>*>(allocator->Alloc(bytes, 64));
    ok = *out != nullptr;
  };
  alloc(half, &p->store_.keys);
  alloc(half, &p->store_.values);
  alloc(scales, &p->store_.key_scales);
  alloc(scales, &p->store_.value_scales);
  alloc(static_cast<uint64_t>(blocks) * 4, &p->refs_);
  alloc(static_cast<uint64_t>(blocks) * 4, &p->free_);
  if (!ok) {
    Destroy(p);
    return nullptr;
  }
  // Lowest blocks first: a lightly used pool keeps its resident pages together.
  for (int32_t b = 0; b < blocks; ++b) {
    p->refs_[b] = 0;
    p->free_[b] = blocks - 1 - b;
  }
  p->free_count_ = blocks;
  return p;
}

void KvPool::Destroy(KvPool* p) {
  if (p == nullptr) return;
  Allocator* a = p->allocator_;
  a->Free(p->store_.keys);
  a->Free(p->store_.values);
  a->Free(p->store_.key_scales);
  a->Free(p->store_.value_scales);
  a->Free(p->refs_);
  a->Free(p->free_);
  p->~KvPool();
  a->Free(p);
}

int32_t KvPool::Acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_count_ == 0) return -1;
  const int32_t b = free_[--free_count_];
  refs_[b] = 1;
  return b;
}

void KvPool::Retain(int32_t b) {
  std::lock_guard<std::mutex> lock(mu_);
  ++refs_[b];
}

void KvPool::Release(int32_t b) {
  std::lock_guard<std::mutex> lock(mu_);
  if (--refs_[b] == 0) free_[free_count_++] = b;
}

bool KvPool::Shared(int32_t b) {
  std::lock_guard<std::mutex> lock(mu_);
  return refs_[b] > 1;
}

int32_t KvPool::used() {
  std::lock_guard<std::mutex> lock(mu_);
  return capacity_ - free_count_;
}

}  // namespace kiln::rt
