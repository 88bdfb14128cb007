// verify_trees: tree verification (the CPU's specdec_np._core.verify_trees driver), one
// block walking each request with the registry's tree step of its method code.
#include "generated/contract.cuh"
#include "elementwise.h"
#include "tree_walks.cuh"
#include "generated/tree_walks.cuh"

// Tree verification with the arguments of specdec_np._core.verify_trees:
// target_rows [N + B, V], draft_rows [N, V] or nullptr (point-mass candidates),
// draft_token_ids and tree_parents [N], node_offsets [B + 1], the child lists of
// specdec_np._layouts.tree_links (first_child [N + B], next_sibling, next_distinct_sibling and
// repeated_token [N]; a link that does not move forward inside its request ends its list),
// uniforms [uniform_count]
// (flat: request b's N_b + 1 from node_offsets[b] + b on; uniform_count = N + B),
// request_methods [B] or nullptr (then every request walks `method`; both registry tree
// method codes), working [B, R V] (a request's residual rows, R = TreeMethod.working_rows of
// `method` at depth_width; nullptr when no request walks stochastically); outputs
// accepted_nodes [B, depth_width], output [B, depth_width + 1], accepted_lengths and
// row_status [B], written where and as the CPU driver writes them; then sampling [B, 5]
// (the rows are logits: temperature, top-k, top-p, min-p; nullptr for probabilities) and
// scratch [B, 2 V] (a request's processed target and draft row; with sampling only); then
// the sampling surface's settings of the logits rows, as verify_chains_kernel takes them
// (each pointer nullptr: none), and adjusted [B, 2 V] (with any setting).
// Launch: grid B, block kBlock. Every thread of a block walks the same path (the scalar steps
// are repeated by each thread, the row passes are shared), so every __syncthreads is reached
// by the whole block. A request whose code names no registry tree method, or whose method
// is stochastic in a call without uniforms or working rows (a direct caller's error: the
// launcher checks both), gets row status kStatusBadMethod and nothing else of it is read or
// written.
template <typename ProbT, typename IdT>
__global__ void __launch_bounds__(specdec::kBlock, 1)
verify_trees_kernel(const ProbT* __restrict__ target_rows, const ProbT* __restrict__ draft_rows,
                    const IdT* __restrict__ draft_token_ids,
                    const long long* __restrict__ tree_parents,
                    const long long* __restrict__ node_offsets,
                    const long long* __restrict__ first_child,
                    const long long* __restrict__ next_sibling,
                    const long long* __restrict__ next_distinct_sibling,
                    const signed char* __restrict__ repeated_token,
                    const double* __restrict__ uniforms, long long uniform_count,
                    const signed char* __restrict__ request_methods, long long method,
                    long long batch, long long num_nodes, long long vocab, long long depth_width,
                    double* __restrict__ working, long long* __restrict__ accepted_nodes,
                    long long* __restrict__ output, long long* __restrict__ accepted_lengths,
                    long long* __restrict__ row_status, const double* __restrict__ sampling,
                    ProbT* scratch, long long target_logits, long long draft_logits,
                    const int* __restrict__ target_mask,
                    const long long* __restrict__ target_entry_offsets,
                    const long long* __restrict__ target_entry_ids,
                    const ProbT* __restrict__ target_entry_values,
                    const int* __restrict__ draft_mask,
                    const long long* __restrict__ draft_entry_offsets,
                    const long long* __restrict__ draft_entry_ids,
                    const ProbT* __restrict__ draft_entry_values, long long mask_words,
                    ProbT* adjusted) {
    __shared__ specdec::Scratch shared;
    const long long b = blockIdx.x;
    if (b >= batch) return;
    const int t = threadIdx.x;
    const long long walk = request_methods != nullptr
                               ? static_cast<long long>(request_methods[b])
                               : method;
    const bool known = walk >= 0 && walk < specdec::kTreeMethods;
    const bool stochastic = known && specdec::kWalkReadsUniforms[walk];
    if (!known ||
        (stochastic && (working == nullptr || uniforms == nullptr || uniform_count < 1))) {
        if (t == 0) row_status[b] = specdec::kStatusBadMethod;
        return;
    }
    // The layout writes consistent offsets; clamping them (and N_b to the uniforms) only
    // guarantees that inconsistent ones never make a block leave the arrays.
    const long long start = specdec::clamp_ll(node_offsets[b], 0, num_nodes);
    const long long stop = specdec::clamp_ll(node_offsets[b + 1], start, num_nodes);
    const long long first_uniform = specdec::min_ll(start + b, uniform_count - 1);
    const long long nodes =
        stochastic ? specdec::min_ll(stop - start, uniform_count - 1 - first_uniform)
                   : stop - start;
    const IdT* ids = draft_token_ids + start;
    // The working rows per request, by the call's method (the launcher sized them so):
    // TreeMethod.working_rows.
    const bool call_method_known = method >= 0 && method < specdec::kTreeMethods;
    const long long working_rows =
        call_method_known && specdec::kWalkSequenceLevel[method]
            ? (depth_width + 1 > 2 ? depth_width + 1 : 2)
            : 2;

    // Ids first (by node).
    const long long bad = specdec::start_request(ids, nodes, 0, false, vocab, shared);
    if (bad != specdec::kNone) {
        if (t == 0) row_status[b] = 1 + bad;
        return;
    }

    const bool target_read = sampling != nullptr && target_logits != 0;
    const bool draft_read = sampling != nullptr && draft_logits != 0 && draft_rows != nullptr;
    const specdec::TreeArgs<ProbT, IdT> args{
        {
            target_rows + (start + b) * vocab,
            draft_rows != nullptr ? draft_rows + start * vocab : nullptr,
            ids,
            0,  // a tree has no bonus id
            stochastic ? uniforms + first_uniform : nullptr,
            nullptr,  // nor verifier parameters
            nodes,
            vocab,
            static_cast<int>(walk),
            false,
            sampling != nullptr ? sampling + 5 * b : nullptr,
            sampling != nullptr ? scratch + b * 2 * vocab : nullptr,
            target_read,
            sampling != nullptr && draft_logits != 0,
            // A node's target row is its index + 1 from the request's root row on.
            specdec::request_adjust(target_read, target_mask, target_entry_offsets,
                                    target_entry_ids, target_entry_values, mask_words,
                                    start + b),
            specdec::request_adjust(draft_read, draft_mask, draft_entry_offsets,
                                    draft_entry_ids, draft_entry_values, mask_words, start),
            adjusted != nullptr ? adjusted + b * 2 * vocab : nullptr,
        },
        tree_parents + start,
        first_child + start + b,
        next_sibling + start,
        next_distinct_sibling + start,
        repeated_token + start,
        stochastic ? working + b * working_rows * vocab : nullptr,
        working_rows,
    };
    long long* nodes_out = accepted_nodes + b * depth_width;
    long long* tokens_out = output + b * (depth_width + 1);
    long long node = -1;
    long long depth = 0;
    long long final_token = -1;
    long long status = 0;
    for (;;) {  // uniform loop: every thread takes the same path
        const long long child =
            specdec::tree_step(static_cast<int>(walk), args, node, final_token, shared);
        if (child == specdec::kStepBadMethod) {
            status = specdec::kStatusBadMethod;
            break;
        }
        if (child == specdec::kStepNoMemory) {
            status = SPECDEC_STATUS_NO_MEMORY;
            break;
        }
        if (child == specdec::kStepNoMass) {
            status = -(1 + node + 1);
            break;
        }
        if (child == specdec::kStepFinal) break;
        // The nodes from here down to the accepted one: a child, or for a step that decides
        // the whole walk (traversal) a descendant, with final_token already written.
        long long steps = 0;
        long long up = child;
        while (up > node) {
            ++steps;
            up = args.parents[up];
        }
        if (up != node || depth + steps > depth_width) {
            // The driver sizes the output by the deepest node; this bound only keeps a write
            // inside the row whatever the parents say.
            status = 1 + child;
            break;
        }
        if (t == 0) {
            long long slot = depth + steps - 1;
            for (long long j = child; j > node; j = args.parents[j], --slot) {
                nodes_out[slot] = j;
                tokens_out[slot] = static_cast<long long>(ids[j]);
            }
        }
        depth += steps;
        node = child;
        if (final_token == -2) {
            status = -(1 + node + 1);
            break;
        }
        if (final_token >= 0) break;
    }
    if (status == 0) {
        for (long long j = depth + t; j <= depth_width; j += specdec::kBlock) {
            tokens_out[j] = j == depth ? final_token : -1LL;
            if (j < depth_width) nodes_out[j] = -1;
        }
        if (t == 0) accepted_lengths[b] = depth;
    }
    if (t == 0) row_status[b] = status;
}
