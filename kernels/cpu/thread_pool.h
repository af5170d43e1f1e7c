// A tiny fork-join pool for the CPU kernels: one job at a time, indices handed
// out dynamically so uneven items balance. Spawning threads per call would cost
// more than a 1K-token decode step, hence a persistent pool.
#pragma once

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace polykv::kernels::cpu {

class ThreadPool {
 public:
  // Starts `num_workers` threads (the caller of ParallelFor is one more).
  explicit ThreadPool(int num_workers);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // The process-wide pool: hardware_concurrency() - 1 workers, created on
  // first use and never destroyed (kernels may run during static teardown).
  static ThreadPool& Shared();

  int max_threads() const { return int(workers_.size()) + 1; }

  // Runs fn(i) for every i in [0, n) on at most `max_threads` threads
  // (0 = all), the caller included, and returns when all are done.
  // Thread-safe: when another job is running (or when called from inside fn),
  // the call runs serially on the calling thread instead of waiting.
  void ParallelFor(int n, int max_threads, const std::function<void(int)>& fn);

 private:
  void WorkerLoop(int index);
  void RunItems();

  // Constant after construction.
  std::vector<std::thread> workers_;

  absl::Mutex run_mu_;  // held by the caller for the whole of one job

  absl::Mutex mu_;
  absl::CondVar wake_;
  absl::CondVar done_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int job_workers_ ABSL_GUARDED_BY(mu_) = 0;  // workers [0, job_workers_) join the job
  int active_ ABSL_GUARDED_BY(mu_) = 0;       // joined workers not yet finished
  // The job; written under mu_ before generation_ is bumped, read by joined
  // workers after they observe the new generation (mu_ orders the accesses).
  const std::function<void(int)>* job_fn_ = nullptr;
  int job_n_ = 0;
  // Next index to hand out; atomic because joined threads claim concurrently.
  std::atomic<int> next_{0};
};

}  // namespace polykv::kernels::cpu
