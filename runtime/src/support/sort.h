// One sort for the runtime's cold paths (loading a tokenizer or a code segment,
// compiling a regex, choosing an image's tokens): a heap sort out of line, once for
// every element type, in the place of std::sort's per-type instantiations (about 3.5 KB
// of an arm64 build at -Oz). Not stable: comparators that must order ties break them.
#ifndef KILN_RUNTIME_SUPPORT_SORT_H_
#define KILN_RUNTIME_SUPPORT_SORT_H_

#include <cstddef>
#include <type_traits>

namespace kiln::rt {

using SortLess = bool (*)(const void* a, const void* b, const void* context);

// Sorts `count` elements of `size` bytes from `base` into the order `less` defines.
void HeapSortBytes(void* base, size_t count, size_t size, SortLess less, const void* context);

// Sorts [first, last) by less(const T&, const T&) (elements move as bytes).
template <class T, class Less>
void Sort(T* first, T* last, const Less& less) {
  static_assert(std::is_trivially_copyable<T>::value, "Sort moves its elements as bytes");
  HeapSortBytes(
      first, static_cast<size_t>(last - first), sizeof(T),
      [](const void* a, const void* b, const void* context) {
        return (*static_cast<const Less*>(context))(*static_cast<const T*>(a), *static_cast<const T*>(b));
      },
      &less);
}

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_SUPPORT_SORT_H_
