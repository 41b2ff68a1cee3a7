#include "core/watchdog.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/mpi_check.hpp"
#include "core/phase.hpp"

namespace zero {

namespace {

constexpr int kTagBeat = 1;   // neighbour to neighbour: a heartbeat or a goodbye
constexpr int kTagFault = 2;  // the rank that noticed, to every other rank
constexpr size_t kHostChars = 64;
constexpr size_t kPhaseChars = 64;

enum class Kind : int32_t { beat = 1, goodbye = 2, fault = 3 };

// One message, sent as bytes (every rank runs the same binary, so the layout agrees).
struct Message {
  Kind kind = Kind::beat;
  int32_t sender = -1;
  int64_t step = -1;            // the sender's phase::step()
  char phase[kPhaseChars] = {};  // the sender's phase::name()
  // kind == fault: who was lost, how long it had been silent, and its last heartbeat's phase.
  int32_t lost = -1;
  double silent_s = 0;
  int64_t lost_step = -1;
  char lost_phase[kPhaseChars] = {};
};

double now_s() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

void copy_text(char (&to)[kPhaseChars], const char* from) {
  std::snprintf(to, sizeof to, "%s", from ? from : "");
}

std::string where(int64_t step, const char* phase) {
  if (step < 0) return phase;
  return "step " + std::to_string(step) + ", " + phase;
}

// Ends the job from the watchdog thread. MPI_Abort asks the launcher to end every rank; if the
// launcher cannot be reached (its host is the one cut off), MPI_Abort may never return to the
// system, so a timer ends this process regardless.
[[noreturn]] void end_job(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::thread([exit_code] {
    std::this_thread::sleep_for(std::chrono::seconds(10));
    std::_Exit(exit_code);
  }).detach();
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

}  // namespace

Watchdog::Watchdog(World& world, const WatchdogOptions& options) : world_(world), options_(options) {
  ZERO_REQUIRE(options.timeout_s >= 0 && std::isfinite(options.timeout_s),
               "watchdog timeout must be a finite number of seconds >= 0");
  interval_s_ = options.interval_s > 0 ? options.interval_s : std::min(1.0, options.timeout_s / 10);
  if (world.size() < 2 || options.timeout_s == 0 || world.thread_level() < MPI_THREAD_MULTIPLE) return;
  ZERO_REQUIRE(interval_s_ * 3 <= options.timeout_s,
               "watchdog: the heartbeat interval must leave at least 3 beats per timeout");

  ZERO_CHECK_MPI(MPI_Comm_dup(world.comm(), &comm_));
  ZERO_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  std::vector<char> mine(kHostChars, 0), all(kHostChars * static_cast<size_t>(world.size()), 0);
  std::snprintf(mine.data(), kHostChars, "%s", world.hostname().c_str());
  ZERO_CHECK_MPI(MPI_Allgather(mine.data(), kHostChars, MPI_CHAR, all.data(), kHostChars, MPI_CHAR, comm_));
  for (int r = 0; r < world.size(); ++r) hosts_.emplace_back(all.data() + kHostChars * static_cast<size_t>(r));
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  thread_.join();
  MPI_Comm_free(&comm_);
}

void Watchdog::run() {
  // A heartbeat that waits for a CPU behind busy-polling ranks looks like silence: ask for a
  // higher priority (allowed with CAP_SYS_NICE, e.g. as root; harmless otherwise: the thread
  // sleeps almost all the time).
  setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), -10);
  const int me = world_.rank(), n = world_.size();
  std::vector<int> peers = {(me + n - 1) % n};
  if ((me + 1) % n != peers[0]) peers.push_back((me + 1) % n);
  const size_t np = peers.size();

  struct Peer {
    int rank = -1;
    double last_heard = 0;
    bool gone = false;  // said goodbye: its silence is expected
    Message in, out, last;
    MPI_Request recv = MPI_REQUEST_NULL, send = MPI_REQUEST_NULL;
  };
  std::vector<Peer> p(np);
  const double start = now_s();
  for (size_t i = 0; i < np; ++i) {
    p[i].rank = peers[i];
    p[i].last_heard = start;
    copy_text(p[i].last.phase, "start-up (no heartbeat received yet)");
    MPI_Irecv(&p[i].in, sizeof(Message), MPI_BYTE, p[i].rank, kTagBeat, comm_, &p[i].recv);
  }
  Message notice;
  MPI_Request notice_req = MPI_REQUEST_NULL;
  MPI_Irecv(&notice, sizeof(Message), MPI_BYTE, MPI_ANY_SOURCE, kTagFault, comm_, &notice_req);

  auto fill = [&](Message& m, Kind kind) {
    m.kind = kind;
    m.sender = me;
    m.step = phase::step();
    copy_text(m.phase, phase::name());
  };
  auto beat = [&](Kind kind) {
    for (Peer& q : p) {
      int done = 1;
      if (q.send != MPI_REQUEST_NULL) MPI_Test(&q.send, &done, MPI_STATUS_IGNORE);
      if (!done) continue;  // the last one has not left yet: do not pile up
      fill(q.out, kind);
      MPI_Isend(&q.out, sizeof(Message), MPI_BYTE, q.rank, kTagBeat, comm_, &q.send);
    }
  };

