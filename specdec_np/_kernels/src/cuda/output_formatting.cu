// create_output: vLLM's _create_output on the device, one thread per row.
#include "generated/contract.cuh"

// vLLM's _create_output, with the ids checked as specdec_np._core.create_output does. Row b:
// r = the first position whose `accepted` is 0 (k if none); output[b] = the draft ids before
// r, then substitute[b, r] (r < k) or bonus[b], then -1; accepted_lengths[b] = r,
// num_accepted[b] = the non-zero entries of accepted[b] (after r too), row_status[b] = 0.
// Draft and bonus ids are all checked against [0, vocab), the substitute id where it is
// emitted; a bad one only sets row_status[b] = 1 + column (draft i < k, bonus k, substitute
// k + 1 + r). Launch: grid ceil(B / kRowsPerBlock), block kRowsPerBlock; one thread per row.
template <typename IdT>
__global__ void __launch_bounds__(specdec::kRowsPerBlock)
create_output_kernel(const unsigned char* __restrict__ accepted,
                     const IdT* __restrict__ substitute_token_ids,
                     const IdT* __restrict__ draft_token_ids,
                     const IdT* __restrict__ bonus_token_ids, long long batch, long long k,
                     long long vocab, long long* __restrict__ output,
                     long long* __restrict__ accepted_lengths,
                     long long* __restrict__ num_accepted, long long* __restrict__ row_status) {
    const long long b = (long long)blockIdx.x * specdec::kRowsPerBlock + threadIdx.x;
    if (b >= batch) return;
    const unsigned char* passed = accepted + b * k;
    const IdT* draft = draft_token_ids + b * k;
    for (long long j = 0; j <= k; ++j) {
        const long long id = j < k ? static_cast<long long>(draft[j])
                                   : static_cast<long long>(bonus_token_ids[b]);
        if (id < 0 || id >= vocab) {
            row_status[b] = 1 + j;
            return;
        }
    }
    long long r = k;
    long long count = 0;
    for (long long i = 0; i < k; ++i) {
        if (passed[i] != 0) {
            ++count;
        } else if (r == k) {
            r = i;
        }
    }
    const long long last = r < k ? static_cast<long long>(substitute_token_ids[b * k + r])
                                 : static_cast<long long>(bonus_token_ids[b]);
    if (r < k && (last < 0 || last >= vocab)) {
        row_status[b] = 1 + k + 1 + r;
        return;
    }
    long long* out = output + b * (k + 1);
    for (long long j = 0; j <= k; ++j) {
        out[j] = j < r ? static_cast<long long>(draft[j]) : (j == r ? last : -1LL);
    }
    accepted_lengths[b] = r;
    num_accepted[b] = count;
    row_status[b] = 0;
}
