// dgmm_node: the Node.js binding of the C++ client (dgmm::Client), on
// Node-API (node_api.h, no other dependency). The policy -- unary or stream,
// striping, retries and resume, the same-host path, dtype promotion -- is the
// C++ core's; this file only converts arguments and results.
//
// Threads: every call that talks to the server runs on a worker thread of a
// small pool (one more thread is started whenever all are busy), never on
// the JS thread. Typed arrays are read and written in place: the job holds
// references to them until it completes. Completions and progress reach the
// JS thread through one thread-safe function, in the order they were queued,
// so a job's last progress report comes before its completion.
#include <node_api.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dgmm/client.h"
#include "dgmm/regions.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "src/retry.h"

namespace {

// ---- Node-API helpers. A failed napi_* call leaves a pending exception;
// the callers return nullptr (undefined) and let it propagate.

#define NAPI_OK(call)                          \
  do {                                         \
    if ((call) != napi_ok) return nullptr;     \
  } while (0)

napi_value ThrowType(napi_env env, const std::string& message) {
  napi_throw_type_error(env, nullptr, message.c_str());
  return nullptr;
}

napi_value Str(napi_env env, const std::string& s) {
  napi_value v;
  napi_create_string_utf8(env, s.data(), s.size(), &v);
  return v;
}

napi_value Num(napi_env env, double d) {
  napi_value v;
  napi_create_double(env, d, &v);
  return v;
}

napi_value Bool(napi_env env, bool b) {
  napi_value v;
  napi_get_boolean(env, b, &v);
  return v;
}

napi_value Undefined(napi_env env) {
  napi_value v;
  napi_get_undefined(env, &v);
  return v;
}

napi_value Null(napi_env env) {
  napi_value v;
  napi_get_null(env, &v);
  return v;
}

void Set(napi_env env, napi_value object, const char* key, napi_value value) {
  napi_set_named_property(env, object, key, value);
}

napi_value Object(napi_env env) {
  napi_value o;
  napi_create_object(env, &o);
  return o;
}

bool IsNullish(napi_env env, napi_value v) {
  napi_valuetype t;
  napi_typeof(env, v, &t);
  return t == napi_undefined || t == napi_null;
}

double GetNumber(napi_env env, napi_value v, double fallback) {
  double d;
  return napi_get_value_double(env, v, &d) == napi_ok ? d : fallback;
}

std::string GetString(napi_env env, napi_value v) {
  size_t n = 0;
  if (napi_get_value_string_utf8(env, v, nullptr, 0, &n) != napi_ok) return "";
  std::string s(n, '\0');
  napi_get_value_string_utf8(env, v, s.data(), n + 1, &n);
  return s;
}

napi_value Prop(napi_env env, napi_value object, const char* key) {
  napi_value v = nullptr;
  if (napi_get_named_property(env, object, key, &v) != napi_ok) return nullptr;
  return v;
}

// The call's first N arguments (undefined for those not given).
template <size_t N>
bool Args(napi_env env, napi_callback_info info, napi_value (&argv)[N]) {
  size_t argc = N;
  return napi_get_cb_info(env, info, &argc, argv, nullptr, nullptr) == napi_ok;
}

int64_t Int(napi_env env, napi_value v) { return static_cast<int64_t>(GetNumber(env, v, 0)); }

// A typed array's bytes, in place.
struct Bytes {
  void* data = nullptr;
  size_t size = 0;
};

std::optional<Bytes> TypedBytes(napi_env env, napi_value v) {
  bool is_typed = false;
  if (napi_is_typedarray(env, v, &is_typed) != napi_ok || !is_typed) return std::nullopt;
  napi_typedarray_type type;
  size_t length = 0;
  void* data = nullptr;
  if (napi_get_typedarray_info(env, v, &type, &length, &data, nullptr, nullptr) != napi_ok) {
    return std::nullopt;
  }
  size_t element = 1;
  switch (type) {
    case napi_int16_array:
    case napi_uint16_array:
      element = 2;
      break;
    case napi_int32_array:
    case napi_uint32_array:
    case napi_float32_array:
      element = 4;
      break;
    case napi_float64_array:
    case napi_bigint64_array:
    case napi_biguint64_array:
      element = 8;
      break;
    default:
      break;
  }
  return Bytes{data, length * element};
}

// A protobuf message as a plain object, as @grpc/proto-loader made them
// with { keepCase: false, longs: Number, enums: String, defaults: true }:
// camelCase names, every field present, 64-bit integers as numbers, enums by
// name, bytes as Buffers, unset messages null.
napi_value FieldValue(napi_env env, const google::protobuf::Message& m,
                      const google::protobuf::FieldDescriptor* f, int index);

napi_value MessageToJs(napi_env env, const google::protobuf::Message& m) {
  napi_value o = Object(env);
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    napi_value v;
    if (f->is_repeated()) {
      const int n = r->FieldSize(m, f);
      napi_create_array_with_length(env, n, &v);
      for (int k = 0; k < n; ++k) napi_set_element(env, v, k, FieldValue(env, m, f, k));
    } else if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE &&
               !r->HasField(m, f)) {
      v = Null(env);
    } else {
      v = FieldValue(env, m, f, -1);
    }
    Set(env, o, f->camelcase_name().c_str(), v);
  }
  return o;
}

napi_value FieldValue(napi_env env, const google::protobuf::Message& m,
                      const google::protobuf::FieldDescriptor* f, int k) {
  using FD = google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  const bool rep = k >= 0;
  switch (f->cpp_type()) {
    case FD::CPPTYPE_INT32:
      return Num(env, rep ? r->GetRepeatedInt32(m, f, k) : r->GetInt32(m, f));
    case FD::CPPTYPE_INT64:
      return Num(env, static_cast<double>(rep ? r->GetRepeatedInt64(m, f, k) : r->GetInt64(m, f)));
    case FD::CPPTYPE_UINT32:
      return Num(env, rep ? r->GetRepeatedUInt32(m, f, k) : r->GetUInt32(m, f));
    case FD::CPPTYPE_UINT64:
      return Num(env,
                 static_cast<double>(rep ? r->GetRepeatedUInt64(m, f, k) : r->GetUInt64(m, f)));
    case FD::CPPTYPE_DOUBLE:
      return Num(env, rep ? r->GetRepeatedDouble(m, f, k) : r->GetDouble(m, f));
    case FD::CPPTYPE_FLOAT:
      return Num(env, rep ? r->GetRepeatedFloat(m, f, k) : r->GetFloat(m, f));
    case FD::CPPTYPE_BOOL:
      return Bool(env, rep ? r->GetRepeatedBool(m, f, k) : r->GetBool(m, f));
    case FD::CPPTYPE_ENUM:
      return Str(env, (rep ? r->GetRepeatedEnum(m, f, k) : r->GetEnum(m, f))->name());
    case FD::CPPTYPE_STRING: {
      const std::string s = rep ? r->GetRepeatedString(m, f, k) : r->GetString(m, f);
      if (f->type() == FD::TYPE_BYTES) {
        napi_value b;
        void* data;
        napi_create_buffer_copy(env, s.size(), s.data(), &data, &b);
        return b;
      }
      return Str(env, s);
    }
    case FD::CPPTYPE_MESSAGE:
      return MessageToJs(env, rep ? r->GetRepeatedMessage(m, f, k) : r->GetMessage(m, f));
  }
  return Undefined(env);
}

