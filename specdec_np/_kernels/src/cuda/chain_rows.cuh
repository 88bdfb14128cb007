// The registry's chain row functors, one per Verifier.cuda_row: the row work of one request
// in the one kernel skeleton of chain_driver.cu (which checks its ids first and writes its
// output row after). run is called by every thread of the block, which all receive the same
// RowResult. What the skeleton needs to know of each verifier (whether it reads uniforms,
// how a lazy bonus is chosen) comes from its registry entry, in tables that
// specdec_np/_kernels/cuda.py generates; each verifier's scalar decision is elementwise.h's.
#include "inverse_cdf_draws.cuh"
#include "row_readers.cuh"

// Token-wise rejection sampling: position i passes iff u_i * q_i(x_i) < p_i(x_i) (float64).
// Probability rows: every position is tested in parallel (vLLM counts them all; causal
// counting keeps the prefix). Logits rows: positions in order, each reading its row's law,
// stopping at the first failure when causal. At the first failure r a token is drawn from
// max(p_r - q_r, 0), from p_r when that has no mass. Only row r is read for the draw.
struct RejectionRow {
    template <typename ProbT, typename IdT>
    __device__ static specdec::RowResult run(const specdec::RowArgs<ProbT, IdT>& a,
                                             specdec::Scratch& s) {
        long long r = a.k;
        long long passed = 0;
        if (!specdec::any_logits(a)) {
            if (threadIdx.x == 0) {
                s.first_reject = a.k;
                s.passed = 0ULL;
            }
            __syncthreads();
            for (long long i = threadIdx.x; i < a.k; i += specdec::kBlock) {
                if (a.uniforms[i] * specdec::draft_probability(a, i) <
                    specdec::target_probability(a, i)) {
                    atomicAdd(&s.passed, 1ULL);
                } else {
                    atomicMin(&s.first_reject, i);
                }
            }
            __syncthreads();
            r = s.first_reject;
            passed = a.causal ? r : static_cast<long long>(s.passed);
        } else {
            for (long long i = 0; i < a.k; ++i) {  // uniform loop: the same path in every thread
                const double p_x = specdec::target_p(a, s, i);
                const double q_x = specdec::draft_p(a, s, i);
                if (a.uniforms[i] * q_x < p_x) {
                    ++passed;
                } else if (r == a.k) {
                    r = i;
                    if (a.causal) break;
                }
            }
        }
        specdec::RowResult result{a.bonus_id, r, passed, 0};
        if (r == a.k) return result;
        const ProbT* p = specdec::processed_row(a, s, r, false);
        const ProbT* q = specdec::processed_row(a, s, r, true);
        result.last_token = specdec::draw_residual(p, q, static_cast<long long>(a.draft_ids[r]),
                                                   1.0, a.vocab, a.uniforms[a.k], s.draw);
        if (result.last_token < 0) result.status = -(1 + r);
        return result;
    }
};

// Block verification (Sun et al.): rho_0 = 1, rho_i = specdec_next_block_weight(rho_{i-1},
// p(x), q(x)) in float64; h_k = rho_k and, for i < k, h_i = specdec_block_check(Z_i, rho_i)
// with Z_i the weighted residual mass. tau is the largest i with eta_i < h_i: scanning down
// from k stops there, so no row below tau is read. Then a draw from
// max(rho_tau p_tau - q_tau, 0), from p_tau when that has no mass.
struct BlockVerificationRow {
    // rho_i, recomputed forward in one fixed order (the CPU kernel's): the scan needs it at a
    // few positions only, and a row read costs far more than these i scalars. With logits
    // p(x_j) and q(x_j) come from s.path when the chain is short enough to keep them (each
    // costs a pass over its row), else from the rows again.
    template <typename ProbT, typename IdT>
    __device__ static double rho(const specdec::RowArgs<ProbT, IdT>& a, specdec::Scratch& s,
                                 long long i, bool from_path) {
        double value = 1.0;
        for (long long j = 0; j < i; ++j) {
            if (from_path) {
                value = specdec_next_block_weight(value, s.path_p[j], s.path_q[j]);
            } else if (!specdec::any_logits(a)) {
                value = specdec_next_block_weight(value, specdec::target_probability(a, j),
                                                  specdec::draft_probability(a, j));
            } else {
                const double p = specdec::target_p(a, s, j);
                value = specdec_next_block_weight(value, p, specdec::draft_p(a, s, j));
            }
        }
        return value;
    }

