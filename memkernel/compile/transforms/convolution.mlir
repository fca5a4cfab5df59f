// The "fast" preset's strategy for convolutions on memrefs (f32 and f64): {op}.
//
// Tiles the batch and output rows to 1 and the output columns and channels to a register
// block ({outer_tiles}), then the filter window to 1 by 1 and the input channels to a few
// steps ({window_tiles}). With every window dimension of size 1, the convolution of a tile
// is a small matmul of (output columns × input channels) by (input channels × output
// channels) (or, for a depthwise convolution, an elementwise multiply-add): generalized and
// with its unit dimensions folded away, it vectorizes into vector.contract, lowered to
// broadcast-and-FMA outer products. The output block is hoisted out of the window and
// channel loops, so it stays in registers. Peeling leaves full tiles with static shapes in
// the main loops; the partial tiles peeled off are vectorized when their shape is static
// and otherwise keep their linalg form and take the default lowering.
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %conv = transform.structured.match ops{["{op}"]} in %root
        : (!transform.any_op) -> !transform.any_op
    %outer, %outer_loops:{outer_count} = transform.structured.tile_using_for %conv tile_sizes [{outer_tiles}]
        : (!transform.any_op) -> (!transform.any_op{outer_types})
    %tile, %window_loops:{window_count} = transform.structured.tile_using_for %outer tile_sizes [{window_tiles}]
        : (!transform.any_op) -> (!transform.any_op{window_types})
    %generic = transform.structured.generalize %tile : (!transform.any_op) -> !transform.any_op
    %channels = transform.cast %window_loops#{channel_loop} : !transform.any_op to !transform.op<"scf.for">
    %features = transform.cast %outer_loops#{feature_loop} : !transform.any_op to !transform.op<"scf.for">
    %columns = transform.cast %outer_loops#{column_loop} : !transform.any_op to !transform.op<"scf.for">
    // Innermost first: peeling a loop invalidates the handles of the loops nested in it.
    // A loop whose trip count divides evenly has nothing to peel, which is not a failure here.
    transform.sequence %channels : !transform.op<"scf.for"> failures(suppress) {
    ^bb0(%loop: !transform.op<"scf.for">):
      %main, %rest = transform.loop.peel %loop : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
    }
    transform.sequence %features : !transform.op<"scf.for"> failures(suppress) {
    ^bb0(%loop: !transform.op<"scf.for">):
      %main, %rest = transform.loop.peel %loop : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
    }
    transform.sequence %columns : !transform.op<"scf.for"> failures(suppress) {
    ^bb0(%loop: !transform.op<"scf.for">):
      %main, %rest = transform.loop.peel %loop : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
    }
    %func = transform.structured.match ops{["func.func"]} in %root : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %func {
      transform.apply_patterns.linalg.fold_unit_extent_dims_via_slices
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    // Fills (of a tensor kernel's output, say) become plain loops, left to LLVM: vectorized
    // here, a fill is one transfer the size of its memref, unrolled into thousands of stores.
    %fills = transform.structured.match ops{["linalg.fill"]} in %func : (!transform.any_op) -> !transform.any_op
    %fill_loops = transform.structured.convert_to_loops %fills : (!transform.any_op) -> !transform.any_op
    %vectorized = transform.structured.vectorize_children_and_apply_patterns %func
        : (!transform.any_op) -> !transform.any_op
    // Folding the subviews into the transfers leaves the output block's read and write on
    // the function's argument with loop-invariant indices, which is what hoisting needs.
    transform.apply_patterns to %vectorized {
      transform.apply_patterns.vector.reduction_to_contract
      transform.apply_patterns.vector.transfer_permutation_patterns
      transform.apply_patterns.memref.fold_memref_alias_ops
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    %hoisted = transform.structured.hoist_redundant_vector_transfers %vectorized
        : (!transform.any_op) -> !transform.any_op
    // Transfers are unrolled to 1-d here: left to the default lowering, a 2-d transfer goes
    // through a stack buffer, and those grow the stack on every iteration of the loops.
    transform.apply_patterns to %hoisted {
      transform.apply_patterns.vector.lower_contraction lowering_strategy = "outerproduct"
      transform.apply_patterns.vector.lower_outerproduct
      transform.apply_patterns.vector.transfer_permutation_patterns
      transform.apply_patterns.vector.transfer_to_scf max_transfer_rank = 1 full_unroll = true
      transform.apply_patterns.vector.lower_transfer max_transfer_rank = 1
      transform.apply_patterns.vector.lower_shape_cast
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    transform.yield
  }
}