// ---- Where native work meets the JS thread.

// One call to the server: Run() on a worker thread, then Complete() on the
// JS thread with the callback it was given.
class Call {
 public:
  virtual ~Call() = default;
  virtual void Run() = 0;
  // Returns the callback's (error, value) arguments.
  virtual std::pair<napi_value, napi_value> Complete(napi_env env) = 0;

  // Keeps `v` alive until the call completes.
  bool Keep(napi_env env, napi_value v) {
    napi_ref ref;
    if (napi_create_reference(env, v, 1, &ref) != napi_ok) return false;
    refs_.push_back(ref);
    return true;
  }
  void Release(napi_env env) {
    for (napi_ref ref : refs_) napi_delete_reference(env, ref);
    refs_.clear();
  }
  napi_ref callback = nullptr;

 private:
  std::vector<napi_ref> refs_;
};

// A job's progress: the latest lines done, posted at most once at a time.
struct Progress {
  napi_ref function = nullptr;
  std::atomic<int64_t> lines_done{0};
  int64_t total_lines = 0;
  std::atomic<bool> posted{false};
  int64_t reported = -1;  // JS thread only
};

struct Message {
  Call* done = nullptr;                  // a completion, or
  std::shared_ptr<Progress> progress;    // a progress report
};

napi_threadsafe_function g_tsfn = nullptr;
int g_pending = 0;  // JS thread only: calls started and not completed

void Post(Message* message) {
  napi_call_threadsafe_function(g_tsfn, message, napi_tsfn_blocking);
}

void OnMessage(napi_env env, napi_value, void*, void* data) {
  std::unique_ptr<Message> message(static_cast<Message*>(data));
  if (env == nullptr) return;  // the environment is going away
  napi_value global;
  napi_get_global(env, &global);
  if (message->progress != nullptr) {
    Progress& p = *message->progress;
    p.posted.store(false);
    const int64_t lines = p.lines_done.load();
    if (lines == p.reported) return;
    p.reported = lines;
    napi_value fn = nullptr;
    if (p.function == nullptr || napi_get_reference_value(env, p.function, &fn) != napi_ok ||
        fn == nullptr) {
      return;
    }
    napi_value args[2] = {Num(env, static_cast<double>(lines)),
                          Num(env, static_cast<double>(p.total_lines))};
    napi_value ignored;
    if (napi_call_function(env, global, fn, 2, args, &ignored) == napi_pending_exception) {
      napi_value error;
      napi_get_and_clear_last_exception(env, &error);
      napi_fatal_exception(env, error);
    }
    return;
  }
  std::unique_ptr<Call> call(message->done);
  napi_handle_scope scope;
  napi_open_handle_scope(env, &scope);
  auto [error, value] = call->Complete(env);
  napi_value fn = nullptr;
  napi_get_reference_value(env, call->callback, &fn);
  napi_delete_reference(env, call->callback);
  call->Release(env);
  if (--g_pending == 0) napi_unref_threadsafe_function(env, g_tsfn);
  if (fn != nullptr) {
    napi_value args[2] = {error, value};
    napi_value ignored;
    if (napi_call_function(env, global, fn, 2, args, &ignored) == napi_pending_exception) {
      napi_value exception;
      napi_get_and_clear_last_exception(env, &exception);
      napi_fatal_exception(env, exception);
    }
  }
  napi_close_handle_scope(env, scope);
}

// Worker threads: one more is started whenever every one is busy, so that a
// job waiting on the server never holds up another. A worker that finished
// a job watches the queue for a short while before it sleeps: a caller
// sending jobs back to back (small ones above all) then hands the next one
// over without waking a sleeping thread, which on a loaded machine cost
// about as much as a 1x1 job itself.
class Pool {
 public:
  void Submit(Call* call) {
    std::unique_lock lock(mu_);
    queue_.push_back(call);
    queued_.store(queue_.size(), std::memory_order_release);
    // Each watching worker takes one queued call, each idle one another
    // once woken; a call beyond them all gets a thread of its own, so that
    // two calls queued at once never wait on each other.
    const size_t queued = queue_.size();
    if (queued <= static_cast<size_t>(watching_)) return;
    if (idle_ > 0) cv_.notify_one();
    if (queued > static_cast<size_t>(watching_ + idle_)) std::thread([this] { Work(); }).detach();
  }

 private:
  static constexpr auto kWatch = std::chrono::microseconds(250);

