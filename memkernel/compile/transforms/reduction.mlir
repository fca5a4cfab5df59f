// The "fast" preset's strategy for 1-d reductions to a scalar on f32/f64 tensors:
// linalg.reduce, and linalg.generic with a single reduction iterator.
//
// Splits the reduction into {lanes}-wide partial results carried across the loop (which
// reassociates the sum, as numpy's pairwise summation does), vectorizes the partial step
// with masks for the last, partial chunk, and reduces the partials once at the end.
// This needs tensor semantics (the output must not alias the input); reductions on
// memrefs get the preset's reassociation rule instead (memkernel/compile/reassociation.py).
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %reduce = transform.structured.match ops{["linalg.reduce"]} in %root
        : (!transform.any_op) -> !transform.any_op
    %generic = transform.structured.match ops{["linalg.generic"]}
        attributes{iterator_types = [#linalg.iterator_type<reduction>]} in %root
        : (!transform.any_op) -> !transform.any_op
    %reductions = transform.merge_handles %reduce, %generic : !transform.any_op
    %fill, %partial, %combine, %loop = transform.structured.tile_reduction_using_for %reductions
        by tile_sizes = [{reduction_tiles}]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
    transform.structured.vectorize %partial vector_sizes [{vector_sizes}] : !transform.any_op
    %func = transform.structured.match ops{["func.func"]} in %root : (!transform.any_op) -> !transform.any_op
    %vectorized = transform.structured.vectorize_children_and_apply_patterns %func
        : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %vectorized {
      transform.apply_patterns.vector.lower_masked_transfers
      transform.apply_patterns.vector.lower_masks
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    transform.yield
  }
}