  // A peer is lost: tell everyone else, report, end the job.
  auto declare_lost = [&](const Peer& q, double silent) {
    const Message& l = q.last;
    char text[1024];
    std::snprintf(text, sizeof text,
                  "watchdog: rank %d (host %s) has not answered for %.1f s (the limit is %.0f s); "
                  "its last heartbeat said it was in: %s. This rank (%d, host %s) was in: %s. "
                  "Ending the job.\nHINT: that rank is stopped, hung, or its host is down or cut "
                  "off from the network: check it (dmesg, the link); then restart with --resume "
                  "from the last complete checkpoint. If such pauses are expected, raise "
                  "zero_train.watchdog_timeout.",
                  q.rank, hosts_[static_cast<size_t>(q.rank)].c_str(), silent, options_.timeout_s,
                  where(l.step, l.phase).c_str(), me, hosts_[static_cast<size_t>(me)].c_str(),
                  where(phase::step(), phase::name()).c_str());
    log::error(text);
    Message m;
    fill(m, Kind::fault);
    m.lost = q.rank;
    m.silent_s = silent;
    m.lost_step = l.step;
    copy_text(m.lost_phase, l.phase);
    std::vector<MPI_Request> sent;
    for (int r = 0; r < n; ++r) {
      if (r == me || r == q.rank) continue;
      sent.emplace_back();
      MPI_Isend(&m, sizeof(Message), MPI_BYTE, r, kTagFault, comm_, &sent.back());
    }
    // Give the notices a moment to leave (ranks that are reachable get them at once).
    const double until = now_s() + std::min(2.0, options_.timeout_s / 4);
    int all = 0;
    while (!all && now_s() < until) {
      MPI_Testall(static_cast<int>(sent.size()), sent.data(), &all, MPI_STATUSES_IGNORE);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    end_job(options_.exit_code);
  };

  const auto tick = std::chrono::duration<double>(std::min(0.25, interval_s_ / 4));
  double next_beat = start;
  double loop_prev = start;
  while (!stop_.load(std::memory_order_relaxed)) {
    const double t = now_s();
    // Time this thread itself did not run (this process stopped, or starved of CPU by a loaded
    // node) is not the peers' silence: we could not have heard them. Their clocks move by it.
    const double stalled = t - loop_prev - 2 * tick.count();
    if (stalled > 0)
      for (Peer& q : p) q.last_heard += stalled;
    loop_prev = t;
    if (t >= next_beat) {
      beat(Kind::beat);
      next_beat = t + interval_s_;
    }
    for (Peer& q : p) {
      int got = 0;
      MPI_Test(&q.recv, &got, MPI_STATUS_IGNORE);
      while (got) {
        q.last_heard = now_s();
        q.last = q.in;
        if (q.in.kind == Kind::goodbye) q.gone = true;
        MPI_Irecv(&q.in, sizeof(Message), MPI_BYTE, q.rank, kTagBeat, comm_, &q.recv);
        MPI_Test(&q.recv, &got, MPI_STATUS_IGNORE);
      }
    }
    int noticed = 0;
    MPI_Test(&notice_req, &noticed, MPI_STATUS_IGNORE);
    if (noticed) {
      char text[768];
      std::snprintf(text, sizeof text,
                    "watchdog: rank %d reports that rank %d (host %s) stopped answering %.1f s ago "
                    "(it was in: %s); this rank was in: %s. Ending the job.",
                    notice.sender, notice.lost, hosts_[static_cast<size_t>(notice.lost)].c_str(),
                    notice.silent_s, where(notice.lost_step, notice.lost_phase).c_str(),
                    where(phase::step(), phase::name()).c_str());
      log::error(text);
      end_job(options_.exit_code);
    }
    const double t2 = now_s();
    for (const Peer& q : p)
      if (!q.gone && t2 - q.last_heard > options_.timeout_s) declare_lost(q, t2 - q.last_heard);
    std::this_thread::sleep_for(tick);
  }

  // Leaving: say goodbye (after the last heartbeat has left, so that it is not skipped), wait a
  // little for it to leave, drop the pending receives. A neighbour that is gone cannot hold us.
  const double until = now_s() + 1.0;
  for (Peer& q : p) {
    int done = 0;
    while (q.send != MPI_REQUEST_NULL && !done && now_s() < until) {
      MPI_Test(&q.send, &done, MPI_STATUS_IGNORE);
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  beat(Kind::goodbye);
  for (Peer& q : p) {
    int done = 0;
    while (q.send != MPI_REQUEST_NULL && !done && now_s() < until) {
      MPI_Test(&q.send, &done, MPI_STATUS_IGNORE);
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!done && q.send != MPI_REQUEST_NULL) MPI_Request_free(&q.send);
  }
  for (Peer& q : p) {
    MPI_Cancel(&q.recv);
    MPI_Wait(&q.recv, MPI_STATUS_IGNORE);
  }
  MPI_Cancel(&notice_req);
  MPI_Wait(&notice_req, MPI_STATUS_IGNORE);
}

}  // namespace zero