  void Work() {
    std::unique_lock lock(mu_);
    for (;;) {
      if (queue_.empty()) {
        ++watching_;
        lock.unlock();
        const auto until = std::chrono::steady_clock::now() + kWatch;
        while (queued_.load(std::memory_order_acquire) == 0 &&
               std::chrono::steady_clock::now() < until) {
          std::this_thread::yield();
        }
        lock.lock();
        --watching_;
      }
      if (queue_.empty()) {
        ++idle_;
        cv_.wait(lock, [this] { return !queue_.empty(); });
        --idle_;
      }
      Call* call = queue_.front();
      queue_.pop_front();
      queued_.store(queue_.size(), std::memory_order_release);
      lock.unlock();
      call->Run();
      Post(new Message{call, nullptr});
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Call*> queue_;                // guarded by mu_
  std::atomic<size_t> queued_{0};          // queue_.size(), read without mu_
  int idle_ = 0;                           // guarded by mu_
  int watching_ = 0;                       // guarded by mu_
};

Pool* g_pool = new Pool;  // never destroyed: its threads outlive exit

// Starts `call` (its callback is argv[callback_index]).
napi_value Start(napi_env env, std::unique_ptr<Call> call, napi_value callback) {
  NAPI_OK(napi_create_reference(env, callback, 1, &call->callback));
  if (g_pending++ == 0) napi_ref_threadsafe_function(env, g_tsfn);
  g_pool->Submit(call.release());
  return Undefined(env);
}

// A status as the error argument: { code, message, attempts, retryAfterMs }.
napi_value ErrorValue(napi_env env, const absl::Status& status) {
  napi_value e = Object(env);
  Set(env, e, "code", Num(env, static_cast<int>(status.code())));
  Set(env, e, "message", Str(env, std::string(status.message())));
  Set(env, e, "attempts", Num(env, dgmm::AttemptsOf(status)));
  std::optional<int64_t> after = dgmm::RetryAfterMsOf(status);
  Set(env, e, "retryAfterMs", after.has_value() ? Num(env, static_cast<double>(*after)) : Null(env));
  return e;
}

// ---- The client.

struct ClientBox {
  std::shared_ptr<dgmm::Client> client;
};

napi_value NewClient(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  napi_value self;
  NAPI_OK(napi_get_cb_info(env, info, &argc, argv, &self, nullptr));
  const std::string target = GetString(env, argv[0]);
  napi_value o = argv[1];
  dgmm::ClientOptions options;
  auto ms = [&](const char* key, absl::Duration* into) {
    napi_value v = Prop(env, o, key);
    if (v != nullptr && !IsNullish(env, v)) *into = absl::Milliseconds(GetNumber(env, v, 0));
  };
  auto integer = [&](const char* key, auto* into) {
    napi_value v = Prop(env, o, key);
    if (v != nullptr && !IsNullish(env, v)) {
      *into = static_cast<std::remove_pointer_t<decltype(into)>>(GetNumber(env, v, 0));
    }
  };
  auto text = [&](const char* key, std::string* into) {
    napi_value v = Prop(env, o, key);
    if (v != nullptr && !IsNullish(env, v)) *into = GetString(env, v);
  };
  auto flag = [&](const char* key, bool* into) {
    napi_value v = Prop(env, o, key);
    if (v != nullptr && !IsNullish(env, v)) napi_get_value_bool(env, v, into);
  };
  integer("maxAttempts", &options.retry.max_attempts);
  ms("initialBackoffMs", &options.retry.initial_backoff);
  ms("maxBackoffMs", &options.retry.max_backoff);
  napi_value mult = Prop(env, o, "backoffMultiplier");
  if (mult != nullptr && !IsNullish(env, mult)) {
    options.retry.backoff_multiplier = GetNumber(env, mult, 2);
  }
  ms("maxReconnectWaitMs", &options.retry.max_reconnect_wait);
  ms("initialReconnectBackoffMs", &options.initial_reconnect_backoff);
  ms("minReconnectBackoffMs", &options.min_reconnect_backoff);
  ms("maxReconnectBackoffMs", &options.max_reconnect_backoff);
  text("token", &options.bearer_token);
  text("loadBalancingPolicy", &options.load_balancing_policy);
  text("localSocket", &options.local_socket);
  flag("sameHost", &options.same_host);
  flag("processMemory", &options.process_memory);
  integer("stripes", &options.stripes);
  integer("chunkBytes", &options.chunk_bytes);
  integer("maxUnaryMessageBytes", &options.max_unary_message_bytes);
  integer("sameHostMinBytes", &options.same_host_min_bytes);
  integer("streamingThresholdBytes", &options.streaming_threshold_bytes);
  napi_value tls = Prop(env, o, "tls");
  if (tls != nullptr && !IsNullish(env, tls)) {
    dgmm::TlsOptions t;
    napi_value v;
    if ((v = Prop(env, tls, "rootCaPem")) && !IsNullish(env, v)) t.root_ca_pem = GetString(env, v);
    if ((v = Prop(env, tls, "certChainPem")) && !IsNullish(env, v)) t.cert_chain_pem = GetString(env, v);
    if ((v = Prop(env, tls, "privateKeyPem")) && !IsNullish(env, v)) t.private_key_pem = GetString(env, v);
    if ((v = Prop(env, tls, "serverNameOverride")) && !IsNullish(env, v)) {
      t.server_name_override = GetString(env, v);
    }
    options.tls = t;
  }
  absl::StatusOr<std::unique_ptr<dgmm::Client>> client = dgmm::Client::Create(target, options);
  if (!client.ok()) {
    napi_value error = ErrorValue(env, client.status());
    napi_throw(env, error);
    return nullptr;
  }
  auto* box = new ClientBox{std::move(*client)};
  NAPI_OK(napi_wrap(
      env, self, box, [](napi_env, void* data, void*) { delete static_cast<ClientBox*>(data); },
      nullptr, nullptr));
  return self;
}

// The client of `object` (a native Client), or nullptr with an exception.
std::shared_ptr<dgmm::Client> ClientOf(napi_env env, napi_value object) {
  void* data = nullptr;
  if (napi_unwrap(env, object, &data) != napi_ok || data == nullptr) {
    ThrowType(env, "dgmm: not a client");
    return nullptr;
  }
  auto* box = static_cast<ClientBox*>(data);
  if (box->client == nullptr) {
    napi_value error = ErrorValue(env, absl::CancelledError("dgmm: the client is closed"));
    napi_throw(env, error);
    return nullptr;
  }
  return box->client;
}

// close(): drops this handle's client; jobs in flight keep it until they end.
napi_value CloseClient(napi_env env, napi_callback_info info) {
  napi_value self;
  NAPI_OK(napi_get_cb_info(env, info, nullptr, nullptr, &self, nullptr));
  void* data = nullptr;
  if (napi_unwrap(env, self, &data) == napi_ok && data != nullptr) {
    static_cast<ClientBox*>(data)->client.reset();
  }
  return Undefined(env);
}

// ---- Jobs.

// What JobSpec() reads: the job's arrays are kept by the call.
struct JobArgs {
  dgmm::Job job;
  void* out = nullptr;
  size_t out_bytes = 0;
};

// Reads a job from argv (see multiply() below for the order) into `args`,
// keeping its arrays alive through `call`. Returns false with an exception.
bool ReadJob(napi_env env, napi_value* argv, Call* call, JobArgs* args) {
  // 0 a, 1 dtype, 2 rows, 3 cols, 4 layout, 5 side, 6 backend, 7 d, 8 dDtype,
  // 9 right (or null), 10 resultDtype, 11 out
  dgmm::Job& job = args->job;
  std::optional<Bytes> a = TypedBytes(env, argv[0]);
  std::optional<Bytes> d = TypedBytes(env, argv[7]);
  std::optional<Bytes> out = TypedBytes(env, argv[11]);
  if (!a || !d || !out) {
    ThrowType(env, "dgmm: the matrix, diagonal and out must be typed arrays");
    return false;
  }
  job.matrix.data = a->data;
  job.matrix.dtype = static_cast<dgmm::v1::DType>(GetNumber(env, argv[1], 0));
  job.matrix.rows = Int(env, argv[2]);
  job.matrix.cols = Int(env, argv[3]);
  job.matrix.layout = static_cast<dgmm::v1::Layout>(GetNumber(env, argv[4], 0));
  job.side = static_cast<dgmm::v1::Side>(GetNumber(env, argv[5], 0));
  job.backend = static_cast<dgmm::v1::Backend>(GetNumber(env, argv[6], 0));
  job.diagonal = d->data;
  job.diagonal_bytes = d->size;
  job.diagonal_dtype = static_cast<dgmm::v1::DType>(GetNumber(env, argv[8], 0));
  if (!IsNullish(env, argv[9])) {
    std::optional<Bytes> r = TypedBytes(env, argv[9]);
    if (!r) {
      ThrowType(env, "dgmm: the right diagonal must be a typed array");
      return false;
    }
    job.right_diagonal = r->data;
    job.right_diagonal_bytes = r->size;
    if (!call->Keep(env, argv[9])) return false;
  }
  job.result_dtype = static_cast<dgmm::v1::DType>(GetNumber(env, argv[10], 0));
  args->out = out->data;
  args->out_bytes = out->size;
  return call->Keep(env, argv[0]) && call->Keep(env, argv[7]) && call->Keep(env, argv[11]);
}

// info of a finished or failed job.
napi_value JobInfo(napi_env env, const dgmm::JobResult& r) {
  napi_value info = Object(env);
  Set(env, info, "mode", Str(env, dgmm::TransferModeName(r.mode)));
  Set(env, info, "stripes", Num(env, r.stripes));
  Set(env, info, "attempts", Num(env, r.attempts));
  Set(env, info, "resumed", Num(env, r.resumed));
  std::string group;
  if (!r.part_stats.empty()) group = r.part_stats[0].group().id();
  Set(env, info, "groupId", Str(env, group));
  napi_value parts;
  const std::vector<dgmm::v1::JobStats>& list =
      r.part_stats.empty() ? std::vector<dgmm::v1::JobStats>{r.stats} : r.part_stats;
  napi_create_array_with_length(env, list.size(), &parts);
  for (size_t i = 0; i < list.size(); ++i) napi_set_element(env, parts, i, MessageToJs(env, list[i]));
  Set(env, info, "stats", parts);
  Set(env, info, "socketReason", Str(env, r.socket_reason));
  Set(env, info, "processMemory", Bool(env, r.process_memory));
  Set(env, info, "receivedBytes", Num(env, static_cast<double>(r.received_bytes)));
  napi_value phases = Object(env);
  Set(env, phases, "setup", Num(env, r.same_host.setup));
  Set(env, phases, "copyIn", Num(env, r.same_host.copy_in));
  Set(env, phases, "job", Num(env, r.same_host.job));
  Set(env, phases, "copyOut", Num(env, r.same_host.copy_out));
  Set(env, info, "sameHost", phases);
  Set(env, info, "traceparent", Str(env, r.traceparent));
  return info;
}

class MultiplyCall : public Call {
 public:
  std::shared_ptr<dgmm::Client> client;
  JobArgs args;
  std::optional<dgmm::TransferMode> mode;
  std::shared_ptr<dgmm::CancelToken> cancel;
  std::shared_ptr<Progress> progress;
  bool want_info = false;

  void Run() override {
    dgmm::ProgressCallback report;
    if (progress != nullptr) {
      const int64_t lines = progress->total_lines;
      report = [p = progress, lines](int64_t, int64_t received, int64_t total) {
        const int64_t done = total > 0 ? static_cast<int64_t>(
                                             static_cast<__int128>(received) * lines / total)
                                       : 0;
        p->lines_done.store(done);
        if (!p->posted.exchange(true)) Post(new Message{nullptr, p});
      };
    }
    dgmm::CancelToken* token = cancel.get();
    if (!mode.has_value()) {
      result_ = client->Multiply(args.job, args.out, args.out_bytes, report, token);
    } else if (*mode == dgmm::TransferMode::kUnary) {
      result_ = client->MultiplyUnary(args.job, args.out, args.out_bytes, report, token);
    } else {
      result_ = client->MultiplyStream(args.job, args.out, args.out_bytes, report, token);
    }
    if (!result_.ok()) {
      plan_ = client->Plan(args.job, mode);
    } else if (progress != nullptr && progress->lines_done.load() != progress->total_lines) {
      // Paths that report no progress of their own (the same-host path):
      // every line is in place now.
      progress->lines_done.store(progress->total_lines);
      if (!progress->posted.exchange(true)) Post(new Message{nullptr, progress});
    }
  }

  std::pair<napi_value, napi_value> Complete(napi_env env) override {
    if (progress != nullptr) {
      napi_delete_reference(env, progress->function);
      progress->function = nullptr;
    }
    if (result_.ok()) {
      return {Null(env), want_info ? JobInfo(env, *result_) : Undefined(env)};
    }
    napi_value error = ErrorValue(env, result_.status());
    napi_value info = Object(env);
    Set(env, info, "mode", Str(env, plan_.ok() ? dgmm::TransferModeName(plan_->mode) : "unary"));
    Set(env, info, "stripes", Num(env, plan_.ok() ? plan_->stripes : 1));
    Set(env, info, "attempts", Num(env, dgmm::AttemptsOf(result_.status())));
    Set(env, error, "info", info);
    return {error, Undefined(env)};
  }

 private:
  absl::StatusOr<dgmm::JobResult> result_ = absl::UnknownError("not run");
  absl::StatusOr<dgmm::Client::JobPlan> plan_ = absl::UnknownError("not planned");
};

struct CancelBox {
  std::shared_ptr<dgmm::CancelToken> token = std::make_shared<dgmm::CancelToken>();
};

napi_value NewCancelToken(napi_env env, napi_callback_info) {
  napi_value v;
  NAPI_OK(napi_create_external(
      env, new CancelBox, [](napi_env, void* d, void*) { delete static_cast<CancelBox*>(d); },
      nullptr, &v));
  return v;
}

napi_value Cancel(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  if (!Args(env, info, argv)) return nullptr;
  void* data = nullptr;
  NAPI_OK(napi_get_value_external(env, argv[0], &data));
  static_cast<CancelBox*>(data)->token->Cancel();
  return Undefined(env);
}

// multiply(client, a, dtype, rows, cols, layout, side, backend, d, dDtype,
//          right, resultDtype, out, mode, timeoutMs, progress, cancel,
//          wantInfo, callback[, traceparent, tracestate])
// mode: 0 the policy's choice, 1 unary, 2 stream. timeoutMs < 0: none.
napi_value Multiply(napi_env env, napi_callback_info info) {
  napi_value argv[21];
  if (!Args(env, info, argv)) return nullptr;
  auto call = std::make_unique<MultiplyCall>();
  call->client = ClientOf(env, argv[0]);
  if (call->client == nullptr) return nullptr;
  if (!ReadJob(env, argv + 1, call.get(), &call->args)) {
    call->Release(env);
    return nullptr;
  }
  const int mode = static_cast<int>(GetNumber(env, argv[13], 0));
  if (mode == 1) call->mode = dgmm::TransferMode::kUnary;
  if (mode == 2) call->mode = dgmm::TransferMode::kStream;
  const double timeout_ms = GetNumber(env, argv[14], -1);
  if (timeout_ms >= 0) call->args.job.deadline = absl::Now() + absl::Milliseconds(timeout_ms);
  if (!IsNullish(env, argv[15])) {
    call->progress = std::make_shared<Progress>();
    const dgmm::Job& job = call->args.job;
    call->progress->total_lines =
        job.matrix.layout == dgmm::v1::LAYOUT_COL_MAJOR ? job.matrix.cols : job.matrix.rows;
    // Deleted by Complete: every report of the job comes before it.
    NAPI_OK(napi_create_reference(env, argv[15], 1, &call->progress->function));
  }
  if (!IsNullish(env, argv[16])) {
    void* data = nullptr;
    NAPI_OK(napi_get_value_external(env, argv[16], &data));
    call->cancel = static_cast<CancelBox*>(data)->token;
  }
  bool want = false;
  napi_get_value_bool(env, argv[17], &want);
  call->want_info = want;
  if (!IsNullish(env, argv[19])) call->args.job.traceparent = GetString(env, argv[19]);
  if (!IsNullish(env, argv[20])) call->args.job.tracestate = GetString(env, argv[20]);
  return Start(env, std::move(call), argv[18]);
}

// multiplyBatch(client, items, cancel, callback[, traceparent, tracestate]);
// items: arrays of ReadJob's 12 values.
class BatchCall : public Call {
 public:
  std::shared_ptr<dgmm::Client> client;
  std::vector<dgmm::BatchItem> items;
  std::shared_ptr<dgmm::CancelToken> cancel;
  std::string traceparent, tracestate;

  void Run() override {
    result_ = client->MultiplyBatch(items, cancel.get(), traceparent, tracestate);
  }

  std::pair<napi_value, napi_value> Complete(napi_env env) override {
    if (!result_.ok()) return {ErrorValue(env, result_.status()), Undefined(env)};
    napi_value list;
    napi_create_array_with_length(env, result_->jobs.size(), &list);
    for (size_t i = 0; i < result_->jobs.size(); ++i) {
      const absl::StatusOr<dgmm::v1::JobStats>& job = result_->jobs[i];
      napi_value entry = Object(env);
      if (job.ok()) {
        Set(env, entry, "stats", MessageToJs(env, *job));
      } else {
        Set(env, entry, "error", ErrorValue(env, job.status()));
      }
      napi_set_element(env, list, i, entry);
    }
    napi_value done = Object(env);
    Set(env, done, "jobs", list);
    Set(env, done, "attempts", Num(env, result_->attempts));
    Set(env, done, "traceparent", Str(env, result_->traceparent));
    return {Null(env), done};
  }

 private:
  absl::StatusOr<dgmm::BatchResult> result_ = absl::UnknownError("not run");
};

napi_value MultiplyBatch(napi_env env, napi_callback_info info) {
  napi_value argv[6];
  if (!Args(env, info, argv)) return nullptr;
  auto call = std::make_unique<BatchCall>();
  call->client = ClientOf(env, argv[0]);
  if (call->client == nullptr) return nullptr;
  uint32_t n = 0;
  NAPI_OK(napi_get_array_length(env, argv[1], &n));
  for (uint32_t i = 0; i < n; ++i) {
    napi_value item;
    NAPI_OK(napi_get_element(env, argv[1], i, &item));
    napi_value fields[12];
    for (uint32_t k = 0; k < 12; ++k) NAPI_OK(napi_get_element(env, item, k, &fields[k]));
    JobArgs args;
    if (!ReadJob(env, fields, call.get(), &args)) {
      call->Release(env);
      return nullptr;
    }
    call->items.push_back({args.job, args.out, args.out_bytes});
  }
  if (!IsNullish(env, argv[2])) {
    void* data = nullptr;
    NAPI_OK(napi_get_value_external(env, argv[2], &data));
    call->cancel = static_cast<CancelBox*>(data)->token;
  }
  if (!IsNullish(env, argv[4])) call->traceparent = GetString(env, argv[4]);
  if (!IsNullish(env, argv[5])) call->tracestate = GetString(env, argv[5]);
  return Start(env, std::move(call), argv[3]);
}

// A call whose result is a protobuf message (or an error), made by `run`.
class MessageCall : public Call {
 public:
  std::function<absl::StatusOr<std::unique_ptr<google::protobuf::Message>>()> run;
  void Run() override { result_ = run(); }
  std::pair<napi_value, napi_value> Complete(napi_env env) override {
    if (!result_.ok()) return {ErrorValue(env, result_.status()), Undefined(env)};
    return {Null(env), MessageToJs(env, **result_)};
  }

 private:
  absl::StatusOr<std::unique_ptr<google::protobuf::Message>> result_ =
      absl::UnknownError("not run");
};

template <typename M>
absl::StatusOr<std::unique_ptr<google::protobuf::Message>> Boxed(absl::StatusOr<M> m) {
  if (!m.ok()) return m.status();
  return std::unique_ptr<google::protobuf::Message>(new M(*std::move(m)));
}

// A call's deadline from timeoutMs (< 0: none), taken as the call starts.
absl::Time DeadlineIn(int64_t timeout_ms) {
  return timeout_ms < 0 ? absl::InfiniteFuture() : absl::Now() + absl::Milliseconds(timeout_ms);
}

// serverInfo(client, timeoutMs, callback)
napi_value ServerInfo(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  if (!Args(env, info, argv)) return nullptr;
  std::shared_ptr<dgmm::Client> client = ClientOf(env, argv[0]);
  if (client == nullptr) return nullptr;
  const absl::Time deadline = DeadlineIn(IsNullish(env, argv[1]) ? -1 : Int(env, argv[1]));
  auto call = std::make_unique<MessageCall>();
  call->run = [client, deadline] { return Boxed(client->GetServerInfo(deadline)); };
  return Start(env, std::move(call), argv[2]);
}

// health(client, service, timeoutMs, callback): the status's name.
class HealthCall : public Call {
 public:
  std::shared_ptr<dgmm::Client> client;
  std::string service;
  absl::Time deadline = absl::InfiniteFuture();
  void Run() override { result_ = client->Health(service, deadline); }
  std::pair<napi_value, napi_value> Complete(napi_env env) override {
    if (!result_.ok()) return {ErrorValue(env, result_.status()), Undefined(env)};
    return {Null(env),
            Str(env, grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*result_))};
  }

 private:
  absl::StatusOr<dgmm::HealthState> result_ = absl::UnknownError("not run");
};

napi_value Health(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  if (!Args(env, info, argv)) return nullptr;
  auto call = std::make_unique<HealthCall>();
  call->client = ClientOf(env, argv[0]);
  if (call->client == nullptr) return nullptr;
  call->service = GetString(env, argv[1]);
  call->deadline = DeadlineIn(IsNullish(env, argv[2]) ? -1 : Int(env, argv[2]));
  return Start(env, std::move(call), argv[3]);
}

// ---- Regions (dgmm/regions.h).

// A SharedMemoryRegion, shared by its handle and the ArrayBuffers over its
// bytes: the mapping lives until the last of them is collected.
struct RegionBox {
  std::shared_ptr<dgmm::Client> client;  // the region needs its client
  std::shared_ptr<dgmm::SharedMemoryRegion> region;
};

class CreateRegionCall : public Call {
 public:
  std::shared_ptr<dgmm::Client> client;
  size_t bytes = 0;
  std::string name;
  void Run() override { result_ = dgmm::SharedMemoryRegion::Create(*client, bytes, name); }
  std::pair<napi_value, napi_value> Complete(napi_env env) override {
    if (!result_.ok()) return {ErrorValue(env, result_.status()), Undefined(env)};
    auto box = std::make_shared<RegionBox>();
    box->client = client;
    box->region = std::move(*result_);
    napi_value handle = Object(env);
    Set(env, handle, "name", Str(env, box->region->name()));
    Set(env, handle, "size", Num(env, static_cast<double>(box->region->size())));
    Set(env, handle, "registration", MessageToJs(env, box->region->registration()));
    // The bytes, as an ArrayBuffer over the mapping (no copy).
    auto* keep = new std::shared_ptr<RegionBox>(box);
    napi_value buffer;
    if (napi_create_external_arraybuffer(
            env, box->region->bytes(), box->region->size(),
            [](napi_env, void*, void* hint) { delete static_cast<std::shared_ptr<RegionBox>*>(hint); },
            keep, &buffer) != napi_ok) {
      delete keep;
      napi_value error;
      napi_get_and_clear_last_exception(env, &error);
      return {error, Undefined(env)};
    }
    Set(env, handle, "buffer", buffer);
    napi_value external;
    napi_create_external(
        env, new std::shared_ptr<RegionBox>(box),
        [](napi_env, void* d, void*) { delete static_cast<std::shared_ptr<RegionBox>*>(d); },
        nullptr, &external);
    Set(env, handle, "native", external);
    return {Null(env), handle};
  }

