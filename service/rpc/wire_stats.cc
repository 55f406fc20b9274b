#include "service/rpc/wire_stats.h"

#include "service/core/validator.h"

namespace dgmm {

v1::JobStats ToWire(const JobStats& stats) {
  v1::JobStats w;
  if (stats.backend.has_value()) w.set_backend(WireBackend(*stats.backend));
  w.set_device(stats.device);
  w.set_device_index(stats.device_index);
  w.set_queue_wait_ns(stats.queue_wait_ns);
  w.set_h2d_ns(stats.h2d_ns);
  w.set_compute_ns(stats.compute_ns);
  w.set_d2h_ns(stats.d2h_ns);
  w.set_total_ns(stats.total_ns);
  w.set_bytes_in(stats.bytes_in);
  w.set_bytes_out(stats.bytes_out);
  w.set_job_id(stats.job_id);
  if (stats.group.has_value()) {
    v1::JobGroup* g = w.mutable_group();
    g->set_id(stats.group->id);
    g->set_first_line(stats.group->first_line);
    g->set_total_lines(stats.group->total_lines);
    g->set_parts(stats.group->parts);
  }
  if (stats.trace.has_value()) {
    w.set_trace_id(stats.trace->parent.trace_id_hex());
    w.set_parent_span_id(stats.trace->parent.span_id_hex());
    w.set_span_id(ToHex(stats.trace->span_id));
  }
  return w;
}

}  // namespace dgmm
