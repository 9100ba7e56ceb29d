// A fixed pool of worker threads for the kernels' parallel loops. The calling thread
// takes part, so a pool of N threads uses N - 1 workers.
//
// A decode step runs hundreds of short parallel loops back to back, so waking a
// sleeping thread per loop (a futex round trip, tens of microseconds on a VM) would
// cost more than the loops. Workers spin for a while after a loop before they sleep
// on the condition variable, and the caller spins for the loop's end.
#ifndef KILN_RUNTIME_SRC_THREAD_POOL_H_
#define KILN_RUNTIME_SRC_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "support/allocator.h"

namespace kiln::rt {

class ThreadPool {
 public:
  // fn(begin, end, thread_index) over a range split into chunks.
  using RangeFn = void (*)(void* ctx, int64_t begin, int64_t end, int thread);

  // Returns null when a thread cannot be created or memory is short.
  static ThreadPool* Create(int num_threads, Allocator* allocator);
  static void Destroy(ThreadPool* pool);

  int num_threads() const { return num_threads_; }
  // Threads the parallel loops use (1..num_threads): the others sleep until they are
  // needed again. Called between loops by the thread that runs them.
  void SetActiveThreads(int n);
  int active_threads() const { return active_.load(std::memory_order_relaxed); }

  // Runs fn over [0, n) in chunks of whole multiples of `grain` (the last one ends at
  // n), on every thread, and returns when all chunks are done. Not reentrant.
  void ParallelFor(int64_t n, int64_t grain, RangeFn fn, void* ctx);

  // The grain (a multiple of `grain`) with which ParallelFor gives each active thread
  // one range of [0, n): for work whose every call pays a set-up over the whole
  // problem (re-reading all rows, preparing every head), where the usual 4 chunks per
  // thread would pay it 4 times.
  int64_t RangePerThread(int64_t n, int64_t grain) const {
    const int64_t active = active_threads();
    return ((n + grain - 1) / grain + active - 1) / active * grain;
  }

  // Convenience for lambdas: pool->For(n, grain, [&](int64_t b, int64_t e, int t) {...}).
  template <typename F>
  void For(int64_t n, int64_t grain, F&& f) {
    ParallelFor(
        n, grain,
        [](void* ctx, int64_t b, int64_t e, int t) { (*static_cast<F*>(ctx))(b, e, t); },
        &f);
  }

 private:
  ThreadPool() = default;
  void WorkerLoop(int index);
  void RunChunks(int thread);

  int num_threads_ = 1;
  Allocator* allocator_ = nullptr;
  std::thread* workers_ = nullptr;
  int num_workers_ = 0;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> busy_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<int> active_{1};
  uint64_t active_generation_ = 0;  // the last loop's generation when active_ changed

  // The current job.
  RangeFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_SRC_THREAD_POOL_H_