 private:
  absl::StatusOr<std::unique_ptr<dgmm::SharedMemoryRegion>> result_ =
      absl::UnknownError("not run");
};

// createRegion(client, bytes, name, callback)
napi_value CreateRegion(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  if (!Args(env, info, argv)) return nullptr;
  auto call = std::make_unique<CreateRegionCall>();
  call->client = ClientOf(env, argv[0]);
  if (call->client == nullptr) return nullptr;
  call->bytes = static_cast<size_t>(GetNumber(env, argv[1], 0));
  call->name = GetString(env, argv[2]);
  return Start(env, std::move(call), argv[3]);
}

class StatusCall : public Call {
 public:
  std::function<absl::Status()> run;
  void Run() override { status_ = run(); }
  std::pair<napi_value, napi_value> Complete(napi_env env) override {
    if (!status_.ok()) return {ErrorValue(env, status_), Undefined(env)};
    return {Null(env), Undefined(env)};
  }

 private:
  absl::Status status_;
};

// unregisterOwnRegion(native, callback): the region's Unregister().
napi_value UnregisterOwnRegion(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  if (!Args(env, info, argv)) return nullptr;
  void* data = nullptr;
  NAPI_OK(napi_get_value_external(env, argv[0], &data));
  std::shared_ptr<RegionBox> box = *static_cast<std::shared_ptr<RegionBox>*>(data);
  auto call = std::make_unique<StatusCall>();
  call->run = [box] { return box->region->Unregister(); };
  return Start(env, std::move(call), argv[1]);
}

class CountCall : public Call {
 public:
  std::function<absl::StatusOr<int>()> run;
  void Run() override { result_ = run(); }
  std::pair<napi_value, napi_value> Complete(napi_env env) override {
    if (!result_.ok()) return {ErrorValue(env, result_.status()), Undefined(env)};
    return {Null(env), Num(env, *result_)};
  }

