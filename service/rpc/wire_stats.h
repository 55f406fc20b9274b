// A job's stats (service/core/job_stats.h) as the wire's JobStats.
#ifndef DGMM_SERVICE_RPC_WIRE_STATS_H_
#define DGMM_SERVICE_RPC_WIRE_STATS_H_

#include "dgmm/v1/dgmm.pb.h"
#include "service/core/job_stats.h"

namespace dgmm {

v1::JobStats ToWire(const JobStats& stats);

}  // namespace dgmm

#endif  // DGMM_SERVICE_RPC_WIRE_STATS_H_
