// One thread block of the verification kernels: its constants, small integer helpers and
// what it keeps in shared memory.
//
// chain_driver.cu and tree_driver.cu run one block of kBlock threads per request (kBlock
// comes from the contract prelude that specdec_np/_kernels/cuda.py writes first). A block's passes
// over a row (the argmax and sum reductions, the three levels of the inverse-CDF draw, the
// histograms of the law's radix select) never overlap in time, so they share storage: the
// union of Scratch. The rest of Scratch is state that outlives one pass.
//
// The files of specdec_np/_kernels/src/ are read and joined by specdec_np/_kernels/cuda.py, which
// includes each file once per source (no include guards: the tests' CPU emulation compiles
// several sources side by side).
#include "elementwise.h"

namespace specdec {
constexpr int kWarp = 32;
constexpr int kWarps = kBlock / kWarp;  // segments of the first draw level
constexpr int kUnroll = 4;              // independent 16-byte loads in flight per thread
constexpr int kBuckets = 1 << SPECDEC_HISTOGRAM_BITS;  // the widest radix-select pass
constexpr int kLanes = 8;                               // the CPU's summation lanes
constexpr int kPathStack = 64;  // block verification keeps p(x_j), q(x_j) up to this k

static_assert(kBlock % kWarp == 0 && (kBlock & (kBlock - 1)) == 0,
              "kBlock must be a power of two and a multiple of the warp size");

__device__ __forceinline__ long long min_ll(long long a, long long b) { return a < b ? a : b; }
__device__ __forceinline__ long long clamp_ll(long long x, long long lo, long long hi) {
    return x < lo ? lo : (x > hi ? hi : x);
}
__device__ __forceinline__ double infinity() { return SPECDEC_INFINITY_D; }

// Shared memory of one block: the draw levels, the argmax/sum reduction and the law's
// histogram never overlap in time, so they share storage.
struct ReduceScratch {
    double value[kBlock];
    long long index[kBlock];
    double sum[kBlock];
};
struct DrawScratch {
    double a[kBlock];
    double b[kBlock];
    double segment_sum[kWarps];
    double base;
    double threshold;
    int segment;
    int first_thread;
    int last_thread;
    long long token;
};
// Top-k's survivors of a long row (logits_law.cuh, gather_survivors): at most kRowBlocks
// blocks' maxima, then at most kSurvivors gathered entries (logit and index, in element
// order), which replace the maxima. The prefix sums of the gathering share the histogram's
// storage, which no select uses meanwhile. Sized so that two blocks of a kernel still fit
// in 64 KiB of shared memory (sm_75) and three in 100 KiB (sm_86).
constexpr int kRowBlocks = 2 * kBlock;
constexpr int kSurvivors = 1024;
struct SurvivorList {
    double logit[kSurvivors];
    int position[kSurvivors];  // rows on this path have fewer than 2^31 entries
};
struct LawScratch {
    union {
        double histogram[kBuckets];
        long long prefix_sum[2][kBlock];
    };
    union {
        double block_max[kRowBlocks];
        SurvivorList survivors;
    };
};
struct Scratch {
    union {
        ReduceScratch reduce;
        DrawScratch draw;
        LawScratch law;
    };
    long long first_bad;
    long long first_reject;
    unsigned long long passed;
    // The maximum pass and the kept sum: one maximum (or float64 sum) per lane.
    double lane_sum[kLanes];
    double lane_best[kLanes];
    long long lane_infinite[kLanes];
    // The radix select's state, broadcast by thread 0 after each histogram.
    unsigned long long select_prefix;
    double select_above;
    double select_need;
    int select_failed;
    // The law of the last target and draft row read (the CPU driver caches them alike).
    specdec_row_law target_law;
    specdec_row_law draft_law;
    long long target_law_row;
    long long draft_law_row;
    // The rows held by the request's adjusted target and draft row (the sampling surface's
    // settings applied; -1: none).
    long long target_adjusted_row;
    long long draft_adjusted_row;
    double path_p[kPathStack];
    double path_q[kPathStack];
    // An RRS step's residual mass after thread 0 restored the tried siblings' tokens.
    double fixed_mass;
};
// A law reduces its extreme logit (ReduceScratch) while it holds top-k's survivors: the
// reduction must lie within the histogram's storage.
static_assert(sizeof(ReduceScratch) <= sizeof(double) * kBuckets &&
                  sizeof(long long) * 2 * kBlock <= sizeof(double) * kBuckets &&
                  kRowBlocks % kBlock == 0,
              "the law's scratch does not fit its union");
}  // namespace specdec
