// dgmm._core: the Python package's binding of the C++ client (dgmm::Client,
// client/cpp). One implementation of the client policy (docs/protocol.md
// section 9): unary or stream, striping, retries and resume all come from
// dgmm::Client::Plan and its job runner; this file only moves arguments,
// buffers, results, errors and cancellation across the language boundary.
//
// - Buffers: A, d and the output are read and written in place through the
//   buffer protocol (PyObject_GetBuffer, any contiguous order); they are held
//   until the job's thread has finished with them.
// - Threads: Job.run() (the synchronous path) runs the job on the calling
//   thread without the GIL, as the C++ client would, so a call costs what a
//   C++ call costs. On the main thread, a SIGINT handler chained in front of
//   Python's for the length of the job cancels the job (from a watchdog
//   thread: a signal handler may not take locks), and the KeyboardInterrupt
//   is raised once the job has stopped: Ctrl-C ends a job within
//   milliseconds. Other signals are handled when the call returns. Job.start()
//   runs the job on a pool thread instead and calls add_done_callback's
//   callables when it ends (dgmm.aio).
// - Cancellation: a job's dgmm::CancelToken (its calls in flight and its
//   waits between attempts end at once); a region call's own context. The
//   server's pushback of a failed job is the core's (dgmm::RetryAfterMsOf),
//   for DgmmError.retry_after_ms. No gRPC interceptor: nothing here touches
//   the calls the core makes.
#include <Python.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <grpcpp/grpcpp.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "dgmm/client.h"
#include "dgmm/grpc_status.h"
#include "dgmm/regions.h"

namespace py = pybind11;

namespace dgmm_py {
namespace {

// The grpc-retry-pushback-ms value of a call's trailers, if it has one.
std::optional<int64_t> PushbackMs(
    const std::multimap<grpc::string_ref, grpc::string_ref>& trailers) {
  auto it = trailers.find("grpc-retry-pushback-ms");
  int64_t ms = 0;
  if (it == trailers.end() ||
      !absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &ms)) {
    return std::nullopt;
  }
  return ms;
}

// Cancels one job (its CancelToken) or one region call (its context).
class JobToken {
 public:
  // A call began; true if the job was cancelled already.
  bool Add(grpc::ClientContext* context) {
    std::lock_guard lock(mu_);
    live_.push_back(context);
    return cancelled_;
  }
  void Remove(grpc::ClientContext* context) {
    std::lock_guard lock(mu_);
    live_.erase(std::remove(live_.begin(), live_.end(), context), live_.end());
  }
  void Cancel() {
    {
      std::lock_guard lock(mu_);
      cancelled_ = true;
      for (grpc::ClientContext* c : live_) c->TryCancel();
    }
    cancel_.Cancel();
  }
  dgmm::CancelToken* cancel_token() { return &cancel_; }

