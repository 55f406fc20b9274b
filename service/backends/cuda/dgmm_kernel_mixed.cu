// The diagonal-product kernel for A narrower than C (NumPy's promotion:
// dgmm_kernel_impl.cuh, ScaleTile in dgmm_kernel.h).
#include "service/backends/cuda/dgmm_kernel_impl.cuh"

namespace dgmm::cuda {

DGMM_INSTANTIATE_SCALE_KERNEL(Half, float);
DGMM_INSTANTIATE_SCALE_KERNEL(Half, double);
DGMM_INSTANTIATE_SCALE_KERNEL(Half, Complex64);
DGMM_INSTANTIATE_SCALE_KERNEL(Half, Complex128);
DGMM_INSTANTIATE_SCALE_KERNEL(BFloat16, float);
DGMM_INSTANTIATE_SCALE_KERNEL(BFloat16, double);
DGMM_INSTANTIATE_SCALE_KERNEL(BFloat16, Complex64);
DGMM_INSTANTIATE_SCALE_KERNEL(BFloat16, Complex128);
DGMM_INSTANTIATE_SCALE_KERNEL(float, double);
DGMM_INSTANTIATE_SCALE_KERNEL(float, Complex64);
DGMM_INSTANTIATE_SCALE_KERNEL(float, Complex128);
DGMM_INSTANTIATE_SCALE_KERNEL(double, Complex128);
DGMM_INSTANTIATE_SCALE_KERNEL(Complex64, Complex128);

}  // namespace dgmm::cuda
