// verify_chains: the one kernel skeleton of every chain verifier (the CPU's
// specdec_np._core.verify_chains driver), instantiated per row functor and dtype pair.
#include "generated/contract.cuh"
#include "elementwise.h"
#include "chain_rows.cuh"
#include "generated/chain_rows.cuh"

// The one kernel of every verifier, with the arguments of specdec_np._core.verify_chains:
// target_rows [T + B, V], draft_rows [T, V] or nullptr (point-mass drafts), draft_token_ids
// [T], bonus_token_ids [B], draft_offsets [B + 1], uniforms [B, uniform_width] (read by
// stochastic rows and lazy bonuses only), parameters [P]; outputs output [B, width],
// accepted_lengths, num_accepted and row_status [B]; then the engine layout's options:
// request_methods [B] (registry codes, read by MixedRow; nullptr otherwise), causal
// (stop at the first rejection), draw_bonus (a fully accepted request draws its bonus from
// its bonus row with uniform k_b + 1, its argmax for a greedy request; bonus ids unread),
// sampling [B, 5] (the rows are logits: temperature, top-k, top-p, min-p, filter order;
// nullptr for probabilities) and scratch [B, 2 V] (two processed rows per request; with sampling only),
// target_logits and draft_logits (with sampling: which rows are logits, the others are
// probabilities used as they are) and bonus_rows (0: the target holds no bonus rows, [T, V],
// and the bonus ids are given). Request b owns drafts draft_offsets[b] .. draft_offsets[b+1]
// and the k_b + 1 target rows from draft_offsets[b] + b (k_b from draft_offsets[b] without
// bonus rows). Then the sampling surface's settings of the logits rows (each pointer nullptr:
// none; specdec_np._layouts.row_adjustments.RowAdjustments, the CPU driver's
// target_adjustments and draft_adjustments): per rows array a bitmask [rows, mask_words]
// int32, entry offsets [rows + 1] and the entries' ids and values, applied where a row is
// read (law_row), and adjusted [B, 2 V] (two adjusted rows per request; with any setting).
// Launch: grid B, block kBlock. A request whose code names no
// registry verifier (a MixedRow launch's request_methods; the launcher trusts them) gets row
// status kStatusBadMethod and nothing else of it is read or written.
template <class Row, typename ProbT, typename IdT>
__global__ void __launch_bounds__(specdec::kBlock, 1)
verify_chains_kernel(const ProbT* __restrict__ target_rows, const ProbT* __restrict__ draft_rows,
                     const IdT* __restrict__ draft_token_ids,
                     const IdT* __restrict__ bonus_token_ids,
                     const long long* __restrict__ draft_offsets,
                     const double* __restrict__ uniforms, long long uniform_width,
                     const double* __restrict__ parameters, long long batch, long long num_drafts,
                     long long vocab, long long width, long long* __restrict__ output,
                     long long* __restrict__ accepted_lengths,
                     long long* __restrict__ num_accepted, long long* __restrict__ row_status,
                     const signed char* __restrict__ request_methods, long long causal,
                     long long draw_bonus, const double* __restrict__ sampling,
                     ProbT* scratch, long long target_logits, long long draft_logits,
                     long long bonus_rows, const int* __restrict__ target_mask,
                     const long long* __restrict__ target_entry_offsets,
                     const long long* __restrict__ target_entry_ids,
                     const ProbT* __restrict__ target_entry_values,
                     const int* __restrict__ draft_mask,
                     const long long* __restrict__ draft_entry_offsets,
                     const long long* __restrict__ draft_entry_ids,
                     const ProbT* __restrict__ draft_entry_values, long long mask_words,
                     ProbT* adjusted) {
    __shared__ specdec::Scratch scratch_space;
    specdec::Scratch& shared = scratch_space;
    const long long b = blockIdx.x;
    if (b >= batch) return;
    const int t = threadIdx.x;
    constexpr int kRowCode = VerifierCode<Row>::value;
    const int method = kRowCode >= 0 ? kRowCode
                       : request_methods != nullptr ? static_cast<int>(request_methods[b])
                                                    : -1;
    if (method < 0 || method >= specdec::kVerifiers) {
        if (t == 0) row_status[b] = specdec::kStatusBadMethod;
        return;
    }
    const bool lazy_bonus = draw_bonus != 0;
    const bool reads_uniforms = specdec::kReadsUniforms[method] || lazy_bonus;
    // The layouts write consistent offsets; clamping them only guarantees that a direct
    // caller's inconsistent ones never make a block read or write outside the arrays.
    const long long start = specdec::clamp_ll(draft_offsets[b], 0, num_drafts);
    const long long stop = specdec::clamp_ll(draft_offsets[b + 1], start, num_drafts);
    long long most = width - 1;
    if (reads_uniforms) most = specdec::min_ll(most, uniform_width - 1 - (lazy_bonus ? 1 : 0));
    const long long k = specdec::clamp_ll(stop - start, 0, most < 0 ? 0 : most);
    const IdT* ids = draft_token_ids + start;
    // A lazy bonus is drawn, not read: its id is neither checked nor used.
    const long long bonus = lazy_bonus ? 0 : static_cast<long long>(bonus_token_ids[b]);

    // Ids first (column k_b is the bonus id).
    const long long bad = specdec::start_request(ids, k, bonus, true, vocab, shared);
    if (bad != specdec::kNone) {
        if (t == 0) row_status[b] = 1 + bad;
        return;
    }

    const long long target_first = start + (bonus_rows != 0 ? b : 0);
    const bool target_read = sampling != nullptr && target_logits != 0;
    const bool draft_read = sampling != nullptr && draft_logits != 0 && draft_rows != nullptr;
    // Settings apply to logits rows only, as on the CPU (probabilities are used as given).
    const specdec::RowAdjust<ProbT> target_adjust = specdec::request_adjust(
        target_read, target_mask, target_entry_offsets, target_entry_ids, target_entry_values,
        mask_words, target_first);
    const specdec::RowAdjust<ProbT> draft_adjust = specdec::request_adjust(
        draft_read, draft_mask, draft_entry_offsets, draft_entry_ids, draft_entry_values,
        mask_words, start);
    const specdec::RowArgs<ProbT, IdT> args{
        target_rows + target_first * vocab,
        draft_rows != nullptr ? draft_rows + start * vocab : nullptr,
        ids,
        bonus,
        reads_uniforms ? uniforms + b * uniform_width : nullptr,
        parameters,
        k,
        vocab,
        method,
        causal != 0,
        sampling != nullptr ? sampling + 5 * b : nullptr,
        sampling != nullptr ? scratch + b * 2 * vocab : nullptr,
        target_read,
        sampling != nullptr && draft_logits != 0,
        target_adjust,
        draft_adjust,
        adjusted != nullptr ? adjusted + b * 2 * vocab : nullptr,
    };
    specdec::RowResult result = Row::run(args, shared);
    if (lazy_bonus && result.status == 0 && result.accepted_length == k) {
        // The bonus row is read only now that every draft was accepted (uniform branch).
        if (specdec::kBonusByArgmax[method]) {
            double best;
            long long best_index;
            double unused;
            // The bonus row as the sampling surface adjusts it (a greedy request's argmax).
            const ProbT* row = specdec::law_row(args, shared, k, false);
            specdec::row_argmax_entropy<false>(row, vocab, best, best_index, unused,
                                               shared.reduce);
            result.last_token = specdec::argmax_or_zero(best, best_index);
        } else {
            const ProbT* p = specdec::processed_row(args, shared, k, false);
            result.last_token = specdec::draw_row(p, vocab, args.uniforms[k + 1], shared.draw);
            if (result.last_token < 0) result.status = -(1 + k);
        }
    }
    if (result.status == 0) {
        long long* out = output + b * width;
        const long long r = result.accepted_length;
        for (long long j = t; j < width; j += specdec::kBlock) {
            out[j] = j < r ? static_cast<long long>(ids[j]) : (j == r ? result.last_token : -1LL);
        }
    }
    if (t == 0) {
        accepted_lengths[b] = result.accepted_length;
        num_accepted[b] = result.num_accepted;
        row_status[b] = result.status;
    }
}
