#include "kv_pool.h"

#include <cstring>
#include <new>

#include "platform/platform.h"

namespace kiln::rt {

void KvCache::CopyRows(const KvCache& src, int64_t from, int64_t to, int64_t n) const {
  const size_t codes = static_cast<size_t>(n) * row_bytes(), scales = static_cast<size_t>(n) * row_scales() * 4;
  for (int64_t l = 0; l < layers; ++l) {
    std::memmove(K(l, to), src.K(l, from), codes);  // overlapping when a window slides
    std::memmove(V(l, to), src.V(l, from), codes);
    if (scales > 0) {
      std::memmove(KS(l, to), src.KS(l, from), scales);
      std::memmove(VS(l, to), src.VS(l, from), scales);
    }
  }
}

void KvCache::Append(int64_t layer, int64_t first, int64_t n, const float* k, const float* v, int64_t ld,
                     Exact* exact) const {
  *exact = Exact();
  if (span == 0) {
    for (int64_t t = 0; t < n; ++t) Write(layer, first + t, k + t * ld, v + t * ld);
    return;
  }
  const uint64_t w = static_cast<uint64_t>(width);
  for (int64_t t = 0; t < n; ++t) {  // values per row, as without spans
    const int64_t r = Phys(first + t);
    format::EncodeKvRow(encoding, group, v + t * ld, w, V(layer, r), VS(layer, r));
  }
  // The exact rows from the start of the first row's span: the open rows, with this
  // call's appended when they stay in one span, else staged.
  const int64_t last = first + n - 1, from = first / span * span, end = last / span * span;
  float* ok = open_k + layer * span * width;
  float* ov = open_v + layer * span * width;
  float *ek = ok, *ev = ov;
  if (end != from) {
    ek = stage_k;
    ev = stage_v;
    std::memcpy(ek, ok, static_cast<size_t>(first - from) * w * 4);
    std::memcpy(ev, ov, static_cast<size_t>(first - from) * w * 4);
  }
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(ek + (first - from + t) * width, k + t * ld, w * 4);
    std::memcpy(ev + (first - from + t) * width, v + t * ld, w * 4);
  }
  // Every span this call completes: its keys per channel (its rows are contiguous:
  // the span divides a paged cache's block).
  for (int64_t s0 = from; s0 + span - 1 <= last; s0 += span) {
    const int64_t r0 = Phys(s0);
    format::EncodeKeySpan(encoding, group, ek + (s0 - from) * width, w, static_cast<uint64_t>(span), w,
                          K(layer, r0), KS(layer, r0));
  }
  if (end != from) {  // the span now being filled
    std::memcpy(ok, ek + (end - from) * width, static_cast<size_t>(last + 1 - end) * w * 4);
    std::memcpy(ov, ev + (end - from) * width, static_cast<size_t>(last + 1 - end) * w * 4);
  }
  *exact = ExactOf(layer, first, n);  // ek, ev and from
}

void KvCache::DecodeOpen(int64_t from) const {
  const int64_t first = from - from % span;
  const uint64_t w = static_cast<uint64_t>(width);
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t j = first; j < from; ++j) {
      const int64_t r = Phys(j);
      format::DecodeKeySpanRow(encoding, group, K(l, r), KS(l, Phys(first)), 0, w, open_k + (l * span + j - first) * width);
      format::DecodeKvSpan(encoding, group, V(l, r), VS(l, r), 0, w, open_v + (l * span + j - first) * width);
    }
}

void KvCache::DiscardRows(int64_t from, int64_t n) const {
  const size_t codes = static_cast<size_t>(n) * row_bytes(), scales = static_cast<size_t>(n) * row_scales() * 4;
  for (int64_t l = 0; l < layers; ++l) {
    DiscardPages(K(l, from), codes);
    DiscardPages(V(l, from), codes);
    if (scales > 0) {
      DiscardPages(KS(l, from), scales);
      DiscardPages(VS(l, from), scales);
    }
  }
}

namespace {

uint64_t Half(const KvCache& c) { return static_cast<uint64_t>(c.layers) * c.rows * c.row_bytes(); }
uint64_t HalfScales(const KvCache& c) { return static_cast<uint64_t>(c.layers) * c.rows * c.row_scales() * 4; }

// The open-addressing table's slots: a power of two, at least twice the blocks.
uint32_t TableSize(int64_t blocks) {
  uint32_t n = 16;
  while (n < 2 * blocks) n *= 2;
  return n;
}

// Per block: reference count, generation, ring entry and flag, tag, key, published
// flag; per position: its id.
uint64_t BookkeepingBytes(int64_t blocks, int32_t shift) {
  return static_cast<uint64_t>(blocks) *
             (4 + 4 + 4 + 1 + sizeof(KvPool::Tag) + 8 + 1 + (uint64_t{4} << shift)) +
         4ull * TableSize(blocks);
}

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 29);
}

}  // namespace

