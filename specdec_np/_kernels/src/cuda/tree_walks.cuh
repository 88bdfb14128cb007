// The registry's tree steps, one per TreeMethod.cuda_walk: one step of a request's walk
// from a node (-1: the root) to its accepted child, or to the final token. A step is called
// by every thread of the block: the scalar steps (which child next, its test) are repeated
// by each thread and the row passes (the greedy argmax, an RRS draft row's mass, the
// residual update, the final draw) shared, so the whole block takes one path. The
// generated dispatch of tree_driver.cu calls the step of a request's registry code.
//
// Every element of a residual is elementwise.h's (specdec_residual_update_element), the
// CPU's to the bit; the float64 sums are block reductions, in another fixed order than the
// CPU's, so the two backends differ only where a uniform lies within rounding of a boundary.
#include "inverse_cdf_draws.cuh"
#include "row_readers.cuh"

namespace specdec {
// What a step returns besides an accepted child (>= 0).
constexpr long long kStepFinal = -1;      // the walk ends here; final_token is set
constexpr long long kStepNoMass = -2;     // the final draw found a row without mass
constexpr long long kStepBadMethod = -3;  // no step has this registry code
constexpr long long kStepNoMemory = -4;   // too few working rows for the request's depth
// The path a sequence-level step keeps: the root and one level per depth (MAX_TREE_DEPTH).
constexpr int kTraversalLevels = 65;

// One request of the tree layout as its block sees it: the fields of a chain request (its
// N_b + 1 target rows: the root row, then one per node; its N_b draft rows, nullptr for
// point-mass candidates; its ids; k = N_b; its uniforms, column j for node j's test and
// column N_b for the final token; for logits rows its sampling parameters and two scratch
// rows), so that the chain's row readers read its rows; then its parents (an index within
// the request, -1 for the root), its child lists (specdec_np._layouts.tree_links: first_child from
// the root's entry on, the others from the request's first node), its float64 working rows
// of V (the residual and its update, ping-pong as on the CPU; nullptr for greedy walks) and
// how many working rows of V it has (two, or max depth + 1 for a sequence-level walk: a
// residual per level).
template <typename ProbT, typename IdT>
struct TreeArgs : RowArgs<ProbT, IdT> {
    const long long* __restrict__ parents;
    const long long* __restrict__ first_child;
    const long long* __restrict__ next_sibling;
    const long long* __restrict__ next_distinct_sibling;
    const signed char* __restrict__ repeated_token;
    double* working;
    long long working_rows;
};

// The child of `node` (-1: the root) after `after`: its first child when `after` is `node`,
// else the sibling after the child `after` (`next` the list: next_sibling or
// next_distinct_sibling); -1 when there is none. O(1). A link that does not move forward
// inside the request ends the list, so a walk only moves forward and ends within N_b steps
// whatever the links say (the launcher's caller computes them; a direct caller may not).
template <typename ProbT, typename IdT>
__device__ long long following_child(const TreeArgs<ProbT, IdT>& a,
                                     const long long* __restrict__ next, long long node,
                                     long long after) {
    const long long j = after == node ? a.first_child[node + 1] : next[after];
    return j > after && j < a.k ? j : -1;
}

// The next child of `node` after `after` (`node`: its first child), or -1.
template <typename ProbT, typename IdT>
__device__ long long next_child(const TreeArgs<ProbT, IdT>& a, long long node, long long after) {
    return following_child(a, a.next_sibling, node, after);
}

// next_child among the children whose token no earlier sibling proposed.
template <typename ProbT, typename IdT>
__device__ long long next_distinct_child(const TreeArgs<ProbT, IdT>& a, long long node,
                                         long long after) {
    return following_child(a, a.next_distinct_sibling, node, after);
}

// Whether a sibling tried before `child` proposed the same token. O(1).
template <typename ProbT, typename IdT>
__device__ bool tried_before(const TreeArgs<ProbT, IdT>& a, long long child) {
    return a.repeated_token[child] != 0;
}
// sum_y max(q(y), 0) (NaN counts as 0): an RRS draft row's mass before the tried siblings'
// tokens are taken out.
template <typename ProbT>
__device__ double clean_sum(const ProbT* __restrict__ q, long long vocab, ReduceScratch& r) {
    double acc = 0.0;
    for (long long y = threadIdx.x; y < vocab; y += kBlock) acc += specdec_clean(q[y]);
    return block_sum(acc, r);
}

// dst = (src / src_mass - max(q, 0) / q_mass)+ elementwise, returning its double sum. Each
// element is the CPU's (specdec_residual_update_element); only the sum's order differs.
template <typename SrcT, typename QT>
__device__ double residual_update(const SrcT* __restrict__ src, double src_mass,
                                  const QT* __restrict__ q, double q_mass, long long vocab,
                                  double* __restrict__ dst, ReduceScratch& r) {
    double acc = 0.0;
    for (long long y = threadIdx.x; y < vocab; y += kBlock) {
        const double w = specdec_residual_update_element(static_cast<double>(src[y]), src_mass,
                                                         static_cast<double>(q[y]), q_mass);
        dst[y] = w;
        acc += w;
    }
    return block_sum(acc, r);
}

// Greedy: the child whose token is the argmax of the node's row (first index on ties, NaN
// ignored, 0 if nothing is above -inf), or kStepFinal with that argmax as the final token.
struct GreedyTreeStep {
    template <typename ProbT, typename IdT>
    __device__ static long long step(const TreeArgs<ProbT, IdT>& a, long long node,
                                     long long& final_token, Scratch& s) {
        double best;
        long long best_index;
        double unused;
        // The row as the sampling surface adjusts it, where it does (the argmax after masks,
        // bias and penalties).
        const ProbT* row = law_row(a, s, node + 1, false);
        row_argmax_entropy<false>(row, a.vocab, best, best_index, unused, s.reduce);
        const long long argmax = argmax_or_zero(best, best_index);
        for (long long child = next_child(a, node, node); child >= 0;
             child = next_child(a, node, child)) {
            if (static_cast<long long>(a.draft_ids[child]) == argmax) return child;
        }
        final_token = argmax;
        return kStepFinal;
    }
};

// Deterministic candidates: child j passes iff u_j (1 - removed) < r(x_j), r the node's row
// with the tokens of the siblings tried before removed (their mass `removed`); when every
// child fails, a draw from the row without them (copied, cleaned, to the working row).
// As on the CPU, a logits row is read through its law for the tests and materialised for
// the draw. Returns the accepted child, or kStepFinal with the final token (kStepNoMass: no
// mass).
struct PointMassTreeStep {
    template <typename ProbT, typename IdT>
    __device__ static long long step(const TreeArgs<ProbT, IdT>& a, long long node,
                                     long long& final_token, Scratch& s) {
        const long long vocab = a.vocab;
        const long long first = next_child(a, node, node);
        double removed = 0.0;
        long long last_removed = -1;
        for (long long child = first; child >= 0; child = next_child(a, node, child)) {
            const long long x = static_cast<long long>(a.draft_ids[child]);
            const double r_x = tried_before(a, child)
                                   ? 0.0
                                   : read_probability(a, s, node + 1, x, false);
            if (a.uniforms[child] * (1.0 - removed) < r_x) return child;
            if (r_x > 0.0) {
                removed += r_x;
                last_removed = x;
            }
        }
        const ProbT* p = processed_row(a, s, node + 1, false);
        const double v = a.uniforms[a.k];
        long long token;
        if (first < 0) {
            token = draw_row(p, vocab, v, s.draw);
        } else {
            double* row = a.working;
            for (long long y = threadIdx.x; y < vocab; y += kBlock) {
                row[y] = specdec_clean(static_cast<double>(p[y]));
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                for (long long child = first; child >= 0;
                     child = next_distinct_child(a, node, child)) {
                    row[a.draft_ids[child]] = 0.0;
                }
            }
            __syncthreads();
            token = draw_row(static_cast<const double*>(row), vocab, v, s.draw);
            // Only rounding leaves nothing: the last rejection removed the last token with mass,
            // which the exact walk would have accepted.
            if (token < 0) token = last_removed;
        }
        if (token < 0) return kStepNoMass;
        final_token = token;
        return kStepFinal;
    }
};

// SpecInfer (and, WithoutReplacement, RRS): child j passes iff u_j q_j(x_j) < r(x_j); on
// rejection r <- (r - q_j)+ renormalised, kept only if it has mass. For RRS q_j is the draft
// row with the tokens of the siblings tried before taken out and renormalised. The residual
// lives in one working row and its update goes to the other. As on the CPU, a logits row is
// read through its law for a test and materialised (p once, q_j per child) where a whole row
// is read. Returns the accepted child, or kStepFinal with the final token (kStepNoMass: no
// mass).
template <typename ProbT, typename IdT>
__device__ long long residual_tree_step(const TreeArgs<ProbT, IdT>& a, long long node,
                                        bool without_replacement, long long& final_token,
                                        Scratch& s) {
    const long long vocab = a.vocab;
    const ProbT* p = nullptr;
    const long long first = next_child(a, node, node);
    // The parent's step ended on a read of its residual, which this step overwrites: no
    // thread may update a working row before every thread has read it.
    __syncthreads();
    const double* residual = nullptr;
    double mass = 1.0;
    for (long long child = first; child >= 0; child = next_child(a, node, child)) {
        const long long x = static_cast<long long>(a.draft_ids[child]);
        const ProbT* q = nullptr;
        const bool reduced = without_replacement && child != first;
        double q_mass = 1.0;
        double q_x;
        if (reduced) {
            q = processed_row(a, s, child, true);
            q_mass = clean_sum(q, vocab, s.reduce);
            // The distinct tokens tried before: at most min(child, V) of them.
            for (long long sibling = first; sibling >= 0 && sibling < child;
                 sibling = next_distinct_child(a, node, sibling)) {
                const long long t = static_cast<long long>(a.draft_ids[sibling]);
                q_mass -= specdec_clean(static_cast<double>(q[t]));
            }
            q_x = tried_before(a, child) ? 0.0 : specdec_clean(static_cast<double>(q[x]));
            if (!(q_mass > 0.0)) {
                q_mass = 1.0;
            } else if (q_mass != 1.0) {
                q_x = q_x / q_mass;
            }
        } else {
            q_x = draft_p(a, s, child);
        }
        double r_x =
            residual != nullptr ? residual[x] : read_probability(a, s, node + 1, x, false);
        if (mass != 1.0) r_x = r_x / mass;
        if (a.uniforms[child] * q_x < r_x) return child;
        if (q == nullptr) q = processed_row(a, s, child, true);
        if (residual == nullptr && p == nullptr) p = processed_row(a, s, node + 1, false);
        double* update = residual != a.working ? a.working : a.working + vocab;
        double updated_mass =
            residual != nullptr
                ? residual_update(residual, mass, q, q_mass, vocab, update, s.reduce)
                : residual_update(p, 1.0, q, q_mass, vocab, update, s.reduce);
        if (reduced) {
            // The tried siblings' tokens are out of q_j: their residual is r alone. One thread
            // rewrites them, in sibling order, as the CPU does.
            if (threadIdx.x == 0) {
                for (long long sibling = first; sibling >= 0 && sibling < child;
                     sibling = next_distinct_child(a, node, sibling)) {
                    const long long t = static_cast<long long>(a.draft_ids[sibling]);
                    double value = residual != nullptr ? residual[t] : static_cast<double>(p[t]);
                    if (mass != 1.0) value = value / mass;
                    value = specdec_clean(value);
                    updated_mass += value - update[t];
                    update[t] = value;
                }
                s.fixed_mass = updated_mass;
            }
            __syncthreads();
            updated_mass = s.fixed_mass;
            __syncthreads();  // fixed_mass may be written again by the next sibling
        }
        if (updated_mass > 0.0) {
            residual = update;
            mass = updated_mass;
        }
    }
    const double v = a.uniforms[a.k];
    if (residual == nullptr && p == nullptr) p = processed_row(a, s, node + 1, false);
    const long long token =
        residual != nullptr ? draw_row(residual, vocab, v, s.draw) : draw_row(p, vocab, v, s.draw);
    if (token < 0) return kStepNoMass;
    final_token = token;
    return kStepFinal;
}

// SpecInfer (children drafted independently, each from its own draft row) and RRS
// (siblings drafted without replacement from one draft row). Without draft rows the
// children are deterministic candidates.
template <bool WithoutReplacement>
struct ResidualTreeStep {
    template <typename ProbT, typename IdT>
    __device__ static long long step(const TreeArgs<ProbT, IdT>& a, long long node,
                                     long long& final_token, Scratch& s) {
        if (a.draft == nullptr) return PointMassTreeStep::step(a, node, final_token, s);
        return residual_tree_step(a, node, WithoutReplacement, final_token, s);
    }
};
using SpecInferTreeStep = ResidualTreeStep<false>;
using RrsTreeStep = ResidualTreeStep<true>;

// dst = max(rho src / src_mass - max(q, 0), 0) elementwise (block verification's weighted
// residual, specdec_residual_weight, the CPU's to the bit), returning its double sum.
template <typename SrcT, typename QT>
__device__ double weighted_update(const SrcT* __restrict__ src, double src_mass, double rho,
                                  const QT* __restrict__ q, long long vocab,
                                  double* __restrict__ dst, ReduceScratch& r) {
    double acc = 0.0;
    for (long long y = threadIdx.x; y < vocab; y += kBlock) {
        double value = static_cast<double>(src[y]);
        if (src_mass != 1.0) value = value / src_mass;
        const double w = specdec_residual_weight(value, static_cast<double>(q[y]), rho, 1.0);
        dst[y] = w;
        acc += w;
    }
    return block_sum(acc, r);
}

// One node of the walked path (the root at level 0): its index (-1: the root), the child
// walked below it, its weight, and once a child of it was rejected its residual (a working
// row) with that residual's mass.
struct TraversalLevel {
    long long node;
    long long child;
    double rho;
    double mass;
    long long row;
    bool has_residual;
};

// Traversal verification (the CPU's traversal_tree_step, docs/semantics.md): the whole walk
// in one call, post-order from the leaves up. A child's weight is min(1, rho r(x) / q(x))
// from its parent's state; a node is tested (u_j < rho_j) once every child's subtree was
// rejected; a rejected child c updates its parent to r <- max(rho r - q_c, 0) renormalised
// (kept without mass) and rho <- Z / (Z + 1 - rho) (a weight of 1 stays 1). Every thread
// keeps the same path in its own registers; the row passes (the updates, the final draw) are
// shared. Returns the deepest accepted node with final_token set (-2 there: its row has no
// mass), kStepFinal with the final token when only the root is accepted (kStepNoMass), or
// kStepNoMemory. Without draft rows, the point-mass walk.
struct TraversalTreeStep {
    template <typename ProbT, typename IdT>
    __device__ static long long step(const TreeArgs<ProbT, IdT>& a, long long node,
                                     long long& final_token, Scratch& s) {
        if (a.draft == nullptr) return PointMassTreeStep::step(a, node, final_token, s);
        const long long vocab = a.vocab;
        const long long rows = a.working_rows;
        TraversalLevel levels[kTraversalLevels];
        // Level l owns working row l; the last row is the spare an update is written to,
        // swapped in when the update has mass, so the rows stay distinct.
        for (int j = 0; j < kTraversalLevels; ++j) levels[j].row = j < rows - 1 ? j : -1;
        long long spare = rows - 1;
        levels[0] = TraversalLevel{-1, next_child(a, -1, -1), 1.0, 1.0, levels[0].row, false};
        int d = 0;
        __syncthreads();  // the working rows may still be read by a previous request's pass
        for (;;) {  // uniform loop: every thread takes the same path
            TraversalLevel* level = &levels[d];
            long long c = level->child;
            if (c >= 0) {
                const long long x = static_cast<long long>(a.draft_ids[c]);
                double w = 0.0;
                if (level->rho > 0.0) {
                    double r_x = level->has_residual ? a.working[level->row * vocab + x]
                                                     : read_probability(a, s, level->node + 1, x,
                                                                        false);
                    if (level->mass != 1.0) r_x = r_x / level->mass;
                    w = specdec_next_block_weight(level->rho, r_x, draft_p(a, s, c));
                }
                if (w > 0.0) {
                    if (d + 1 >= kTraversalLevels) return kStepNoMemory;
                    ++d;
                    levels[d].node = c;
                    levels[d].child = next_child(a, c, c);
                    levels[d].rho = w;
                    levels[d].mass = 1.0;
                    levels[d].has_residual = false;
                    continue;
                }
                // A child of weight 0: its subtree is rejected whatever its uniforms, unread.
            } else if (d == 0 || a.uniforms[level->node] < level->rho) {
                break;
            } else {
                // Every child failed and so did the node's own test: it is its parent's
                // rejected child.
                --d;
                level = &levels[d];
                c = level->child;
            }
            if (level->rho > 0.0) {
                if (level->row < 0) return kStepNoMemory;
                const ProbT* q = processed_row(a, s, c, true);
                double* update = a.working + spare * vocab;
                double total;
                if (level->has_residual) {
                    total = weighted_update(static_cast<const double*>(a.working + level->row * vocab),
                                            level->mass, level->rho, q, vocab, update, s.reduce);
                } else {
                    const ProbT* p = processed_row(a, s, level->node + 1, false);
                    total = weighted_update(p, 1.0, level->rho, q, vocab, update, s.reduce);
                }
                if (d > 0 && level->rho < 1.0) level->rho = specdec_block_check(total, level->rho);
                if (total > 0.0) {
                    const long long swap = level->row;
                    level->row = spare;
                    spare = swap;
                    level->mass = total;
                    level->has_residual = true;
                }
            }
            level->child = next_child(a, level->node, c);
        }
        const TraversalLevel& end = levels[d];
        const double v = a.uniforms[a.k];
        long long token;
        if (end.has_residual) {
            token = draw_row(static_cast<const double*>(a.working + end.row * vocab), vocab, v,
                             s.draw);
        } else {
            token = draw_row(processed_row(a, s, end.node + 1, false), vocab, v, s.draw);
        }
        if (end.node < 0) {
            if (token < 0) return kStepNoMass;
            final_token = token;
            return kStepFinal;
        }
        final_token = token >= 0 ? token : -2;
        return end.node;
    }
};
}  // namespace specdec
