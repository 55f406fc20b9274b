// The diagonal-product kernel for the half and complex types, same type in
// and out (dgmm_kernel_impl.cuh; its own file so that nvcc compiles the
// instantiations in parallel with the others).
#include "service/backends/cuda/dgmm_kernel_impl.cuh"

namespace dgmm::cuda {

DGMM_INSTANTIATE_SCALE_KERNEL(Half, Half);
DGMM_INSTANTIATE_SCALE_KERNEL(BFloat16, BFloat16);
DGMM_INSTANTIATE_SCALE_KERNEL(Complex64, Complex64);
DGMM_INSTANTIATE_SCALE_KERNEL(Complex128, Complex128);

}  // namespace dgmm::cuda