 private:
  std::mutex mu_;
  bool cancelled_ = false;                  // guarded by mu_
  std::vector<grpc::ClientContext*> live_;  // guarded by mu_
  dgmm::CancelToken cancel_;
};

// A Py_buffer held for a job; released under the GIL.
class HeldBuffer {
 public:
  HeldBuffer(py::handle object, bool writable, const char* what) {
    int flags = PyBUF_ANY_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(object.ptr(), &view_, flags) != 0) {
      PyErr_Clear();
      throw py::value_error(std::string("dgmm: ") + what +
                            " must be a contiguous" + (writable ? ", writable" : "") +
                            " buffer");
    }
    held_ = true;
  }
  HeldBuffer(const HeldBuffer&) = delete;
  HeldBuffer& operator=(const HeldBuffer&) = delete;
  ~HeldBuffer() {
    if (held_) PyBuffer_Release(&view_);
  }
  void* data() const { return view_.buf; }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

int64_t ToMs(double seconds) { return static_cast<int64_t>(seconds * 1000.0 + 0.5); }

// A call's deadline from `timeout` (seconds, or None: none).
absl::Time DeadlineIn(const py::object& timeout) {
  return timeout.is_none() ? absl::InfiniteFuture()
                           : absl::Now() + absl::Milliseconds(ToMs(timeout.cast<double>()));
}

// The Python exception for a failed job or call: _core.Error(code, message,
// attempts, pushback_ms, stripes, mode).
PyObject* g_error_type = nullptr;

[[noreturn]] void Raise(const absl::Status& status, int attempts = 0,
                        std::optional<int64_t> pushback = std::nullopt, int stripes = 1,
                        const char* mode = nullptr) {
  py::tuple args = py::make_tuple(static_cast<int>(status.code()), std::string(status.message()),
                                  attempts, pushback ? py::cast(*pushback) : py::none(), stripes,
                                  mode ? py::cast(std::string(mode)) : py::none());
  PyErr_SetObject(g_error_type, args.ptr());
  throw py::error_already_set();
}

py::bytes Serialize(const google::protobuf::Message& message) {
  return py::bytes(message.SerializeAsString());
}

// Ctrl-C during a synchronous job on the main thread (see the top of the file).
namespace sigint {

std::mutex mu;
JobToken* job = nullptr;  // guarded by mu: the main thread's job
int pipe_fds[2] = {-1, -1};
struct sigaction python_handler;  // Python's, restored after each job

void Handler(int sig, siginfo_t* info, void* context) {
  // Python's handler first: it records the signal (PyErr_CheckSignals raises it).
  if (python_handler.sa_flags & SA_SIGINFO) {
    python_handler.sa_sigaction(sig, info, context);
  } else if (python_handler.sa_handler != SIG_DFL && python_handler.sa_handler != SIG_IGN) {
    python_handler.sa_handler(sig);
  }
  const int saved = errno;
  const char byte = 1;
  [[maybe_unused]] ssize_t n = write(pipe_fds[1], &byte, 1);
  errno = saved;
}

void Watchdog() {
  for (;;) {
    char byte;
    const ssize_t n = read(pipe_fds[0], &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    std::lock_guard lock(mu);
    if (job != nullptr) job->Cancel();
  }
}

// Installs the chained handler for `token`'s job when Python handles SIGINT
// with a function (its default); false when it does not (SIG_IGN, SIG_DFL).
bool Begin(JobToken* token) {
  static std::once_flag once;
  std::call_once(once, [] {
    if (pipe(pipe_fds) == 0) {
      fcntl(pipe_fds[1], F_SETFL, O_NONBLOCK);
      fcntl(pipe_fds[0], F_SETFD, FD_CLOEXEC);
      fcntl(pipe_fds[1], F_SETFD, FD_CLOEXEC);
      std::thread(Watchdog).detach();
    }
  });
  if (pipe_fds[0] < 0) return false;
  struct sigaction current;
  if (sigaction(SIGINT, nullptr, &current) != 0) return false;
  const bool is_function = (current.sa_flags & SA_SIGINFO) ||
                           (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN);
  if (!is_function) return false;
  {
    std::lock_guard lock(mu);
    job = token;
  }
  python_handler = current;
  struct sigaction ours = {};
  ours.sa_sigaction = Handler;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&ours.sa_mask);
  return sigaction(SIGINT, &ours, nullptr) == 0;
}

void End() {
  sigaction(SIGINT, &python_handler, nullptr);
  std::lock_guard lock(mu);
  job = nullptr;
}

unsigned long main_thread = 0;  // PyThread_get_thread_ident() of the main thread

}  // namespace sigint

// Threads that run jobs, kept between jobs: starting a thread for each job
// cost about a sixth of a 1x1 job's time. One thread per job in flight
// (never a queue of jobs behind another); a thread idle for a minute ends.
class WorkerPool {
 public:
  void Run(std::function<void()> task) {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(task));
    if (tasks_.size() > idle_) {
      std::thread([this] { Loop(); }).detach();
    } else {
      cv_.notify_one();
    }
  }

 private:
  void Loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      ++idle_;
      const bool got =
          cv_.wait_for(lock, std::chrono::seconds(60), [this] { return !tasks_.empty(); });
      --idle_;
      if (!got) return;
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      task = nullptr;
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  size_t idle_ = 0;                          // guarded by mu_
};

// Never destroyed: its detached threads may still wait on it at exit.
WorkerPool& Pool() {
  static WorkerPool* pool = new WorkerPool;
  return *pool;
}

// What a job's worker shares with its Job (and outlives it if need be).
struct JobState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;                        // guarded by mu
  absl::StatusOr<dgmm::JobResult> result;   // guarded by mu until done
  std::vector<py::object> done_callbacks;   // guarded by mu
};

