/* Threads inside a row: the two passes of a logits row's law (logits_law.h: the maximum, then
 * the exponentials with their sum) split between OpenMP threads, with the bits of one.
 *
 * A call with fewer requests than threads (one request, say) leaves threads idle in the loop
 * over requests; a row's passes can then run on several.  The row is cut into chunks of
 * SPECDEC_ROW_CHUNK entries (a multiple of 32, so that every chunk but the last is whole
 * groups of the passes' vectors and starts on lane 0 of y mod 8); the tests build the
 * headers with a smaller one.  The passes run so only outside a parallel region: a loop
 * over requests that already runs on several threads never nests a team in each of them
 * (and a team nested in an inactive region costs new threads every time in libgomp, so the
 * drivers call the law outside any region when they run on one thread).
 *
 * SPECDEC_LOGITS_MUTATION 4 (tests only; logits_law.h) returns the sum of the chunks' sums.
 */
#ifndef SPECDEC_ROWTHREADS_H
#define SPECDEC_ROWTHREADS_H

#include <stddef.h>
#include <stdint.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "rowscan.h"

#ifndef SPECDEC_LOGITS_MUTATION
#define SPECDEC_LOGITS_MUTATION 0
#endif

#ifndef SPECDEC_ROW_CHUNK
#define SPECDEC_ROW_CHUNK 4096
#endif
#if SPECDEC_ROW_CHUNK <= 0 || SPECDEC_ROW_CHUNK % 32 != 0
#error "SPECDEC_ROW_CHUNK must be a positive multiple of 32"
#endif

/* The threads a row of V entries takes when `requested` are asked for (a law scratch's
 * row_threads): `requested` when that is more than 1, the row has at least two chunks and
 * no parallel region is active, at most one per chunk; else 1.  Without OpenMP a count
 * above 1 still takes the chunked passes, one chunk after the other: the same bits, which
 * lets a build without OpenMP test them. */
static inline int specdec_row_threads(int requested, ptrdiff_t V)
{
    if (requested <= 1 || V < 2 * (ptrdiff_t)SPECDEC_ROW_CHUNK)
        return 1;
#ifdef _OPENMP
    if (omp_in_parallel())
        return 1;
#endif
    ptrdiff_t chunks = (V + SPECDEC_ROW_CHUNK - 1) / SPECDEC_ROW_CHUNK;
    return (ptrdiff_t)requested < chunks ? requested : (int)chunks;
}

/* The end of the chunk that starts at `start`. */
static inline ptrdiff_t specdec_chunk_stop(ptrdiff_t start, ptrdiff_t V)
{
    return V - start < SPECDEC_ROW_CHUNK ? V : start + SPECDEC_ROW_CHUNK;
}

/* The pragmas of the chunked passes; without OpenMP the code runs as one thread. */
#ifdef _OPENMP
#define SPECDEC_PRAGMA(text) _Pragma(#text)
#define SPECDEC_OMP_PARALLEL(threads) SPECDEC_PRAGMA(omp parallel num_threads(threads))
#define SPECDEC_OMP_FOR SPECDEC_PRAGMA(omp for schedule(static))
#define SPECDEC_OMP_CRITICAL SPECDEC_PRAGMA(omp critical(specdec_row_chunks))
/* Chunks dealt out one at a time, so that the chunks summed one after the other in the
 * ordered region come from alternate threads. */
#define SPECDEC_OMP_PARALLEL_FOR_ORDERED(threads)                                           \
    SPECDEC_PRAGMA(omp parallel for num_threads(threads) schedule(static, 1) ordered)
#define SPECDEC_OMP_ORDERED SPECDEC_PRAGMA(omp ordered)
#else
#define SPECDEC_OMP_PARALLEL(threads)
#define SPECDEC_OMP_FOR
#define SPECDEC_OMP_CRITICAL
#define SPECDEC_OMP_PARALLEL_FOR_ORDERED(threads)
#define SPECDEC_OMP_ORDERED
#endif

/* specdec_row_max over chunks on `threads` threads: each thread takes the maximum and the
 * +inf count of its chunks with the one-thread scan, and the threads' results are combined
 * one at a time.  The maximum is a selection (NaN never wins) and the count an integer sum,
 * so neither the chunks nor the order of the combination change them, with one exception:
 * -0 and +0 compare equal, and the one-thread scan keeps the first zero in element order
 * (its lanes find a zero maximum again in that order), which a combination in the
 * threads' order does not follow.  The sign is visible (the law reports z_max, and min-p's floor is the
 * key of z_max), so a maximum of zero is found again by the one-thread scan over the row:
 * such a row costs a third pass over its logits, and has the bits of one thread. */
#define SPECDEC_DEFINE_ROW_MAX_THREADED(SUFFIX, T, ROW_MAX)                                 \
    static void specdec_row_max_threaded_##SUFFIX(const T *logits, ptrdiff_t V,             \
                                                  T temperature, T *z_max,                 \
                                                  int64_t *num_infinite, int threads)      \
    {                                                                                      \
        const ptrdiff_t chunks = (V + SPECDEC_ROW_CHUNK - 1) / SPECDEC_ROW_CHUNK;          \
        T best = (T)-INFINITY;                                                             \
        int64_t infinite = 0;                                                              \
        SPECDEC_OMP_PARALLEL(threads)                                                      \
        {                                                                                  \
            T part = (T)-INFINITY;                                                         \
            int64_t part_infinite = 0;                                                     \
            SPECDEC_OMP_FOR                                                                \
            for (ptrdiff_t c = 0; c < chunks; ++c) {                                       \
                const ptrdiff_t start = c * SPECDEC_ROW_CHUNK;                             \
                const ptrdiff_t stop = specdec_chunk_stop(start, V);                       \
                T chunk_max;                                                               \
                int64_t chunk_infinite;                                                    \
                ROW_MAX(logits + start, stop - start, temperature, &chunk_max,            \
                        &chunk_infinite);                                                  \
                part = chunk_max > part ? chunk_max : part;                                \
                part_infinite += chunk_infinite;                                           \
            }                                                                              \
            SPECDEC_OMP_CRITICAL                                                           \
            {                                                                              \
                best = part > best ? part : best;                                          \
                infinite += part_infinite;                                                 \
            }                                                                              \
        }                                                                                  \
        if (best == (T)0) {                                                                \
            ROW_MAX(logits, V, temperature, z_max, num_infinite);                          \
            return;                                                                        \
        }                                                                                  \
        *z_max = best;                                                                     \
        *num_infinite = infinite;                                                          \
    }

