#include "thread_pool.h"

#include <new>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kiln::rt {

ThreadPool* ThreadPool::Create(int num_threads, Allocator* allocator) {
  if (num_threads < 1) num_threads = 1;
  void* mem = allocator->Alloc(sizeof(ThreadPool), alignof(ThreadPool) < 16 ? 16 : alignof(ThreadPool));
  if (mem == nullptr) return nullptr;
  ThreadPool* pool = new (mem) ThreadPool();
  pool->num_threads_ = num_threads;
  pool->active_.store(num_threads);
  pool->allocator_ = allocator;
  int workers = num_threads - 1;
  if (workers > 0) {
    void* wmem = allocator->Alloc(sizeof(std::thread) * workers, 64);
    if (wmem == nullptr) {
      pool->~ThreadPool();
      allocator->Free(mem);
      return nullptr;
    }
    pool->workers_ = static_cast<std::thread*>(wmem);
    for (int i = 0; i < workers; ++i) {
      new (&pool->workers_[i]) std::thread(&ThreadPool::WorkerLoop, pool, i + 1);
      pool->num_workers_ = i + 1;
    }
  }
  return pool;
}

namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

// Spin iterations before a worker sleeps (roughly a millisecond).
constexpr int kSpinBeforeSleep = 1 << 15;

}  // namespace

void ThreadPool::Destroy(ThreadPool* pool) {
  if (pool == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(pool->mutex_);
    pool->stop_.store(true);
  }
  pool->wake_.notify_all();
  for (int i = 0; i < pool->num_workers_; ++i) {
    pool->workers_[i].join();
    pool->workers_[i].~thread();
  }
  Allocator* allocator = pool->allocator_;
  allocator->Free(pool->workers_);
  pool->~ThreadPool();
  allocator->Free(pool);
}

void ThreadPool::RunChunks(int thread) {
  for (;;) {
    int64_t begin = next_.fetch_add(chunk_, std::memory_order_relaxed);
    if (begin >= n_) break;
    int64_t end = begin + chunk_ < n_ ? begin + chunk_ : n_;
    fn_(ctx_, begin, end, thread);
  }
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    if (index >= active_.load(std::memory_order_acquire)) {
      // Not needed: sleep until active again (no loop runs while active_ changes, so
      // the generation to wait past is the one set then).
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_.load() || index < active_.load(); });
      if (stop_.load()) return;
      seen = active_generation_;
      continue;
    }
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && !stop_.load(std::memory_order_relaxed) &&
           index < active_.load(std::memory_order_relaxed)) {
      if (++spins < kSpinBeforeSleep) {
        CpuRelax();
        continue;
      }
      std::unique_lock<std::mutex> lock(mutex_);
      sleepers_.fetch_add(1);
      wake_.wait(lock, [&] { return stop_.load() || generation_.load() != seen || index >= active_.load(); });
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    // A loop started after active_ changed: workers past it are not counted in busy_.
    if (index >= active_.load(std::memory_order_acquire)) continue;
    if (generation_.load(std::memory_order_acquire) == seen) continue;
    seen = generation_.load(std::memory_order_acquire);
    RunChunks(index);
    busy_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::SetActiveThreads(int n) {
  n = n < 1 ? 1 : (n > num_threads_ ? num_threads_ : n);
  if (n == active_.load(std::memory_order_relaxed)) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    active_generation_ = generation_.load();
    active_.store(n, std::memory_order_release);
  }
  wake_.notify_all();
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain, RangeFn fn, void* ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  // A few chunks per thread balance uneven work without much overhead.
  const int active = active_.load(std::memory_order_relaxed);
  int64_t chunks = static_cast<int64_t>(active) * 4;
  // Whole multiples of the grain, so that ranges start on its boundaries.
  int64_t chunk = ((n + chunks - 1) / chunks + grain - 1) / grain * grain;
  if (active <= 1 || chunk >= n) {
    fn(ctx, 0, n, 0);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  n_ = n;
  chunk_ = chunk;
  next_.store(0, std::memory_order_relaxed);
  busy_.store(active - 1, std::memory_order_relaxed);
  {
    // Under the mutex, so that a worker about to sleep either sees the new
    // generation or is counted in sleepers_ before it is read below.
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (sleepers_.load() > 0) wake_.notify_all();
  RunChunks(0);
  while (busy_.load(std::memory_order_acquire) != 0) CpuRelax();
}

}  // namespace kiln::rt