    template <typename ProbT, typename IdT>
    __device__ static specdec::RowResult run(const specdec::RowArgs<ProbT, IdT>& a,
                                             specdec::Scratch& s) {
        const bool from_path = specdec::any_logits(a) && a.k <= specdec::kPathStack;
        if (from_path) {
            for (long long j = 0; j < a.k; ++j) {
                const double p = specdec::target_p(a, s, j);
                const double q = specdec::draft_p(a, s, j);
                if (threadIdx.x == 0) {
                    s.path_p[j] = p;
                    s.path_q[j] = q;
                }
            }
            __syncthreads();
        }
        long long tau = 0;
        for (long long i = a.k; i >= 1; --i) {  // uniform loop: every thread takes the same path
            const double rho_i = rho(a, s, i, from_path);
            double h = rho_i;  // h_k = rho_k; rho_i = 1 gives h_i = 1, rho_i = 0 gives 0 unread
            if (i < a.k && rho_i < 1.0 && rho_i != 0.0) {
                const ProbT* p = specdec::processed_row(a, s, i, false);
                const ProbT* q = specdec::processed_row(a, s, i, true);
                const double total = specdec::residual_sum(
                    p, q, static_cast<long long>(a.draft_ids[i]), rho_i, a.vocab, s.draw);
                h = specdec_block_check(total, rho_i);
            }
            if (a.uniforms[i - 1] < h) {
                tau = i;
                break;
            }
        }
        specdec::RowResult result{a.bonus_id, tau, tau, 0};
        if (tau == a.k) return result;
        const double rho_tau = rho(a, s, tau, from_path);
        const ProbT* p = specdec::processed_row(a, s, tau, false);
        const ProbT* q = specdec::processed_row(a, s, tau, true);
        result.last_token = specdec::draw_residual(
            p, q, static_cast<long long>(a.draft_ids[tau]), rho_tau, a.vocab, a.uniforms[a.k],
            s.draw);
        if (result.last_token < 0) result.status = -(1 + tau);
        return result;
    }
};

// The decision scan shared by the deterministic verifiers: position i passes when
// p_i(x_i) > shortcut without reading its row; otherwise one coalesced pass finds the row's
// argmax (first index on ties, NaN ignored, 0 if nothing is above -inf) and, WithEntropy,
// sum_y p ln(p + eps), and passes(p_x, x, argmax, plogp) decides. Raw: the rows are read as
// they are, adjusted where the sampling surface's settings touch them (greedy: the argmax
// of logits is the argmax at any temperature); otherwise
// through the law of a logits row. Every position is decided (the counters need all of
// them) unless counting is causal; at the first failure the argmax is emitted.
template <bool WithEntropy, bool Raw, typename ProbT, typename IdT, typename Passes>
__device__ specdec::RowResult decide_positions(const specdec::RowArgs<ProbT, IdT>& a,
                                               specdec::Scratch& s, double shortcut,
                                               const Passes& passes) {
    specdec::RowResult result{a.bonus_id, a.k, 0, 0};
    for (long long i = 0; i < a.k; ++i) {  // uniform loop: every thread takes the same path
        const double p_x = Raw ? specdec::target_probability(a, i) : specdec::target_p(a, s, i);
        if (p_x > shortcut) {
            ++result.num_accepted;
            continue;
        }
        double best;
        long long best_index;
        double plogp;
        // Raw: the row as it is, or as the sampling surface adjusts it (a greedy request
        // takes the argmax after masks, bias and penalties).
        const ProbT* row =
            Raw ? specdec::law_row(a, s, i, false) : specdec::processed_row(a, s, i, false);
        specdec::row_argmax_entropy<WithEntropy>(row, a.vocab, best, best_index, plogp,
                                                 s.reduce);
        const long long argmax = specdec::argmax_or_zero(best, best_index);
        if (passes(p_x, static_cast<long long>(a.draft_ids[i]), argmax, plogp)) {
            ++result.num_accepted;
        } else if (result.accepted_length == a.k) {
            result.accepted_length = i;
            result.last_token = argmax;
            if (a.causal) break;
        }
    }
    return result;
}

// Typical acceptance (Medusa): position i passes iff
// p_i(x_i) > min(threshold, alpha * exp(-H_i)), H_i = -sum_y p_i(y) ln(p_i(y) + eps) (double
// accumulation); p > threshold passes unread (the minimum never exceeds it), and a NaN
// entropy never passes. parameters = (posterior_threshold, posterior_alpha). Rows need not
// be normalised.
struct TypicalAcceptanceRow {
    template <typename ProbT, typename IdT>
    __device__ static specdec::RowResult run(const specdec::RowArgs<ProbT, IdT>& a,
                                             specdec::Scratch& s) {
        const double posterior_threshold = a.parameters[0];
        const double posterior_alpha = a.parameters[1];
        auto passes = [&](double p_x, long long, long long, double plogp) {
            return p_x > specdec_typical_threshold(plogp, posterior_alpha, posterior_threshold);
        };
        return decide_positions<true, false>(a, s, posterior_threshold, passes);
    }
};

// Greedy verification: position i passes iff x_i is the first index of the maximum of its
// raw row. For probability rows p_i(x_i) > 0.5 + kGreedyMargin passes unread (the unique
// argmax of a probability row, the input contract); logits rows have no such shortcut.
struct GreedyRow {
    template <typename ProbT, typename IdT>
    __device__ static specdec::RowResult run(const specdec::RowArgs<ProbT, IdT>& a,
                                             specdec::Scratch& s) {
        auto passes = [](double, long long x, long long argmax, double) { return x == argmax; };
        const double shortcut =
            !a.target_logits ? 0.5 + specdec::kGreedyMargin : specdec::infinity();
        return decide_positions<false, true>(a, s, shortcut, passes);
    }
};