/* specdec_kept_sum over chunks on `threads` threads, into `weights` (not NULL): each chunk's
 * weights are written by the one-thread pass over the chunk (its own sum is dropped), and
 * summed on eight lanes by specdec_residual_sum with q = 0, rho = 1 and scale = 1, one
 * chunk after the other in element order (an ordered region: a thread sums its chunk,
 * still in its cache, once the chunk before it was summed, while the other threads compute
 * later chunks).  Pieces whose lengths are multiples of 8 added to one set of lanes give
 * the bits of one specdec_residual_sum over the row (rowscan.h), and that sum adds the
 * values the one-thread pass adds (a float32 weight widened to float64, a float64 one as
 * it is; +0 where the pass skips a group that keeps nothing, which changes no lane, since
 * every lane is +0 or positive, never -0) to the same lanes y mod 8 in the same order and
 * combines them with the same SPECDEC_COMBINE_LANES: the bits of the one-thread pass.  The
 * sum of the chunks' own sums would add in another order; SPECDEC_LOGITS_MUTATION 4
 * returns it instead, wrong on purpose.  (Summing after the loop instead of chunk by chunk
 * gives the same bits, but its chain of dependent float64 additions, V / 8 long, then
 * runs alone: at V = 128256 about as long as what the second thread saves.) */
#define SPECDEC_DEFINE_KEPT_SUM_THREADED(SUFFIX, T, KEPT_SUM)                               \
    static double specdec_kept_sum_threaded_##SUFFIX(const T *logits, ptrdiff_t V,          \
                                                     T temperature, T z_max, T cutoff,     \
                                                     T *weights, int threads)              \
    {                                                                                      \
        const ptrdiff_t chunks = (V + SPECDEC_ROW_CHUNK - 1) / SPECDEC_ROW_CHUNK;          \
        double lanes[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};                        \
        double chunk_sums = 0.0;                                                           \
        SPECDEC_OMP_PARALLEL_FOR_ORDERED(threads)                                          \
        for (ptrdiff_t c = 0; c < chunks; ++c) {                                           \
            const ptrdiff_t start = c * SPECDEC_ROW_CHUNK;                                 \
            const ptrdiff_t stop = specdec_chunk_stop(start, V);                           \
            double partial = KEPT_SUM(logits + start, stop - start, temperature, z_max,     \
                                      cutoff, weights + start);                            \
            SPECDEC_OMP_ORDERED                                                            \
            {                                                                              \
                if (SPECDEC_LOGITS_MUTATION == 4)                                          \
                    chunk_sums += partial;                                                 \
                else                                                                       \
                    specdec_residual_sum_##SUFFIX##_accumulate(weights, NULL, -1, 1.0, 1.0, \
                                                               start, stop, lanes);        \
            }                                                                              \
        }                                                                                  \
        return SPECDEC_LOGITS_MUTATION == 4 ? chunk_sums : specdec_combine_lanes(lanes);    \
    }

/* The two passes of the law (ROW_MAX, KEPT_SUM: its one-thread functions for rows of T) as
 * it takes them, specdec_law_row_max_SUFFIX and specdec_law_kept_sum_SUFFIX: on row_threads
 * threads where specdec_row_threads allows (the kept sum only with a row of weights to
 * write), else on the calling thread. */
#define SPECDEC_DEFINE_ROW_PASSES(SUFFIX, T, ROW_MAX, KEPT_SUM)                             \
    SPECDEC_DEFINE_ROW_MAX_THREADED(SUFFIX, T, ROW_MAX)                                    \
    SPECDEC_DEFINE_KEPT_SUM_THREADED(SUFFIX, T, KEPT_SUM)                                  \
    static void specdec_law_row_max_##SUFFIX(const T *logits, ptrdiff_t V, T temperature,   \
                                             T *z_max, int64_t *num_infinite,              \
                                             int row_threads)                              \
    {                                                                                      \
        int threads = specdec_row_threads(row_threads, V);                                 \
        if (threads > 1)                                                                   \
            specdec_row_max_threaded_##SUFFIX(logits, V, temperature, z_max, num_infinite,  \
                                              threads);                                    \
        else                                                                               \
            ROW_MAX(logits, V, temperature, z_max, num_infinite);                          \
    }                                                                                      \
    static double specdec_law_kept_sum_##SUFFIX(const T *logits, ptrdiff_t V, T temperature, \
                                                T z_max, T cutoff, T *weights,             \
                                                int row_threads)                           \
    {                                                                                      \
        int threads = weights ? specdec_row_threads(row_threads, V) : 1;                   \
        if (threads > 1)                                                                   \
            return specdec_kept_sum_threaded_##SUFFIX(logits, V, temperature, z_max, cutoff, \
                                                      weights, threads);                   \
        return KEPT_SUM(logits, V, temperature, z_max, cutoff, weights);                   \
    }

#endif
