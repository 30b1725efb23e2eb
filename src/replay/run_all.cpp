// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// run_all: many (trace, policy) replays on a small pool of threads.
//
// Every job writes only its own row, chosen before the threads start, so the rows come out in
// the same order however the jobs are scheduled: by trace, the recorded row first, then the
// policies as given. Each trace is compiled once, before the threads start, and its plan is
// shared read-only by all of its jobs. The calling thread only waits and reports progress, so
// the progress callback is never called concurrently and always from the caller's thread.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "replay/engine_detail.hpp"

namespace cistern::replay {
namespace {

/// One row to compute.
struct Job {
  std::size_t trace = 0;
  const Policy* policy = nullptr;  ///< nullptr: the recorded row
  std::size_t row = 0;
};

/// What the workers share.
struct Shared {
  Shared(const std::vector<const trace::Trace*>& traces_, const std::vector<detail::Plan>& plans_,
         const Options& options_, bool with_min_capacity_, const std::vector<Job>& jobs_,
         std::vector<Result>& rows_)
      : traces(traces_),
        plans(plans_),
        options(options_),
        with_min_capacity(with_min_capacity_),
        jobs(jobs_),
        rows(rows_) {}

  const std::vector<const trace::Trace*>& traces;
  const std::vector<detail::Plan>& plans;
  const Options& options;
  bool with_min_capacity;
  const std::vector<Job>& jobs;
  std::vector<Result>& rows;
  std::atomic<std::size_t> next{0};
  std::mutex mutex;
  std::condition_variable progressed;
  std::size_t done = 0;  // guarded by mutex
};

void add_min_capacity(Result& r, const trace::Trace& trace, const detail::Plan& plan,
                      const Policy& policy, const Options& options) {
  if (!r.error.empty()) return;
  try {
    const CapacitySearch search = detail::search_plan(trace, plan, policy, options);
    r.min_capacity = search.capacity;
    if (!search.note.empty()) r.note += (r.note.empty() ? "" : "; ") + search.note;
    Options at_limit = options;
    at_limit.capacity = search.capacity;
    at_limit.timeline_points = 0;
    at_limit.segment_map_at_peak = false;
    const Result m = detail::run_plan(trace, plan, policy, at_limit);
    r.at_min_capacity =
        AtCapacity{m.device_allocs,  m.device_frees, m.device_maps,          m.device_unmaps,
                   m.handle_creates, m.syncs,        m.device_ms.value_or(0)};
  } catch (const std::exception& e) {
    r.error = std::string("min_capacity: ") + e.what();
  }
}

Result run_job(const Job& job, Shared& s) {
  const trace::Trace& trace = *s.traces[job.trace];
  const detail::Plan& plan = s.plans[job.trace];
  if (job.policy == nullptr) return *detail::recorded_plan(trace, plan, s.options);
  Result r = detail::run_plan(trace, plan, *job.policy, s.options);
  if (s.with_min_capacity) add_min_capacity(r, trace, plan, *job.policy, s.options);
  return r;
}

void work(Shared& s) {
  for (std::size_t i = s.next++; i < s.jobs.size(); i = s.next++) {
    Result r;
    try {
      r = run_job(s.jobs[i], s);
    } catch (const std::exception& e) {
      r.trace = s.traces[s.jobs[i].trace]->source;
      r.policy = s.jobs[i].policy != nullptr ? s.jobs[i].policy->label : "recorded";
      r.error = e.what();
    }
    s.rows[s.jobs[i].row] = std::move(r);
    std::lock_guard<std::mutex> lock(s.mutex);
    ++s.done;
    s.progressed.notify_one();
  }
}

std::vector<Job> make_jobs(const std::vector<const trace::Trace*>& traces,
                           const std::vector<Policy>& policies) {
  std::vector<Job> jobs;
  for (std::size_t t = 0; t < traces.size(); ++t) {
    if (traces[t]->recorded.peak_reserved.has_value()) jobs.push_back({t, nullptr, jobs.size()});
    for (const Policy& p : policies) jobs.push_back({t, &p, jobs.size()});
  }
  return jobs;
}

unsigned thread_count(unsigned asked, std::size_t jobs) {
  unsigned threads = asked != 0 ? asked : std::max(1u, std::thread::hardware_concurrency());
  return static_cast<unsigned>(std::min<std::size_t>(threads, std::max<std::size_t>(jobs, 1)));
}

/// Calls `progress(done, total)` once per finished job, in order, from the calling thread.
void report_progress(Shared& s, const std::function<void(std::size_t, std::size_t)>& progress) {
  std::size_t reported = 0;
  while (reported < s.jobs.size()) {
    std::size_t done = 0;
    {
      std::unique_lock<std::mutex> lock(s.mutex);
      s.progressed.wait(lock, [&] { return s.done > reported; });
      done = s.done;
    }
    while (reported < done) {
      ++reported;
      if (progress) progress(reported, s.jobs.size());
    }
  }
}

}  // namespace

std::vector<Result> run_all(const std::vector<const trace::Trace*>& traces,
                            const std::vector<Policy>& policies, const Options& options,
                            bool with_min_capacity, unsigned threads,
                            const std::function<void(std::size_t, std::size_t)>& progress) {
  for (const Policy& p : policies) detail::require_start(p, options.start);  // before any work
  std::vector<detail::Plan> plans;
  plans.reserve(traces.size());
  for (const trace::Trace* t : traces) plans.push_back(detail::compile(*t));
  const std::vector<Job> jobs = make_jobs(traces, policies);
  std::vector<Result> rows(jobs.size());
  Shared shared(traces, plans, options, with_min_capacity, jobs, rows);
  std::vector<std::thread> pool;
  try {
    for (unsigned i = 0; i < thread_count(threads, jobs.size()); ++i) {
      pool.emplace_back(work, std::ref(shared));
    }
    report_progress(shared, progress);
  } catch (...) {
    // A thread that could not start, or a progress callback that threw: hand out no more jobs,
    // let the running ones finish, then pass the exception on.
    shared.next = jobs.size();
    for (std::thread& t : pool) t.join();
    throw;
  }
  for (std::thread& t : pool) t.join();
  return rows;
}

}  // namespace cistern::replay
