// processed_rows: the processed law of logits rows, materialised (specdec_np.processed_probs
// on the device), with the law functions every row reader uses: the bits the verifiers
// draw from.
#include "generated/contract.cuh"
#include "elementwise.h"
#include "logits_law.cuh"

// logits [rows, V], sampling [rows, 5] (temperature > 0, top-k, top-p, min-p, filter
// order; top-k 0 = off); out [rows, V] in the logits' dtype: row i's law, all zeros for a row without a
// finite maximum. Launch: grid rows, block kBlock (one block per row).
template <typename ProbT>
__global__ void __launch_bounds__(specdec::kBlock, 1)
processed_rows_kernel(const ProbT* __restrict__ logits, long long rows, long long vocab,
                      const double* __restrict__ sampling, ProbT* __restrict__ out) {
    __shared__ specdec::Scratch shared;
    const long long i = blockIdx.x;
    if (i >= rows) return;
    const ProbT* row = logits + i * vocab;
    const double* settings = sampling + 5 * i;
    const ProbT temperature = static_cast<ProbT>(settings[0]);
    const specdec_row_law law = specdec::row_law(row, vocab, temperature,
                                                 static_cast<long long>(settings[1]),
                                                 settings[2], settings[3],
                                                 static_cast<int>(settings[4]), shared);
    ProbT* destination = out + i * vocab;
    for (long long y = threadIdx.x; y < vocab; y += specdec::kBlock) {
        destination[y] = specdec::materialised(row, y, temperature, law);
    }
}
