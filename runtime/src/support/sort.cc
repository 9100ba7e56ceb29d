#include "support/sort.h"

namespace kiln::rt {

void HeapSortBytes(void* base, size_t count, size_t size, SortLess less, const void* context) {
  unsigned char* a = static_cast<unsigned char*>(base);
  auto at = [&](size_t i) { return a + i * size; };
  auto swap = [&](size_t i, size_t j) {
    unsigned char* p = at(i);
    unsigned char* q = at(j);
    for (size_t k = 0; k < size; ++k) {
      const unsigned char t = p[k];
      p[k] = q[k];
      q[k] = t;
    }
  };
  // Moves element `root` down the max-heap [0, end).
  auto sift = [&](size_t root, size_t end) {
    for (;;) {
      size_t child = 2 * root + 1;
      if (child >= end) return;
      if (child + 1 < end && less(at(child), at(child + 1), context)) ++child;
      if (!less(at(root), at(child), context)) return;
      swap(root, child);
      root = child;
    }
  };
  if (count < 2) return;
  for (size_t i = count / 2; i-- > 0;) sift(i, count);
  for (size_t end = count - 1; end > 0; --end) {
    swap(0, end);
    sift(0, end);
  }
}

}  // namespace kiln::rt