uint64_t KvPool::Bytes(const KvCache& shape, int64_t blocks, int32_t shift) {
  KvCache c = shape;
  c.rows = blocks << shift;
  return 2 * (Half(c) + HalfScales(c)) + BookkeepingBytes(blocks, shift) + sizeof(KvPool);
}

KvPool* KvPool::Create(const KvCache& shape, int32_t blocks, int32_t shift, Allocator* allocator) {
  void* mem = allocator->Alloc(sizeof(KvPool), 64);
  if (mem == nullptr) return nullptr;
  KvPool* p = new (mem) KvPool();
  p->allocator_ = allocator;
  p->store_ = shape;
  p->store_.blocks = nullptr;
  p->store_.rows = static_cast<int64_t>(blocks) << shift;
  p->store_.context = p->store_.mapped = p->store_.rows;
  p->capacity_ = blocks;
  p->shift_ = shift;
  const uint32_t table = TableSize(blocks);
  p->table_mask_ = table - 1;
  bool ok = true;
  auto alloc = [&](uint64_t bytes, auto** out) {
    if (!ok || bytes == 0) return;
    *out = static_cast<std::remove_reference_t<decltype(**out)>*>(allocator->Alloc(bytes, 64));
    ok = *out != nullptr;
  };
  const uint64_t n = static_cast<uint64_t>(blocks);
  alloc(Half(p->store_), &p->store_.keys);
  alloc(Half(p->store_), &p->store_.values);
  alloc(HalfScales(p->store_), &p->store_.key_scales);
  alloc(HalfScales(p->store_), &p->store_.value_scales);
  alloc(n * 4, &p->refs_);
  alloc(n * 4, &p->generation_);
  alloc(n * 4, &p->ring_);
  alloc(n, &p->in_ring_);
  alloc(n << shift << 2, &p->ids_);
  alloc(n * sizeof(Tag), &p->tags_);
  alloc(n * 8, &p->keys_);
  alloc(n, &p->published_);
  alloc(uint64_t{table} * 4, &p->table_);
  if (!ok) {
    Destroy(p);
    return nullptr;
  }
  // Lowest blocks first: a lightly used pool keeps its resident pages together.
  for (int32_t b = 0; b < blocks; ++b) {
    p->refs_[b] = 0;
    p->generation_[b] = 0;
    p->ring_[b] = b;
    p->in_ring_[b] = 1;
    p->published_[b] = 0;
    new (&p->tags_[b]) Tag();
  }
  p->ring_head_ = 0;
  p->ring_count_ = blocks;
  p->free_count_ = blocks;
  for (uint32_t i = 0; i < table; ++i) p->table_[i] = -1;
  return p;
}

void KvPool::Destroy(KvPool* p) {
  if (p == nullptr) return;
  Allocator* a = p->allocator_;
  void* bufs[] = {p->store_.keys, p->store_.values, p->store_.key_scales, p->store_.value_scales,
                  p->refs_,       p->generation_,   p->ring_,             p->in_ring_,
                  p->ids_,        p->tags_,         p->keys_,             p->published_,
                  p->table_};
  for (void* b : bufs) a->Free(b);
  p->~KvPool();
  a->Free(p);
}

int32_t KvPool::Acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_count_ == 0) return -1;
  for (;;) {  // free_count_ > 0: a block without references is in the ring
    const int32_t b = ring_[ring_head_];
    ring_head_ = (ring_head_ + 1) % capacity_;
    --ring_count_;
    in_ring_[b] = 0;
    if (refs_[b] != 0) continue;  // found again since it was freed
    --free_count_;
    refs_[b] = 1;
    Unpublish(b);
    ++generation_[b];
    return b;
  }
}

void KvPool::Retain(int32_t b) {
  std::lock_guard<std::mutex> lock(mu_);
  ++refs_[b];
}

void KvPool::Release(int32_t b) {
  std::lock_guard<std::mutex> lock(mu_);
  if (--refs_[b] != 0) return;
  ++free_count_;
  if (!in_ring_[b]) {
    ring_[(ring_head_ + ring_count_) % capacity_] = b;
    ++ring_count_;
    in_ring_[b] = 1;
  }
}

bool KvPool::Writable(int32_t b) {
  std::lock_guard<std::mutex> lock(mu_);
  return refs_[b] == 1 && !published_[b];
}

uint32_t KvPool::Generation(int32_t b) {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_[b];
}

int32_t KvPool::used() {
  std::lock_guard<std::mutex> lock(mu_);
  return capacity_ - free_count_;
}