 private:
  absl::StatusOr<int> result_ = absl::UnknownError("not run");
};

// unregisterRegion(client, name, callback)
napi_value UnregisterRegion(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  if (!Args(env, info, argv)) return nullptr;
  std::shared_ptr<dgmm::Client> client = ClientOf(env, argv[0]);
  if (client == nullptr) return nullptr;
  auto call = std::make_unique<CountCall>();
  call->run = [client, name = GetString(env, argv[1])] {
    return dgmm::UnregisterRegion(*client, name);
  };
  return Start(env, std::move(call), argv[2]);
}

// regionStatus(client, name, callback)
napi_value RegionStatus(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  if (!Args(env, info, argv)) return nullptr;
  std::shared_ptr<dgmm::Client> client = ClientOf(env, argv[0]);
  if (client == nullptr) return nullptr;
  auto call = std::make_unique<MessageCall>();
  call->run = [client, name = GetString(env, argv[1])] {
    return Boxed(dgmm::GetRegionStatus(*client, name));
  };
  return Start(env, std::move(call), argv[2]);
}

// regionSession(client, callback): the session's hello.
napi_value RegionSession(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  if (!Args(env, info, argv)) return nullptr;
  std::shared_ptr<dgmm::Client> client = ClientOf(env, argv[0]);
  if (client == nullptr) return nullptr;
  auto call = std::make_unique<MessageCall>();
  call->run = [client]() -> absl::StatusOr<std::unique_ptr<google::protobuf::Message>> {
    absl::StatusOr<std::shared_ptr<dgmm::LocalSession>> session = client->RegionSession();
    if (!session.ok()) return session.status();
    return std::unique_ptr<google::protobuf::Message>(
        new dgmm::v1::LocalHelloReply((*session)->hello()));
  };
  return Start(env, std::move(call), argv[1]);
}

// multiplyRegion(client, spec, callback); spec: { rows, cols, dtype, layout,
// side, backend, matrix: [name, offset], result: [name, offset], diagonal
// (typed array), right (typed array or null), diagonalDtype, resultDtype,
// timeoutMs }.
class RegionJobCall : public Call {
 public:
  std::shared_ptr<dgmm::Client> client;
  dgmm::RegionJob job;
  void Run() override { result_ = dgmm::MultiplyRegion(*client, job); }
  std::pair<napi_value, napi_value> Complete(napi_env env) override {
    if (!result_.ok()) return {ErrorValue(env, result_.status()), Undefined(env)};
    return {Null(env), MessageToJs(env, result_->stats)};
  }

