// The diagonal-product kernel for float and double (the DeviceTile API of
// the engine, and ScaleTile's float and double instantiations), and the
// run-time dispatch of AnyScaleTile. The kernel itself is in
// dgmm_kernel_impl.cuh; the other types are instantiated in
// dgmm_kernel_types.cu and dgmm_kernel_mixed.cu.
#include "service/backends/cuda/dgmm_kernel_impl.cuh"

namespace dgmm::cuda {
namespace {

// A one-sided DeviceTile is a ScaleTile with one diagonal.
template <typename T>
ScaleTile<T, T> AsScaleTile(const DeviceTile<T>& t) {
  return ScaleTile<T, T>{.in = t.in,
                         .out = t.out,
                         .left = t.diag,
                         .right = nullptr,
                         .left_per_line = t.per_line,
                         .lines = t.lines,
                         .line_len = t.line_len};
}

template <typename TA, typename TC>
cudaError_t LaunchAny(const AnyScaleTile& t, int multiprocessors, cudaStream_t stream) {
  using K = Compute<TC>;
  const ScaleTile<TA, TC> tile{.in = static_cast<const TA*>(t.in),
                               .out = static_cast<TC*>(t.out),
                               .left = static_cast<const K*>(t.left),
                               .right = static_cast<const K*>(t.right),
                               .left_per_line = t.left_per_line,
                               .lines = t.lines,
                               .line_len = t.line_len};
  return LaunchScaleKernel(tile, multiprocessors, stream);
}

template <typename TC>
cudaError_t WithIn(const AnyScaleTile& t, int sms, cudaStream_t stream) {
  constexpr Scalar c = ScalarOf<TC>::value;
  switch (t.in_type) {
    case Scalar::kFloat16:
      if constexpr (KernelSupports(Scalar::kFloat16, c)) return LaunchAny<Half, TC>(t, sms, stream);
      break;
    case Scalar::kBFloat16:
      if constexpr (KernelSupports(Scalar::kBFloat16, c))
        return LaunchAny<BFloat16, TC>(t, sms, stream);
      break;
    case Scalar::kFloat32:
      if constexpr (KernelSupports(Scalar::kFloat32, c)) return LaunchAny<float, TC>(t, sms, stream);
      break;
    case Scalar::kFloat64:
      if constexpr (KernelSupports(Scalar::kFloat64, c)) return LaunchAny<double, TC>(t, sms, stream);
      break;
    case Scalar::kComplex64:
      if constexpr (KernelSupports(Scalar::kComplex64, c))
        return LaunchAny<Complex64, TC>(t, sms, stream);
      break;
    case Scalar::kComplex128:
      if constexpr (KernelSupports(Scalar::kComplex128, c))
        return LaunchAny<Complex128, TC>(t, sms, stream);
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace

template <typename T>
LaunchPolicy ChooseLaunchPolicy(const DeviceTile<T>& tile, int multiprocessors) {
  return ChooseScalePolicy(AsScaleTile(tile), multiprocessors);
}

template <typename T>
cudaError_t LaunchDgmmKernel(const DeviceTile<T>& tile, const LaunchPolicy& policy,
                             cudaStream_t stream) {
  if (tile.lines <= 0 || tile.line_len <= 0) return cudaSuccess;
  return LaunchScaleKernel(AsScaleTile(tile), policy, stream);
}

template <typename T>
cudaError_t LaunchDgmmKernel(const DeviceTile<T>& tile, int multiprocessors,
                             cudaStream_t stream) {
  return LaunchDgmmKernel(tile, ChooseLaunchPolicy(tile, multiprocessors), stream);
}

cudaError_t LaunchScaleKernel(const AnyScaleTile& t, int sms, cudaStream_t stream) {
  switch (t.out_type) {
    case Scalar::kFloat16: return WithIn<Half>(t, sms, stream);
    case Scalar::kBFloat16: return WithIn<BFloat16>(t, sms, stream);
    case Scalar::kFloat32: return WithIn<float>(t, sms, stream);
    case Scalar::kFloat64: return WithIn<double>(t, sms, stream);
    case Scalar::kComplex64: return WithIn<Complex64>(t, sms, stream);
    case Scalar::kComplex128: return WithIn<Complex128>(t, sms, stream);
  }
  return cudaErrorInvalidValue;
}

DGMM_INSTANTIATE_SCALE_KERNEL(float, float);
DGMM_INSTANTIATE_SCALE_KERNEL(double, double);

template LaunchPolicy ChooseLaunchPolicy<float>(const DeviceTile<float>&, int);
template LaunchPolicy ChooseLaunchPolicy<double>(const DeviceTile<double>&, int);
template cudaError_t LaunchDgmmKernel<float>(const DeviceTile<float>&, const LaunchPolicy&,
                                             cudaStream_t);
template cudaError_t LaunchDgmmKernel<double>(const DeviceTile<double>&, const LaunchPolicy&,
                                              cudaStream_t);
template cudaError_t LaunchDgmmKernel<float>(const DeviceTile<float>&, int, cudaStream_t);
template cudaError_t LaunchDgmmKernel<double>(const DeviceTile<double>&, int, cudaStream_t);

}  // namespace dgmm::cuda
