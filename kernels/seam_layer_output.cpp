// See kernels/seams.h.
#include "kernels/seams.h"

namespace ls::seams {

void cuda_layer_output(int32_t, float*, int32_t, int32_t, cudaStream_t) {}

}  // namespace ls::seams