// One job: its buffers, its worker, its outcome.
class Job {
 public:
  // `right`: SIDE_BOTH's right diagonal (None otherwise); diagonal_dtype:
  // the diagonals' DType (0: A's).
  Job(std::shared_ptr<dgmm::Client> client, py::object a, py::object d, py::object out,
      int64_t rows, int64_t cols, int dtype, bool col_major, int side, int backend, int mode,
      py::object progress, int diagonal_dtype, py::object right)
      : client_(std::move(client)),
        a_(a, false, "A"),
        d_(d, false, "the diagonal"),
        out_(out, true, "out"),
        progress_(std::move(progress)) {
    job_.matrix = {a_.data(), rows, cols, static_cast<dgmm::v1::DType>(dtype),
                   col_major ? dgmm::v1::LAYOUT_COL_MAJOR : dgmm::v1::LAYOUT_ROW_MAJOR};
    job_.diagonal = d_.data();
    job_.diagonal_bytes = d_.size();
    job_.diagonal_dtype = static_cast<dgmm::v1::DType>(diagonal_dtype);
    if (!right.is_none()) {
      right_ = std::make_unique<HeldBuffer>(right, false, "the right diagonal");
      job_.right_diagonal = right_->data();
      job_.right_diagonal_bytes = right_->size();
    }
    job_.side = static_cast<dgmm::v1::Side>(side);
    job_.backend = static_cast<dgmm::v1::Backend>(backend);
    if (mode == 0) forced_ = dgmm::TransferMode::kUnary;
    if (mode == 1) forced_ = dgmm::TransferMode::kStream;
    absl::StatusOr<dgmm::Client::JobPlan> plan = client_->Plan(job_, forced_);
    if (!plan.ok()) Raise(plan.status());
    plan_ = *plan;
    const int64_t lines = col_major ? cols : rows;
    total_lines_ = lines;
    line_bytes_ = static_cast<int64_t>(a_.size()) / std::max<int64_t>(lines, 1);
    token_ = std::make_unique<JobToken>();
  }

  // Runs the job on a pool thread (dgmm.aio); add_done_callback's callables
  // are called when it ends.
  void Start() {
    if (started_) throw py::value_error("dgmm: the job was started already");
    started_ = true;
    Pool().Run([this, state = state_] { Body(state); });
  }

  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // Cancels a job still running and waits for it: its buffers go with it.
  ~Job() {
    if (started_ && !Done()) {
      token_->Cancel();
      py::gil_scoped_release release;
      WaitDone();
    }
  }

  void Cancel() { token_->Cancel(); }
  // The W3C trace context of the job's calls (dgmm::Job's; "": a new one).
  void SetTrace(std::string traceparent, std::string tracestate) {
    job_.traceparent = std::move(traceparent);
    job_.tracestate = std::move(tracestate);
  }
  bool Done() {
    std::lock_guard lock(state_->mu);
    return state_->done;
  }
  // Waits up to `seconds` (forever when negative) without the GIL; true once done.
  bool Wait(double seconds) {
    if (!started_) throw py::value_error("dgmm: the job was not started");
    py::gil_scoped_release release;
    if (seconds < 0) {
      WaitDone();
      return true;
    }
    std::unique_lock lock(state_->mu);
    return state_->cv.wait_for(lock, std::chrono::duration<double>(seconds),
                               [this] { return state_->done; });
  }
  // `callback()` once the job is done (from the job's thread, or at once).
  void AddDoneCallback(py::object callback) {
    {
      std::lock_guard lock(state_->mu);
      if (!state_->done) {
        state_->done_callbacks.push_back(std::move(callback));
        return;
      }
    }
    callback();
  }
  // The synchronous call: runs the job on this thread, without the GIL. On
  // the main thread Ctrl-C cancels it and the KeyboardInterrupt is raised
  // once it has stopped (see the top of the file).
  py::object Run() {
    if (started_) throw py::value_error("dgmm: the job was started already");
    started_ = true;
    const bool main = PyThread_get_thread_ident() == sigint::main_thread;
    {
      py::gil_scoped_release release;
      const bool chained = main && sigint::Begin(token_.get());
      Body(state_);
      if (chained) sigint::End();
    }
    if (main && PyErr_CheckSignals() != 0) throw py::error_already_set();
    return Result();
  }
  // The outcome: (mode, stripes, attempts, resumed, received_bytes,
  // [part stats bytes], socket_reason, (setup, copy_in, job, copy_out),
  // process_memory, traceparent); raises _core.Error, or what `progress` raised.
  py::object Result() {
    Wait(-1);
    if (progress_error_.has_value()) {
      progress_error_->restore();
      progress_error_.reset();
      throw py::error_already_set();
    }
    const absl::StatusOr<dgmm::JobResult>& result = state_->result;  // done: no more writes
    if (!result.ok()) {
      Raise(result.status(), dgmm::AttemptsOf(result.status()), dgmm::RetryAfterMsOf(result.status()),
            plan_.stripes, dgmm::TransferModeName(plan_.mode));
    }
    py::list stats;
    for (const dgmm::v1::JobStats& s : result->part_stats) stats.append(Serialize(s));
    const dgmm::JobResult::SameHostPhases& p = result->same_host;
    return py::make_tuple(std::string(dgmm::TransferModeName(result->mode)), result->stripes,
                          result->attempts, result->resumed, result->received_bytes, stats,
                          result->socket_reason,
                          py::make_tuple(p.setup, p.copy_in, p.job, p.copy_out),
                          result->process_memory, result->traceparent);
  }

