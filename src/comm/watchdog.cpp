#include "src/comm/watchdog.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "src/comm/mpirun_guard.hpp"

namespace shardlab {
namespace {

// One rank's published progress. Lock-free atomics on a shared mapping: readers in other
// processes see each field whole.
struct Record {
  std::atomic<uint64_t> entered;      // number of the last collective this rank entered
  std::atomic<uint64_t> waiting;      // the collective it is blocked on, 0 when not blocked
  std::atomic<int64_t> wait_since_ns; // when it started waiting (steady clock of this node)
  std::atomic<int64_t> entered_ns;    // when it entered the last collective
  std::atomic<int64_t> beat_ns;       // the watchdog thread's last heartbeat: stale = frozen process
  char what[160];                     // that collective, described
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string record_path(const std::string& dir, int rank) { return fmt::format("{}/rank_{:05d}", dir, rank); }

Record* map_record(const std::string& path, bool create) {
  int fd = ::open(path.c_str(), create ? O_RDWR | O_CREAT | O_TRUNC : O_RDONLY, 0600);
  if (fd < 0) return nullptr;
  struct stat st {};
  // A reader must not map a record its writer has not sized yet: touching it would raise SIGBUS.
  bool sized = create ? ::ftruncate(fd, sizeof(Record)) == 0 : ::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(sizeof(Record));
  if (!sized) {
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, sizeof(Record), create ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<Record*>(p);
}

class State {
 public:
  State(std::string dir, int rank, int world, double timeout_s, std::vector<std::string> hosts, double save_timeout_s)
      : job_dir_(std::move(dir)), rank_(rank), world_(world), timeout_ns_(static_cast<int64_t>(timeout_s * 1e9)),
        save_timeout_ns_(static_cast<int64_t>(save_timeout_s * 1e9)), hosts_(std::move(hosts)) {
    if (static_cast<int>(hosts_.size()) != world_) hosts_.assign(static_cast<size_t>(world_), "");
    // A folder per host inside the job's: where the job directory is shared between hosts
    // ($SHARDLAB_WATCHDOG_DIR on a network file system), another host's records, which say nothing
    // about reaching that host (its link down, its ranks alive), stay unread, and its report
    // marker cannot silence this host's report.
    const std::string& host = hosts_[static_cast<size_t>(rank_)];
    dir_ = host.empty() || host.find('/') != std::string::npos ? job_dir_ : job_dir_ + "/host-" + host;
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    mine_ = map_record(record_path(dir_, rank_), true);
    if (!mine_) {
      std::fprintf(stderr, "shardlab [rank %d]: --collective-timeout: cannot publish progress under %s: %s\n", rank_,
                   dir_.c_str(), std::strerror(errno));
      return;
    }
    mine_->beat_ns.store(now_ns());
    thread_ = std::thread([this] { watch(); });
  }
  ~State() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (mine_) ::munmap(mine_, sizeof(Record));
    ::unlink(record_path(dir_, rank_).c_str());
    // The job is done: the node's lowest rank removes the directory (the others' mappings outlive it).
    if (std::find(hosts_.begin(), hosts_.end(), hosts_[static_cast<size_t>(rank_)]) - hosts_.begin() == rank_)
      remove_dirs();
  }
  // This host's folder, then the job's where no other host's is left in it.
  void remove_dirs() const {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    if (dir_ == job_dir_) return;
    std::filesystem::remove(job_dir_ + "/owner", ec);
    std::filesystem::remove(job_dir_, ec);  // fails, leaving it, while another host's folder is in it
  }
  bool ok() const { return mine_ != nullptr; }

  uint64_t enter(const std::string& what) {
    uint64_t seq = ++seq_;
    std::snprintf(mine_->what, sizeof(mine_->what), "%s", what.c_str());
    mine_->entered_ns.store(now_ns());
    mine_->entered.store(seq);
    return seq;
  }
  void begin_wait(uint64_t seq) {
    mine_->wait_since_ns.store(now_ns());
    mine_->waiting.store(seq);
  }
  void end_wait() { mine_->waiting.store(0); }
  void in_save(bool on) { saving_ += on ? 1 : -1; }

 private:
  // The time waited is counted in the ticks this thread actually ran, each at most two periods:
  // a job suspended as a whole (SIGSTOP of every rank, a scheduler's suspend, a paused VM) does not
  // time out when it resumes. A wait inside a checkpoint save counts against the save limit.
  void watch() {
    uint64_t tracked = 0;
    int64_t counted = 0, last = now_ns();
    while (!stop_) {
      mine_->beat_ns.store(now_ns());
      std::this_thread::sleep_for(std::chrono::milliseconds(kBeatMs));
      const int64_t t = now_ns(), gap = std::min<int64_t>(t - last, 2 * kBeatNs);
      last = t;
      const uint64_t k = mine_->waiting.load();
      const bool saving = saving_.load() > 0;
      const int64_t limit = saving ? save_timeout_ns_ : timeout_ns_;
      if (k == 0 || limit <= 0) {
        tracked = 0;
        continue;
      }
      if (k != tracked) {
        tracked = k;
        counted = std::min<int64_t>(t - mine_->wait_since_ns.load(), gap);
        continue;
      }
      counted += gap;
      if (counted >= limit) diagnose(k, limit, saving ? "--save-timeout, inside a checkpoint save" : "--collective-timeout");
    }
  }

  static constexpr int kBeatMs = 100;
  static constexpr int64_t kBeatNs = kBeatMs * 1'000'000ll;
  static constexpr int64_t kFrozenNs = 20 * kBeatMs * 1'000'000ll;  // 2 s without a heartbeat

  std::string describe_last(const Record& r, int64_t t) const {
    uint64_t e = r.entered.load();
    if (e == 0) return "no collective yet";
    return fmt::format("#{} {}, entered {:.1f} s ago", e, std::string(r.what, strnlen(r.what, sizeof(r.what))),
                       (t - r.entered_ns.load()) / 1e9);
  }

  // Someone already reported (or the job directory is gone): end quietly.
  bool already_reported() const { return ::access((dir_ + "/reported").c_str(), F_OK) == 0 || ::access(dir_.c_str(), F_OK) != 0; }

  // This rank has waited on collective #k past the timeout: name who is frozen or never arrived,
  // and end the process. One rank reports: the first to create dir/reported. Returns (and the
  // run goes on) only when the collective completed meanwhile.
  void diagnose(uint64_t k, int64_t limit_ns, const char* limit_name) {
    const int64_t t = now_ns();
    std::vector<std::string> frozen, behind;
    std::vector<int> unseen;  // ranks with no record here: on other hosts, or gone
    bool lower_waiting = false;
    for (int r = 0; r < world_ && !already_reported(); ++r) {
      if (r == rank_) continue;
      Record* other = map_record(record_path(dir_, r), false);
      if (!other) {
        unseen.push_back(r);
        continue;
      }
      if (t - other->beat_ns.load() > kFrozenNs)
        frozen.push_back(fmt::format("rank {} shows no sign of life for {:.1f} s (stopped or frozen; its last: {})", r,
                                     (t - other->beat_ns.load()) / 1e9, describe_last(*other, t)));
      else if (other->entered.load() < k)
        behind.push_back(fmt::format("rank {} never reached it (its last: {})", r, describe_last(*other, t)));
      else if (r < rank_ && other->waiting.load() == k)
        lower_waiting = true;  // a lower rank waits on the same collective and reports
      ::munmap(other, sizeof(Record));
    }
    if (lower_waiting) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (mine_->waiting.load() != k) return;  // it completed after all
    int fd = already_reported() ? -1 : ::open((dir_ + "/reported").c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
    if (fd < 0) end_process();  // another rank reports
    ::close(fd);
    std::string who;
    append_unseen(unseen, behind);
    for (const auto* list : {&frozen, &behind})
      for (const std::string& m : *list) who += (who.empty() ? "" : "; ") + m;
    if (who.empty()) who = "every rank entered it and is alive: the transport did not complete it";
    std::fprintf(stderr,
                 "shardlab [rank %d/%d]: collective #%llu (%s) did not complete within %.0f s "
                 "(%s): %s. Ending the job.\n",
                 rank_, world_, static_cast<unsigned long long>(k),
                 std::string(mine_->what, strnlen(mine_->what, sizeof(mine_->what))).c_str(), limit_ns / 1e9,
                 limit_name, who.c_str());
    std::fflush(stderr);
    remove_dirs();  // the job ends here: nothing of it stays behind
    guard_stuck_mpirun(fmt::format("shardlab [rank {}/{}]", rank_, world_));  // a plain mpirun stuck on a host
    end_process();
  }

  // Ranks without a record here, host by host: a host none of whose ranks can be seen from this
  // one is named with its ranks (its link down, its ranks stopped or gone: from here one cannot
  // tell which).
  void append_unseen(const std::vector<int>& unseen, std::vector<std::string>& out) const {
    const std::string& here = hosts_[static_cast<size_t>(rank_)];
    std::vector<std::string> hosts;
    for (int r : unseen)
      if (std::find(hosts.begin(), hosts.end(), hosts_[static_cast<size_t>(r)]) == hosts.end())
        hosts.push_back(hosts_[static_cast<size_t>(r)]);
    for (const std::string& h : hosts) {
      std::vector<int> ranks;
      for (int r : unseen)
        if (hosts_[static_cast<size_t>(r)] == h) ranks.push_back(r);
      if (h.empty() || h == here) {
        for (int r : ranks) out.push_back(fmt::format("rank {} (no progress record here: gone)", r));
        continue;
      }
      out.push_back(fmt::format("host {} (rank{} {}): no progress record visible from {} (that host unreachable, "
                                "or its ranks stopped or gone)", h, ranks.size() > 1 ? "s" : "",
                                fmt::join(ranks, ", "), here));
    }
  }

  [[noreturn]] static void end_process() {
    tell_launcher(kExitTimeout);
    std::_Exit(kExitTimeout);
  }

  std::string job_dir_, dir_;  // the job's directory; this host's folder in it
  int rank_, world_;
  int64_t timeout_ns_, save_timeout_ns_;
  std::vector<std::string> hosts_;  // of every rank ("" where unknown)
  Record* mine_ = nullptr;
  uint64_t seq_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> saving_{0};  // nesting depth of WatchdogInSave
  std::thread thread_;
};

State* g_state = nullptr;

}  // namespace

void Watchdog::start(const std::string& dir, int rank, int world, double timeout_s, std::vector<std::string> hosts,
                     double save_timeout_s) {
  if (timeout_s <= 0 || g_state) return;
  g_state = new State(dir, rank, world, timeout_s, std::move(hosts), save_timeout_s);
  if (!g_state->ok()) stop();
}

void Watchdog::stop() {
  delete g_state;
  g_state = nullptr;
}

bool Watchdog::active() { return g_state != nullptr; }
uint64_t Watchdog::enter(const std::string& what) { return g_state ? g_state->enter(what) : 0; }
void Watchdog::begin_wait(uint64_t seq) {
  if (g_state) g_state->begin_wait(seq);
}
void Watchdog::end_wait() {
  if (g_state) g_state->end_wait();
}
void Watchdog::in_save(bool on) {
  if (g_state) g_state->in_save(on);
}

}  // namespace shardlab
