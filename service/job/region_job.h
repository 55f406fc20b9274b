// A MultiplyRegion job apart from gRPC: the intake resolves its regions and
// spans, a JobSession admits it, and its one tile runs through the job's
// ComputeStage straight between the client's memory (matrix span in, result
// span out). Host memory that is not pinned goes through the device's own
// pinned staging, so a first job needs no pinning; the registry pins a region
// once it is reused (RegionRegistry::NoteJob). A job in the client's own
// memory (RegionRef.process_address, service/regions/process_memory.h) has
// no regions: its tile carries the ProcessMemory the backends copy through,
// after the client's cookie is checked once more.
//
//   Begin -- intake (served, header, sources, fits, payload) --> session.Start
//                                     admitted (worker, or the caller's thread
//                                     for a small CPU job): Use regions, ProcessTile,
//                                     check intact, End; the regions and the
//                                     reservation go back; then Finish
//
// The RPC layer (service/rpc/region_reactors.cc) implements RegionIo.
// gRPC-free.
#ifndef DGMM_SERVICE_JOB_REGION_JOB_H_
#define DGMM_SERVICE_JOB_REGION_JOB_H_

#include <memory>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "dgmm/v1/dgmm.pb.h"
#include "service/job/intake.h"
#include "service/job/session.h"
#include "service/regions/region_registry.h"

namespace dgmm {

class RegionIo {
 public:
  virtual ~RegionIo() = default;
  // Ends the call (once); OK replies with `stats`.
  virtual void Finish(const absl::Status& status, const JobStats& stats) = 0;
};

class RegionJob final : public std::enable_shared_from_this<RegionJob> {
 public:
  // `registry` (null: regions off) must outlive the job.
  RegionJob(std::shared_ptr<JobSession> session, const Intake* intake, RegionRegistry* registry,
            RegionIo* io)
      : session_(std::move(session)), intake_(intake), registry_(registry), io_(io) {}

  // `request` (decoded: how its parse went), the caller's registry key and
  // its own memory when its session was granted it (else null).
  void Begin(const v1::MultiplyRegionRequest& request, const absl::Status& decoded,
             const std::string& owner,
             std::shared_ptr<const ProcessMemory> process_memory = nullptr);
  void OnCancel() { session_->Cancel(); }
  // gRPC is done with the call: io is not used again.
  void Detach();

 private:
  void Run(absl::StatusOr<std::shared_ptr<ComputeStage>> admitted);
  void Finish(const absl::Status& s, const JobStats& stats = {});
  // Lets go of the regions before a refusal is answered.
  void ReleaseRegions();

  const std::shared_ptr<JobSession> session_;
  const Intake* const intake_;
  RegionRegistry* const registry_;
  // Set by Begin, owned by the job's worker after admission.
  IntakenJob job_;
  // With DGMM_TRACE_JOBS=1: when Begin started and ended, Run started, the
  // tile was done, the job ended and its stage (and reservation) went.
  struct Trace {
    absl::Time begin, begun, run, checked, tile, ended, released;
  } trace_;
  std::mutex mu_;
  RegionIo* io_ ABSL_GUARDED_BY(mu_);  // null once finished or detached
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_JOB_REGION_JOB_H_