 private:
  void WaitDone() {
    std::unique_lock lock(state_->mu);
    state_->cv.wait(lock, [this] { return state_->done; });
  }

  // On a pool thread, or the caller's. `this` is used only until `done` is
  // set (the Job waits for that before it goes); `state` after.
  void Body(const std::shared_ptr<JobState>& state) {
    dgmm::ProgressCallback progress;
    if (!progress_.is_none()) {
      progress = [this](int64_t, int64_t received, int64_t) { Progress(received); };
    }
    absl::StatusOr<dgmm::JobResult> result;
    if (!forced_.has_value()) {
      result = client_->Multiply(job_, out_.data(), out_.size(), progress, token_->cancel_token());
    } else if (*forced_ == dgmm::TransferMode::kUnary) {
      result = client_->MultiplyUnary(job_, out_.data(), out_.size(), progress,
                                      token_->cancel_token());
    } else {
      result = client_->MultiplyStream(job_, out_.data(), out_.size(), progress,
                                       token_->cancel_token());
    }
    std::vector<py::object> callbacks;
    {
      std::lock_guard lock(state->mu);
      state->result = std::move(result);
      state->done = true;
      callbacks.swap(state->done_callbacks);
      state->cv.notify_all();
    }
    if (!callbacks.empty() && Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      for (py::object& cb : callbacks) {
        try {
          cb();
        } catch (py::error_already_set& e) {
          e.discard_as_unraisable("dgmm: a job's done callback");
        }
        cb = py::object();
      }
    }
  }

  void Progress(int64_t received_bytes) {
    const int64_t lines = line_bytes_ > 0 ? received_bytes / line_bytes_ : 0;
    if (lines <= reported_lines_) return;  // a job's progress calls never overlap
    reported_lines_ = lines;
    py::gil_scoped_acquire gil;
    if (progress_error_.has_value()) return;
    try {
      progress_(lines, total_lines_);
    } catch (py::error_already_set& e) {
      progress_error_.emplace(std::move(e));
      token_->Cancel();
    }
  }

  std::shared_ptr<dgmm::Client> client_;
  HeldBuffer a_, d_, out_;
  std::unique_ptr<HeldBuffer> right_;  // SIDE_BOTH's right diagonal
  py::object progress_;
  dgmm::Job job_;
  std::optional<dgmm::TransferMode> forced_;
  dgmm::Client::JobPlan plan_;
  int64_t total_lines_ = 0;
  int64_t line_bytes_ = 0;
  int64_t reported_lines_ = 0;  // a job's progress calls never overlap
  std::optional<py::error_already_set> progress_error_;
  std::unique_ptr<JobToken> token_;
  bool started_ = false;
  std::shared_ptr<JobState> state_ = std::make_shared<JobState>();
};

