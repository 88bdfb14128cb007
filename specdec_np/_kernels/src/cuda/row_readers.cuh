// One request as the row functors and tree steps see it, and how they read its rows:
// probability rows as they are, logits rows through their row's processed law (computed
// once per row read, as the CPU driver caches it; materialised into the request's scratch
// rows where a whole row is scanned). A logits row that the sampling surface adjusts is read
// adjusted (law_row), as the CPU driver's logits_row reads it.
#include "logits_law.cuh"

namespace specdec {
// The sampling surface's settings of one rows array of a request, as the CPU chain driver
// takes them (specdec_np._layouts.row_adjustments.RowAdjustments), offset to the request's
// first row: per row an optional bitmask row of `words` int32 (bit j of word w allows token
// 32 w + j; nullptr: every token allowed) and the entries offsets[i] .. offsets[i + 1] of
// ids and values (absolute indices; offsets nullptr: none), the final values written over
// the masked row.
template <typename ProbT>
struct RowAdjust {
    const int* bitmask;
    long long words;
    const long long* offsets;
    const long long* ids;
    const ProbT* values;
};

// One request as a row functor sees it: its k + 1 target rows (row stride vocab), its k draft
// rows (nullptr for point-mass drafts), its k draft ids (checked against vocab), its bonus
// id, its uniforms (k + 1, or k + 2 with a lazy bonus; nullptr when nothing is drawn) and
// the parameters; its verifier's registry code (MixedRow dispatches on it), whether
// counting stops at the first rejection, and for logits rows its sampling parameters
// (temperature, top-k, top-p, min-p; nullptr for probability rows) and its two scratch rows
// of vocab entries (the processed target and draft row being read); with them, which rows
// are logits (any target form with any draft form: the others are probabilities used as
// they are).
template <typename ProbT, typename IdT>
struct RowArgs {
    const ProbT* __restrict__ target;
    const ProbT* __restrict__ draft;
    const IdT* __restrict__ draft_ids;
    long long bonus_id;
    const double* __restrict__ uniforms;
    const double* __restrict__ parameters;
    long long k;
    long long vocab;
    int method;
    bool causal;
    const double* sampling;
    ProbT* scratch;  // written and read by this block: deliberately not __restrict__
    bool target_logits;
    bool draft_logits;
    // The surface's settings of the target and draft logits rows (every pointer nullptr:
    // none) and the request's two adjusted rows of vocab entries where law_row makes an
    // adjusted target and draft row (nullptr without settings).
    RowAdjust<ProbT> target_adjust;
    RowAdjust<ProbT> draft_adjust;
    ProbT* adjusted;  // written and read by this block: deliberately not __restrict__
};

// A request's RowAdjust from a driver's arguments for one rows array (each pointer nullptr:
// none): the bitmask and offsets from the request's first row on, for logits rows only
// (`reads`: probability rows are used as given).
template <typename ProbT>
__device__ __forceinline__ RowAdjust<ProbT> request_adjust(
    bool reads, const int* bitmask, const long long* offsets, const long long* ids,
    const ProbT* values, long long words, long long first_row) {
    return RowAdjust<ProbT>{
        reads && bitmask != nullptr ? bitmask + first_row * words : nullptr,
        words,
        reads && offsets != nullptr ? offsets + first_row : nullptr,
        ids,
        values,
    };
}

// Whether the request's target (or draft) rows are logits, read through their law.
template <typename ProbT, typename IdT>
__device__ __forceinline__ bool reads_law(const RowArgs<ProbT, IdT>& a, bool draft) {
    return draft ? a.draft_logits : a.target_logits;
}

// Whether any of the request's rows are logits.
template <typename ProbT, typename IdT>
__device__ __forceinline__ bool any_logits(const RowArgs<ProbT, IdT>& a) {
    return a.target_logits || a.draft_logits;
}

// What Row::run returns, to every thread of the block.
struct RowResult {
    long long last_token;
    long long accepted_length;
    long long num_accepted;
    long long status;
};


// q_i(x_i) of a request of probability rows (1 for a point-mass draft), negative and NaN
// counted as 0.
template <typename ProbT, typename IdT>
__device__ __forceinline__ double draft_probability(const RowArgs<ProbT, IdT>& a, long long i) {
    if (a.draft == nullptr) return 1.0;
    return specdec_clean(static_cast<double>(a.draft[i * a.vocab + a.draft_ids[i]]));
}

// p_i(x_i) of a request of probability rows.
template <typename ProbT, typename IdT>
__device__ __forceinline__ double target_probability(const RowArgs<ProbT, IdT>& a, long long i) {
    return static_cast<double>(a.target[i * a.vocab + a.draft_ids[i]]);
}

// Row i of the request's target (or draft) rows as its law reads it: the row itself, or,
// where the sampling surface's settings touch it, the adjusted row (each token whose bit is
// clear set to -inf, then the row's entries written over it) in the request's adjusted row
// of its kind, made when the row is first read and again when another row of its kind was
// made since (the CPU driver's logits_row). Block-wide: every thread must call it. The rows
// must not be nullptr.
template <typename ProbT, typename IdT>
__device__ const ProbT* law_row(const RowArgs<ProbT, IdT>& a, Scratch& s, long long i,
                                bool draft) {
    const ProbT* row = (draft ? a.draft : a.target) + i * a.vocab;
    const RowAdjust<ProbT>& adjust = draft ? a.draft_adjust : a.target_adjust;
    long long start = 0;
    long long stop = 0;
    if (adjust.offsets != nullptr) {
        start = adjust.offsets[i];
        stop = adjust.offsets[i + 1];
    }
    if (a.adjusted == nullptr || (adjust.bitmask == nullptr && start == stop)) return row;
    ProbT* out = a.adjusted + (draft ? a.vocab : 0);
    if ((draft ? s.draft_adjusted_row : s.target_adjusted_row) == i) return out;
    __syncthreads();  // every thread has read the cached row, every reader of `out` is done
    const int* words = adjust.bitmask != nullptr ? adjust.bitmask + i * adjust.words : nullptr;
    const ProbT minus_infinity = -LawTraits<ProbT>::infinity();
    for (long long y = threadIdx.x; y < a.vocab; y += kBlock) {
        const bool allowed =
            words == nullptr ||
            ((static_cast<unsigned int>(words[y / 32]) >> static_cast<unsigned int>(y % 32)) &
             1u) != 0u;
        out[y] = allowed ? row[y] : minus_infinity;
    }
    __syncthreads();
    // A row's ids are distinct (the host lists each touched token once), so the entries are
    // written in any order.
    for (long long e = start + threadIdx.x; e < stop; e += kBlock) {
        out[adjust.ids[e]] = adjust.values[e];
    }
    if (threadIdx.x == 0) {
        if (draft) {
            s.draft_adjusted_row = i;
        } else {
            s.target_adjusted_row = i;
        }
    }
    __syncthreads();
    return out;
}

// The law of row i of the request's target (or draft) rows, computed once per row read in a
// row (the cache of the CPU driver). Block-wide: every thread must call it.
template <typename ProbT, typename IdT>
__device__ specdec_row_law cached_law(const RowArgs<ProbT, IdT>& a, Scratch& s, long long i,
                                      bool draft) {
    const long long cached = draft ? s.draft_law_row : s.target_law_row;
    if (cached != i) {
        const specdec_row_law law =
            row_law(law_row(a, s, i, draft), a.vocab, static_cast<ProbT>(a.sampling[0]),
                    static_cast<long long>(a.sampling[1]), a.sampling[2], a.sampling[3],
                    static_cast<int>(a.sampling[4]), s);
        __syncthreads();  // every thread has read the cached row index
        if (threadIdx.x == 0) {
            if (draft) {
                s.draft_law = law;
                s.draft_law_row = i;
            } else {
                s.target_law = law;
                s.target_law_row = i;
            }
        }
        __syncthreads();
        return law;
    }
    return draft ? s.draft_law : s.target_law;
}

// p_i(y) or q_i(y) in float64 (block-wide with logits).
template <typename ProbT, typename IdT>
__device__ double read_probability(const RowArgs<ProbT, IdT>& a, Scratch& s, long long i,
                                   long long y, bool draft) {
    const ProbT* rows = draft ? a.draft : a.target;
    if (!reads_law(a, draft)) return static_cast<double>(rows[i * a.vocab + y]);
    const specdec_row_law law = cached_law(a, s, i, draft);
    return law_probability(law_row(a, s, i, draft), y, static_cast<ProbT>(a.sampling[0]), law);
}

template <typename ProbT, typename IdT>
__device__ double target_p(const RowArgs<ProbT, IdT>& a, Scratch& s, long long i) {
    return read_probability(a, s, i, static_cast<long long>(a.draft_ids[i]), false);
}

// q_i(x_i): 1 for a point-mass draft; negative and NaN count as 0.
template <typename ProbT, typename IdT>
__device__ double draft_p(const RowArgs<ProbT, IdT>& a, Scratch& s, long long i) {
    if (a.draft == nullptr) return 1.0;
    return specdec_clean(read_probability(a, s, i, static_cast<long long>(a.draft_ids[i]), true));
}

// Row i as probabilities: the row itself, or its processed law written to the request's
// scratch row (nullptr stays nullptr: a point-mass draft). Block-wide with logits.
template <typename ProbT, typename IdT>
__device__ const ProbT* processed_row(const RowArgs<ProbT, IdT>& a, Scratch& s, long long i,
                                      bool draft) {
    const ProbT* rows = draft ? a.draft : a.target;
    if (rows == nullptr) return rows;
    if (!reads_law(a, draft)) return rows + i * a.vocab;
    const specdec_row_law law = cached_law(a, s, i, draft);
    const ProbT temperature = static_cast<ProbT>(a.sampling[0]);
    const ProbT* row = law_row(a, s, i, draft);
    ProbT* out = a.scratch + (draft ? a.vocab : 0);
    __syncthreads();  // every earlier reader of this scratch row is done
    for (long long y = threadIdx.x; y < a.vocab; y += kBlock) {
        out[y] = materialised(row, y, temperature, law);
    }
    __syncthreads();
    return out;
}

// Block-wide, at the start of a request: forgets the row laws cached for the block's previous
// request and returns the first position j < count whose id ids[j] lies outside [0, vocab)
// (with check_last, position count holds `last`, a chain's bonus id), or kNone. A bad id is
// reported by its position and never used as an index.
template <typename IdT>
__device__ long long start_request(const IdT* __restrict__ ids, long long count, long long last,
                                   bool check_last, long long vocab, Scratch& s) {
    if (threadIdx.x == 0) {
        s.first_bad = kNone;
        s.target_law_row = -1;
        s.draft_law_row = -1;
        s.target_adjusted_row = -1;
        s.draft_adjusted_row = -1;
    }
    __syncthreads();
    const long long positions = check_last ? count + 1 : count;
    for (long long j = threadIdx.x; j < positions; j += kBlock) {
        const long long id = j < count ? static_cast<long long>(ids[j]) : last;
        if (id < 0 || id >= vocab) atomicMin(&s.first_bad, j);
    }
    __syncthreads();
    return s.first_bad;
}
}  // namespace specdec
