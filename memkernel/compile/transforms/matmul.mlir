// The "fast" preset's strategy for linalg.matmul on memrefs (f32 and f64).
//
// Tiles for the caches ({cache_tiles}), then for registers ({register_tiles}: a block of
// C rows by two host vectors, times a few steps of K). Peeling the register loops leaves
// full tiles with static shapes in the main loops, which are vectorized into
// vector.contract and lowered to broadcast-and-FMA outer products; the partial tiles
// peeled off keep their linalg form and take the default lowering. The C block is
// hoisted out of the K loop, so it stays in registers.
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %matmul = transform.structured.match ops{["linalg.matmul"]} in %root
        : (!transform.any_op) -> !transform.any_op
    %cache_tile, %cache_loops:3 = transform.structured.tile_using_for %matmul tile_sizes [{cache_tiles}]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
    %register_tile, %loops:3 = transform.structured.tile_using_for %cache_tile tile_sizes [{register_tiles}]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
    %i = transform.cast %loops#0 : !transform.any_op to !transform.op<"scf.for">
    %j = transform.cast %loops#1 : !transform.any_op to !transform.op<"scf.for">
    %k = transform.cast %loops#2 : !transform.any_op to !transform.op<"scf.for">
    // Innermost first: peeling a loop invalidates the handles of the loops nested in it.
    // A loop whose trip count divides evenly has nothing to peel, which is not a failure here.
    transform.sequence %k : !transform.op<"scf.for"> failures(suppress) {
    ^bb0(%loop: !transform.op<"scf.for">):
      %main, %rest = transform.loop.peel %loop : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
    }
    transform.sequence %j : !transform.op<"scf.for"> failures(suppress) {
    ^bb0(%loop: !transform.op<"scf.for">):
      %main, %rest = transform.loop.peel %loop : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
    }
    transform.sequence %i : !transform.op<"scf.for"> failures(suppress) {
    ^bb0(%loop: !transform.op<"scf.for">):
      %main, %rest = transform.loop.peel %loop : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
    }
    %func = transform.structured.match ops{["func.func"]} in %root : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %func {
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    %vectorized = transform.structured.vectorize_children_and_apply_patterns %func
        : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %vectorized {
      transform.apply_patterns.vector.reduction_to_contract
      transform.apply_patterns.vector.transfer_permutation_patterns
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    %hoisted = transform.structured.hoist_redundant_vector_transfers %vectorized
        : (!transform.any_op) -> !transform.any_op
    // No broadcast lowering here: with canonicalization it rewrites without end.
    transform.apply_patterns to %hoisted {
      transform.apply_patterns.vector.lower_contraction lowering_strategy = "outerproduct"
      transform.apply_patterns.vector.lower_outerproduct
      transform.apply_patterns.vector.transfer_permutation_patterns
      transform.apply_patterns.vector.lower_transfer max_transfer_rank = 1
      transform.apply_patterns.vector.lower_shape_cast
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    transform.yield
  }
}