// One region RPC of the package (dgmm/regions.py and dgmm/arrays.py:
// MultiplyRegion, RegisterRegion, UnregisterRegion, GetRegionStatus) on a
// C++ client's channel: the serialized request in, the serialized response
// out, made on the calling thread without the GIL, with the client's region
// session in the metadata. cancel() (any thread) and, on the main thread,
// Ctrl-C cancel it, as for Job.run(). grpcio's future path, which this
// replaces, started a thread per call: about half a millisecond of a 10 ms
// job on pinned memory.
class RegionCall {
 public:
  RegionCall(std::shared_ptr<dgmm::Client> client, const std::string& method)
      : client_(std::move(client)), method_(method) {
    if (method_ != "MultiplyRegion" && method_ != "RegisterRegion" &&
        method_ != "UnregisterRegion" && method_ != "GetRegionStatus") {
      throw py::value_error("dgmm: not a region RPC: " + method_);
    }
  }
  RegionCall(const RegionCall&) = delete;
  RegionCall& operator=(const RegionCall&) = delete;

  // `session`: the dgmm-session value the call carries; `timeout`: seconds
  // or None.
  py::bytes Run(const py::bytes& request_bytes, const std::string& session,
                const py::object& timeout) {
    if (started_) throw py::value_error("dgmm: the region call was made already");
    started_ = true;
    if (method_ == "MultiplyRegion") {
      return Call<dgmm::v1::MultiplyRegionRequest, dgmm::v1::MultiplyRegionResponse>(
          request_bytes, session, timeout, &dgmm::v1::Dgmm::Stub::MultiplyRegion);
    }
    if (method_ == "RegisterRegion") {
      return Call<dgmm::v1::RegisterRegionRequest, dgmm::v1::RegisterRegionResponse>(
          request_bytes, session, timeout, &dgmm::v1::Dgmm::Stub::RegisterRegion);
    }
    if (method_ == "UnregisterRegion") {
      return Call<dgmm::v1::UnregisterRegionRequest, dgmm::v1::UnregisterRegionResponse>(
          request_bytes, session, timeout, &dgmm::v1::Dgmm::Stub::UnregisterRegion);
    }
    return Call<dgmm::v1::GetRegionStatusRequest, dgmm::v1::GetRegionStatusResponse>(
        request_bytes, session, timeout, &dgmm::v1::Dgmm::Stub::GetRegionStatus);
  }
  void Cancel() { token_.Cancel(); }