 private:
  absl::StatusOr<dgmm::JobResult> result_ = absl::UnknownError("not run");
};

napi_value MultiplyRegionJs(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  if (!Args(env, info, argv)) return nullptr;
  auto call = std::make_unique<RegionJobCall>();
  call->client = ClientOf(env, argv[0]);
  if (call->client == nullptr) return nullptr;
  napi_value s = argv[1];
  dgmm::RegionJob& job = call->job;
  auto num = [&](const char* key) { return GetNumber(env, Prop(env, s, key), 0); };
  job.rows = static_cast<int64_t>(num("rows"));
  job.cols = static_cast<int64_t>(num("cols"));
  job.dtype = static_cast<dgmm::v1::DType>(num("dtype"));
  job.layout = static_cast<dgmm::v1::Layout>(num("layout"));
  job.side = static_cast<dgmm::v1::Side>(num("side"));
  job.backend = static_cast<dgmm::v1::Backend>(num("backend"));
  job.diagonal_dtype = static_cast<dgmm::v1::DType>(num("diagonalDtype"));
  job.result_dtype = static_cast<dgmm::v1::DType>(num("resultDtype"));
  auto ref = [&](const char* key) {
    napi_value pair = Prop(env, s, key);
    napi_value name, offset;
    napi_get_element(env, pair, 0, &name);
    napi_get_element(env, pair, 1, &offset);
    return dgmm::MakeRegionRef(GetString(env, name),
                               static_cast<int64_t>(GetNumber(env, offset, 0)));
  };
  job.matrix = ref("matrix");
  job.result = ref("result");
  napi_value d = Prop(env, s, "diagonal");
  std::optional<Bytes> db = TypedBytes(env, d);
  if (!db) return ThrowType(env, "dgmm: the diagonal must be a typed array");
  job.diagonal = db->data;
  job.diagonal_bytes = db->size;
  call->Keep(env, d);
  napi_value r = Prop(env, s, "right");
  if (r != nullptr && !IsNullish(env, r)) {
    std::optional<Bytes> rb = TypedBytes(env, r);
    if (!rb) return ThrowType(env, "dgmm: the right diagonal must be a typed array");
    job.right_diagonal = rb->data;
    job.right_diagonal_bytes = rb->size;
    call->Keep(env, r);
  }
  napi_value t = Prop(env, s, "timeoutMs");
  if (t != nullptr && !IsNullish(env, t)) {
    job.deadline = absl::Now() + absl::Milliseconds(GetNumber(env, t, 0));
  }
  return Start(env, std::move(call), argv[2]);
}

// ---- The policy's pure functions and defaults, for the JS layer and tests.

napi_value TransferModeJs(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  if (!Args(env, info, argv)) return nullptr;
  const dgmm::TransferMode mode = dgmm::ChooseTransferMode(
      Int(env, argv[0]),
      Int(env, argv[1]),
      Int(env, argv[2]),
      Int(env, argv[3]));
  return Str(env, dgmm::TransferModeName(mode));
}

napi_value ChooseStripesJs(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  if (!Args(env, info, argv)) return nullptr;
  return Num(env, dgmm::ChooseStripes(Int(env, argv[0]),
                                      Int(env, argv[1]),
                                      static_cast<int>(GetNumber(env, argv[2], 0))));
}

napi_value SplitLinesJs(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  if (!Args(env, info, argv)) return nullptr;
  const std::vector<dgmm::LineRange> ranges =
      dgmm::SplitLines(Int(env, argv[0]),
                       static_cast<int>(GetNumber(env, argv[1], 1)));
  napi_value list;
  NAPI_OK(napi_create_array_with_length(env, ranges.size(), &list));
  for (size_t i = 0; i < ranges.size(); ++i) {
    napi_value pair;
    napi_create_array_with_length(env, 2, &pair);
    napi_set_element(env, pair, 0, Num(env, static_cast<double>(ranges[i].first_line)));
    napi_set_element(env, pair, 1, Num(env, static_cast<double>(ranges[i].lines)));
    napi_set_element(env, list, i, pair);
  }
  return list;
}

// A policy function of two integers (UnaryThreshold, LinesPerBlock) as a
// JS function of two numbers.
template <int64_t (*F)(int64_t, int64_t)>
napi_value TwoIntegersJs(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  if (!Args(env, info, argv)) return nullptr;
  return Num(env, static_cast<double>(F(Int(env, argv[0]), Int(env, argv[1]))));
}

// parseBackend(name): the Backend enum value, or throws { code, message }.
napi_value ParseBackendJs(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  if (!Args(env, info, argv)) return nullptr;
  absl::StatusOr<dgmm::v1::Backend> backend = dgmm::ParseBackendName(GetString(env, argv[0]));
  if (!backend.ok()) {
    napi_throw(env, ErrorValue(env, backend.status()));
    return nullptr;
  }
  return Num(env, *backend);
}

napi_value PromoteJs(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  if (!Args(env, info, argv)) return nullptr;
  return Num(env, dgmm::PromoteDTypes(static_cast<dgmm::v1::DType>(GetNumber(env, argv[0], 0)),
                                      static_cast<dgmm::v1::DType>(GetNumber(env, argv[1], 0))));
}

// retryDelay(policy, attemptsMade, code, pushbackMs|null, nowMs, deadlineMs,
// jitter, fromServer): ms to wait before the next attempt, or null.
napi_value RetryDelayJs(napi_env env, napi_callback_info info) {
  napi_value argv[8];
  if (!Args(env, info, argv)) return nullptr;
  dgmm::RetryPolicy policy;
  napi_value p = argv[0];
  policy.max_attempts = static_cast<int>(GetNumber(env, Prop(env, p, "maxAttempts"), 4));
  policy.initial_backoff = absl::Milliseconds(GetNumber(env, Prop(env, p, "initialBackoffMs"), 100));
  policy.max_backoff = absl::Milliseconds(GetNumber(env, Prop(env, p, "maxBackoffMs"), 2000));
  policy.backoff_multiplier = GetNumber(env, Prop(env, p, "backoffMultiplier"), 2);
  std::optional<absl::Duration> pushback;
  if (!IsNullish(env, argv[3])) pushback = absl::Milliseconds(GetNumber(env, argv[3], 0));
  const double deadline = GetNumber(env, argv[5], 0);
  bool from_server = true;
  napi_get_value_bool(env, argv[7], &from_server);
  const absl::Time epoch = absl::UnixEpoch();
  std::optional<absl::Duration> wait = dgmm::RetryDelay(
      policy, static_cast<int>(GetNumber(env, argv[1], 1)),
      static_cast<absl::StatusCode>(GetNumber(env, argv[2], 0)),
      from_server ? dgmm::FailureOrigin::kServer : dgmm::FailureOrigin::kTransport, pushback,
      epoch + absl::Milliseconds(GetNumber(env, argv[4], 0)),
      std::isfinite(deadline) ? epoch + absl::Milliseconds(deadline) : absl::InfiniteFuture(),
      GetNumber(env, argv[6], 0));
  if (!wait.has_value()) return Null(env);
  return Num(env, absl::ToDoubleMilliseconds(*wait));
}

napi_value Defaults(napi_env env) {
  const dgmm::ClientOptions options;
  napi_value o = Object(env);
  Set(env, o, "maxUnaryMessageBytes", Num(env, static_cast<double>(options.max_unary_message_bytes)));
  Set(env, o, "chunkBytes", Num(env, static_cast<double>(options.chunk_bytes)));
  Set(env, o, "sameHostMinBytes", Num(env, static_cast<double>(options.same_host_min_bytes)));
  napi_value retry = Object(env);
  Set(env, retry, "maxAttempts", Num(env, options.retry.max_attempts));
  Set(env, retry, "initialBackoffMs", Num(env, absl::ToDoubleMilliseconds(options.retry.initial_backoff)));
  Set(env, retry, "maxBackoffMs", Num(env, absl::ToDoubleMilliseconds(options.retry.max_backoff)));
  Set(env, retry, "backoffMultiplier", Num(env, options.retry.backoff_multiplier));
  Set(env, retry, "maxReconnectWaitMs",
      Num(env, absl::ToDoubleMilliseconds(options.retry.max_reconnect_wait)));
  Set(env, o, "retry", retry);
  Set(env, o, "initialReconnectBackoffMs",
      Num(env, absl::ToDoubleMilliseconds(options.initial_reconnect_backoff)));
  Set(env, o, "minReconnectBackoffMs", Num(env, absl::ToDoubleMilliseconds(options.min_reconnect_backoff)));
  Set(env, o, "maxReconnectBackoffMs", Num(env, absl::ToDoubleMilliseconds(options.max_reconnect_backoff)));
  return o;
}

napi_value Init(napi_env env, napi_value exports) {
  // As dgmm-cli and the Python binding: a process's exit is not held up by
  // gRPC's pollers.
  dgmm::ConfigureGrpcForQuickExit();
  napi_value name = Str(env, "dgmm");
  NAPI_OK(napi_create_threadsafe_function(env, nullptr, nullptr, name, 0, 1, nullptr, nullptr,
                                          nullptr, OnMessage, &g_tsfn));
  NAPI_OK(napi_unref_threadsafe_function(env, g_tsfn));

  napi_property_descriptor client_methods[] = {
      {"close", nullptr, CloseClient, nullptr, nullptr, nullptr, napi_default, nullptr},
  };
  napi_value client_class;
  NAPI_OK(napi_define_class(env, "Client", NAPI_AUTO_LENGTH, NewClient, nullptr, 1, client_methods,
                            &client_class));
  Set(env, exports, "Client", client_class);
  struct Fn {
    const char* name;
    napi_callback cb;
  };
  const Fn functions[] = {
      {"multiply", Multiply},
      {"multiplyBatch", MultiplyBatch},
      {"serverInfo", ServerInfo},
      {"health", Health},
      {"cancelToken", NewCancelToken},
      {"cancel", Cancel},
      {"createRegion", CreateRegion},
      {"unregisterOwnRegion", UnregisterOwnRegion},
      {"unregisterRegion", UnregisterRegion},
      {"regionStatus", RegionStatus},
      {"regionSession", RegionSession},
      {"multiplyRegion", MultiplyRegionJs},
      {"transferMode", TransferModeJs},
      {"chooseStripes", ChooseStripesJs},
      {"splitLines", SplitLinesJs},
      {"unaryThreshold", TwoIntegersJs<dgmm::UnaryThreshold>},
      {"linesPerBlock", TwoIntegersJs<dgmm::LinesPerBlock>},
      {"parseBackend", ParseBackendJs},
      {"promoteDtypes", PromoteJs},
      {"retryDelay", RetryDelayJs},
  };
  for (const Fn& f : functions) {
    napi_value fn;
    NAPI_OK(napi_create_function(env, f.name, NAPI_AUTO_LENGTH, f.cb, nullptr, &fn));
    Set(env, exports, f.name, fn);
  }
  Set(env, exports, "defaults", Defaults(env));
  return exports;
}

}  // namespace

NAPI_MODULE(NODE_GYP_MODULE_NAME, Init)