uint64_t KvPool::Key(const int32_t* ids, const Tag& tag) const {
  uint64_t h = Mix(Mix(static_cast<uint64_t>(static_cast<uint32_t>(tag.parent)), tag.parent_generation),
                   Mix(tag.image[0], tag.image[1]));
  for (int64_t i = 0; i < (int64_t{1} << shift_); ++i) h = Mix(h, static_cast<uint32_t>(ids[i]));
  return h;
}

bool KvPool::Same(int32_t b, uint64_t key, const int32_t* ids, const Tag& tag) const {
  const Tag& t = tags_[b];
  return keys_[b] == key && t.parent == tag.parent && t.parent_generation == tag.parent_generation &&
         t.image[0] == tag.image[0] && t.image[1] == tag.image[1] &&
         std::memcmp(ids_ + (static_cast<int64_t>(b) << shift_), ids, sizeof(int32_t) << shift_) == 0;
}

int32_t KvPool::FindLocked(uint64_t key, const int32_t* ids, const Tag& tag) const {
  for (uint32_t i = static_cast<uint32_t>(key) & table_mask_;; i = (i + 1) & table_mask_) {
    const int32_t b = table_[i];
    if (b < 0) return -1;
    if (Same(b, key, ids, tag)) return b;
  }
}

void KvPool::Publish(int32_t b, const int32_t* ids, const Tag& tag) {
  std::lock_guard<std::mutex> lock(mu_);
  if (published_[b]) return;
  const uint64_t key = Key(ids, tag);
  if (FindLocked(key, ids, tag) >= 0) return;  // an equal block is findable
  std::memcpy(ids_ + (static_cast<int64_t>(b) << shift_), ids, sizeof(int32_t) << shift_);
  tags_[b] = tag;
  keys_[b] = key;
  uint32_t i = static_cast<uint32_t>(key) & table_mask_;
  while (table_[i] >= 0) i = (i + 1) & table_mask_;  // at most capacity of 2x slots are used
  table_[i] = b;
  published_[b] = 1;
}

int32_t KvPool::Find(const int32_t* ids, const Tag& tag) {
  std::lock_guard<std::mutex> lock(mu_);
  const int32_t b = FindLocked(Key(ids, tag), ids, tag);
  if (b < 0) return -1;
  if (refs_[b]++ == 0) --free_count_;  // its ring entry is skipped when reached
  return b;
}

int32_t KvPool::FindPrefix(const int32_t* ids, int64_t n, int64_t first_image, const Tag& tag, int64_t* common) {
  std::lock_guard<std::mutex> lock(mu_);
  int32_t best = -1;
  int64_t best_len = 0;
  for (int32_t b = 0; b < capacity_; ++b) {  // a scan: cheap beside the prefill it saves
    const Tag& t = tags_[b];
    if (!published_[b] || t.parent != tag.parent || t.parent_generation != tag.parent_generation) continue;
    const int32_t* own = ids_ + (static_cast<int64_t>(b) << shift_);
    int64_t len = 0;
    while (len < n && own[len] == ids[len]) ++len;
    if (len > first_image && (t.image[0] != tag.image[0] || t.image[1] != tag.image[1])) len = first_image;
    if (len > best_len) best = b, best_len = len;
  }
  if (best >= 0 && refs_[best]++ == 0) --free_count_;
  *common = best_len;
  return best;
}

int32_t KvPool::Trim() {
  std::lock_guard<std::mutex> lock(mu_);
  int32_t trimmed = 0;
  for (int32_t b = 0; b < capacity_;) {
    if (refs_[b] != 0) {
      ++b;
      continue;
    }
    int32_t e = b;
    for (; e < capacity_ && refs_[e] == 0; ++e) {
      Unpublish(e);
      ++generation_[e];
    }
    store_.DiscardRows(static_cast<int64_t>(b) << shift_, static_cast<int64_t>(e - b) << shift_);
    trimmed += e - b;
    b = e;
  }
  return trimmed;
}

void KvPool::Forget(int32_t b) {
  std::lock_guard<std::mutex> lock(mu_);
  Unpublish(b);
  ++generation_[b];
}

// Removes `b` from the table (linear probing: the entries after it that would no
// longer be reached move back).
void KvPool::Unpublish(int32_t b) {
  if (!published_[b]) return;
  published_[b] = 0;
  uint32_t i = static_cast<uint32_t>(keys_[b]) & table_mask_;
  while (table_[i] != b) i = (i + 1) & table_mask_;
  table_[i] = -1;
  for (uint32_t j = (i + 1) & table_mask_; table_[j] >= 0; j = (j + 1) & table_mask_) {
    const uint32_t home = static_cast<uint32_t>(keys_[table_[j]]) & table_mask_;
    // Entry j stays where it is if its home lies cyclically in (i, j].
    const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    table_[i] = table_[j];
    table_[j] = -1;
    i = j;
  }
}

}  // namespace kiln::rt