 private:
  template <typename Request, typename Response>
  py::bytes Call(const py::bytes& request_bytes, const std::string& session,
                 const py::object& timeout,
                 grpc::Status (dgmm::v1::Dgmm::Stub::*rpc)(grpc::ClientContext*, const Request&,
                                                           Response*)) {
    Request request;
    if (!request.ParseFromString(std::string(request_bytes))) {
      throw py::value_error("dgmm: not a serialized " + method_ + " request");
    }
    const absl::Time deadline = DeadlineIn(timeout);
    const bool main = PyThread_get_thread_ident() == sigint::main_thread;
    absl::Status failure;
    std::optional<int64_t> pushback;
    Response response;
    {
      py::gil_scoped_release release;
      grpc::ClientContext context;
      failure = client_->PrepareCall(&context, deadline);
      // Not for MultiplyRegion, which is not made on a channel that has
      // just failed (a job's region call follows its registration): a
      // control call may be the first on a new client's channel, or follow
      // a server restart, and would fail at once without trying.
      if (failure.ok() && method_ != "MultiplyRegion") failure = client_->AwaitChannel(deadline);
      if (failure.ok()) {
        if (!session.empty()) context.AddMetadata("dgmm-session", session);
        const bool chained = main && sigint::Begin(&token_);
        // A cancel() from now on TryCancels the context (before the call
        // starts too: gRPC cancels it as it starts).
        if (token_.Add(&context)) context.TryCancel();
        const grpc::Status status = (client_->stub()->*rpc)(&context, request, &response);
        token_.Remove(&context);
        if (chained) sigint::End();
        if (!status.ok()) {
          failure = dgmm::FromGrpcStatus(status);
          pushback = PushbackMs(context.GetServerTrailingMetadata());
        }
      }
    }
    if (main && PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (!failure.ok()) Raise(failure, 1, pushback);
    return Serialize(response);
  }

  std::shared_ptr<dgmm::Client> client_;
  const std::string method_;
  JobToken token_;
  bool started_ = false;
};

// The client's session on the server's local socket (dgmm::LocalSession,
// the C++ client's own, shared with its same-host jobs): its hello, its
// path, and the requests that pass memory, each without the GIL.
dgmm::v1::LocalTicket Ticket(absl::StatusOr<dgmm::v1::LocalTicket> ticket) {
  if (!ticket.ok()) Raise(ticket.status());
  return std::move(*ticket);
}

absl::Duration Seconds(const py::object& value, absl::Duration none) {
  if (value.is_none()) return none;
  return absl::Milliseconds(ToMs(value.cast<double>()));
}

std::shared_ptr<dgmm::Client> MakeClient(const std::string& target, const py::dict& o) {
  dgmm::ClientOptions options;
  auto get = [&](const char* key) -> py::object {
    return o.contains(key) ? py::reinterpret_borrow<py::object>(o[key]) : py::none();
  };
  options.deadline = Seconds(get("timeout"), absl::InfiniteDuration());
  if (!get("max_unary_message_bytes").is_none()) {
    options.max_unary_message_bytes = get("max_unary_message_bytes").cast<int64_t>();
  }
  if (!get("chunk_bytes").is_none()) options.chunk_bytes = get("chunk_bytes").cast<int64_t>();
  if (!get("stripes").is_none()) options.stripes = get("stripes").cast<int>();
  if (!get("token").is_none()) options.bearer_token = get("token").cast<std::string>();
  if (!get("load_balancing_policy").is_none()) {
    options.load_balancing_policy = get("load_balancing_policy").cast<std::string>();
  }
  if (!get("tls").is_none()) {
    py::tuple t = get("tls");
    dgmm::TlsOptions tls;
    tls.root_ca_pem = t[0].cast<std::string>();
    tls.cert_chain_pem = t[1].cast<std::string>();
    tls.private_key_pem = t[2].cast<std::string>();
    tls.server_name_override = t[3].cast<std::string>();
    options.tls = tls;
  }
  if (!get("retry").is_none()) {
    py::tuple r = get("retry");
    options.retry.max_attempts = r[0].cast<int>();
    options.retry.initial_backoff = Seconds(r[1], options.retry.initial_backoff);
    options.retry.max_backoff = Seconds(r[2], options.retry.max_backoff);
    options.retry.backoff_multiplier = r[3].cast<double>();
    options.retry.max_reconnect_wait = Seconds(r[4], options.retry.max_reconnect_wait);
  }
  options.initial_reconnect_backoff =
      Seconds(get("initial_reconnect_backoff"), options.initial_reconnect_backoff);
  options.min_reconnect_backoff =
      Seconds(get("min_reconnect_backoff"), options.min_reconnect_backoff);
  options.max_reconnect_backoff =
      Seconds(get("max_reconnect_backoff"), options.max_reconnect_backoff);
  if (!get("same_host").is_none()) options.same_host = get("same_host").cast<bool>();
  if (!get("process_memory").is_none()) {
    options.process_memory = get("process_memory").cast<bool>();
  }
  if (!get("local_socket").is_none()) {
    options.local_socket = get("local_socket").cast<std::string>();
  }
  absl::StatusOr<std::unique_ptr<dgmm::Client>> client = dgmm::Client::Create(target, options);
  if (!client.ok()) Raise(client.status());
  return std::shared_ptr<dgmm::Client>(std::move(*client));
}

}  // namespace
}  // namespace dgmm_py

