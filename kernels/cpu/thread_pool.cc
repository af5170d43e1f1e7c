#include "kernels/cpu/thread_pool.h"

#include <algorithm>

namespace polykv::kernels::cpu {

ThreadPool::ThreadPool(int num_workers) {
  for (int i = 0; i < num_workers; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    wake_.SignalAll();
  }
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::Shared() {
  static ThreadPool* pool =
      new ThreadPool(std::max(0, int(std::thread::hardware_concurrency()) - 1));
  return *pool;
}

void ThreadPool::RunItems() {
  for (;;) {
    const int i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= job_n_) return;
    (*job_fn_)(i);
  }
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && generation_ == seen) wake_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
      if (index >= job_workers_) continue;
    }
    RunItems();
    absl::MutexLock lock(&mu_);
    if (--active_ == 0) done_.SignalAll();
  }
}

void ThreadPool::ParallelFor(int n, int max_threads, const std::function<void(int)>& fn) {
  if (n <= 0) return;
  int threads = max_threads <= 0 ? this->max_threads() : std::min(max_threads, this->max_threads());
  threads = std::min(threads, n);
  if (threads <= 1 || !run_mu_.TryLock()) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    job_fn_ = &fn;
    job_n_ = n;
    next_.store(0, std::memory_order_relaxed);
    job_workers_ = threads - 1;
    active_ = threads - 1;
    ++generation_;
    wake_.SignalAll();
  }
  RunItems();
  {
    absl::MutexLock lock(&mu_);
    while (active_ > 0) done_.Wait(&mu_);
  }
  run_mu_.Unlock();
}

}  // namespace polykv::kernels::cpu