PYBIND11_MODULE(_core, m) {
  using namespace dgmm_py;
  m.doc() = "dgmm's C++ client (dgmm::Client) for the Python package; use dgmm.Client.";
  // For short-lived processes: see dgmm::ConfigureGrpcForQuickExit.
  dgmm::ConfigureGrpcForQuickExit();
  sigint::main_thread =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();

  g_error_type = PyErr_NewException("dgmm._core.Error", nullptr, nullptr);
  m.attr("Error") = py::handle(g_error_type);

  // The policy's pure functions (docs/protocol.md section 9), the C++ client's own.
  m.def(
      "choose_transfer_mode",
      [](int64_t request_bytes, int64_t max_unary, int64_t chunk, int64_t line_bytes) {
        return std::string(dgmm::TransferModeName(
            dgmm::ChooseTransferMode(request_bytes, max_unary, chunk, line_bytes)));
      },
      py::arg("request_bytes"), py::arg("max_unary"), py::arg("chunk"), py::arg("line_bytes") = 0);
  m.def("choose_stripes", &dgmm::ChooseStripes);
  m.def("split_lines", [](int64_t lines, int stripes) {
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (const dgmm::LineRange& r : dgmm::SplitLines(lines, stripes)) {
      ranges.emplace_back(r.first_line, r.lines);
    }
    return ranges;
  });

  py::class_<dgmm::Client, std::shared_ptr<dgmm::Client>>(m, "Client")
      .def(py::init(&MakeClient), py::arg("target"), py::arg("options"))
      // server_info(timeout) and health(service, timeout): timeout in
      // seconds or None.
      .def(
          "server_info",
          [](dgmm::Client& c, const py::object& timeout) {
            const absl::Time deadline = DeadlineIn(timeout);
            absl::StatusOr<dgmm::v1::GetServerInfoResponse> info;
            {
              py::gil_scoped_release release;
              info = c.GetServerInfo(deadline);
            }
            if (!info.ok()) Raise(info.status());
            return Serialize(*info);
          },
          py::arg("timeout") = py::none())
      // MultiplyBatch: jobs as (a, d, out, rows, cols, dtype, col_major, side,
      // backend[, diagonal_dtype, right]) tuples (right: SIDE_BOTH's right
      // diagonal or None), run in one call without the GIL; one (code,
      // message, stats bytes or None) per job, in order; the call's own
      // error is raised. Not cancellable by Ctrl-C (one call, no job token).
      .def("multiply_batch",
           [](dgmm::Client& c, const py::list& jobs, const std::string& traceparent,
              const std::string& tracestate) {
             std::vector<std::unique_ptr<HeldBuffer>> held;
             std::vector<dgmm::BatchItem> items;
             held.reserve(4 * jobs.size());
             items.reserve(jobs.size());
             for (py::handle job : jobs) {
               const py::tuple t = py::reinterpret_borrow<py::tuple>(job);
               if (t.size() != 9 && t.size() != 11) {
                 throw py::value_error("dgmm: a batch job is a 9- or 11-tuple");
               }
               held.push_back(std::make_unique<HeldBuffer>(t[0], false, "A"));
               held.push_back(std::make_unique<HeldBuffer>(t[1], false, "the diagonal"));
               held.push_back(std::make_unique<HeldBuffer>(t[2], true, "out"));
               const HeldBuffer& a = *held[held.size() - 3];
               const HeldBuffer& d = *held[held.size() - 2];
               const HeldBuffer& out = *held[held.size() - 1];
               dgmm::BatchItem& item = items.emplace_back();
               item.job.matrix = {a.data(), t[3].cast<int64_t>(), t[4].cast<int64_t>(),
                                  static_cast<dgmm::v1::DType>(t[5].cast<int>()),
                                  t[6].cast<bool>() ? dgmm::v1::LAYOUT_COL_MAJOR
                                                    : dgmm::v1::LAYOUT_ROW_MAJOR};
               item.job.diagonal = d.data();
               item.job.diagonal_bytes = d.size();
               item.job.side = static_cast<dgmm::v1::Side>(t[7].cast<int>());
               item.job.backend = static_cast<dgmm::v1::Backend>(t[8].cast<int>());
               if (t.size() == 11) {
                 item.job.diagonal_dtype = static_cast<dgmm::v1::DType>(t[9].cast<int>());
                 if (!t[10].is_none()) {
                   held.push_back(std::make_unique<HeldBuffer>(t[10], false, "the right diagonal"));
                   item.job.right_diagonal = held.back()->data();
                   item.job.right_diagonal_bytes = held.back()->size();
                 }
               }
               item.out = out.data();
               item.out_bytes = out.size();
             }
             absl::StatusOr<dgmm::BatchResult> result;
             {
               py::gil_scoped_release release;
               result = c.MultiplyBatch(items, nullptr, traceparent, tracestate);
             }
             if (!result.ok()) Raise(result.status(), dgmm::AttemptsOf(result.status()));
             py::list outcomes;
             for (const absl::StatusOr<dgmm::v1::JobStats>& job : result->jobs) {
               if (job.ok()) {
                 outcomes.append(py::make_tuple(0, std::string(), Serialize(*job)));
               } else {
                 outcomes.append(py::make_tuple(static_cast<int>(job.status().code()),
                                                std::string(job.status().message()), py::none()));
               }
             }
             return outcomes;
           },
           py::arg("jobs"), py::arg("traceparent") = "", py::arg("tracestate") = "")
      // The region session (opened on first use, again after the server
      // closed it): GetServerInfo, then the socket it names or the client's
      // local_socket option, checked to be the same server's.
      .def("region_session",
           [](dgmm::Client& c) {
             absl::StatusOr<std::shared_ptr<dgmm::LocalSession>> session;
             {
               py::gil_scoped_release release;
               session = c.RegionSession();
             }
             if (!session.ok()) Raise(session.status());
             return *session;
           })
      .def(
          "health",
          [](dgmm::Client& c, const std::string& service, const py::object& timeout) {
            const absl::Time deadline = DeadlineIn(timeout);
            absl::StatusOr<dgmm::HealthState> state;
            {
              py::gil_scoped_release release;
              state = c.Health(service, deadline);
            }
            if (!state.ok()) Raise(state.status());
            return static_cast<int>(*state);
          },
          py::arg("service") = "", py::arg("timeout") = py::none());

  py::class_<RegionCall>(m, "RegionCall")
      .def(py::init<std::shared_ptr<dgmm::Client>, const std::string&>(), py::arg("client"),
           py::arg("method"))
      .def("run", &RegionCall::Run, py::arg("request"), py::arg("session"),
           py::arg("timeout") = py::none())
      .def("cancel", &RegionCall::Cancel);

  py::class_<dgmm::LocalSession, std::shared_ptr<dgmm::LocalSession>>(m, "LocalSession")
      .def_property_readonly("hello",
                             [](const dgmm::LocalSession& s) { return Serialize(s.hello()); })
      .def_property_readonly("path", &dgmm::LocalSession::path)
      .def("alive", &dgmm::LocalSession::open)
      .def("close", &dgmm::LocalSession::Close)
      .def(
          "pass_fd",
          [](dgmm::LocalSession& s, int fd, int kind, int device, int64_t allocation_bytes) {
            absl::StatusOr<dgmm::v1::LocalTicket> ticket;
            {
              py::gil_scoped_release release;
              ticket = s.PassFd(fd, static_cast<dgmm::v1::LocalFdKind>(kind), device,
                                allocation_bytes);
            }
            return Serialize(Ticket(std::move(ticket)));
          },
          py::arg("fd"), py::arg("kind"), py::arg("device"), py::arg("allocation_bytes"))
      .def(
          "open_shm",
          [](dgmm::LocalSession& s, const std::string& key) {
            absl::StatusOr<dgmm::v1::LocalTicket> ticket;
            {
              py::gil_scoped_release release;
              ticket = s.OpenShm(key);
            }
            return Serialize(Ticket(std::move(ticket)));
          },
          py::arg("key"));

  py::class_<Job>(m, "Job")
      .def(py::init([](std::shared_ptr<dgmm::Client> client, py::object a, py::object d,
                       py::object out, int64_t rows, int64_t cols, int dtype, bool col_major,
                       int side, int backend, int mode, py::object progress, int diagonal_dtype,
                       py::object right, std::string traceparent, std::string tracestate) {
             auto job = std::make_unique<Job>(std::move(client), a, d, out, rows, cols, dtype,
                                              col_major, side, backend, mode, std::move(progress),
                                              diagonal_dtype, right);
             job->SetTrace(std::move(traceparent), std::move(tracestate));
             return job;
           }),
           py::arg("client"), py::arg("a"), py::arg("d"), py::arg("out"), py::arg("rows"),
           py::arg("cols"), py::arg("dtype"), py::arg("col_major"), py::arg("side"),
           py::arg("backend"), py::arg("mode"), py::arg("progress"), py::arg("diagonal_dtype") = 0,
           py::arg("right") = py::none(), py::arg("traceparent") = "",
           py::arg("tracestate") = "")
      .def("run", &Job::Run)
      .def("start", &Job::Start)
      .def("result", &Job::Result)
      .def("wait", &Job::Wait, py::arg("timeout") = -1.0)
      .def("done", &Job::Done)
      .def("cancel", &Job::Cancel)
      .def("add_done_callback", &Job::AddDoneCallback);
}
