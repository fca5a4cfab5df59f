// The "fast" preset's strategy for linalg.matmul on memrefs (f32 and f64).
//
// The BLAS scheme, in transform ops. C is cut into {blocks} block(s) of rows, one per
// worker, each by panels of {register_columns} columns (two host vectors); for each, the
// panel of B it needs (all of K by {register_columns} columns) is copied into a buffer of
// its own, 64-byte aligned and contiguous, so the inner loop reads B at unit stride from
// one aligned stream whatever the caller's layout and alignment. The block's panel is then
// cut into register tiles of {register_rows} rows by the panel's columns, one step of K at
// a time: vectorized to broadcast-and-FMA outer products, with the C tile hoisted out of
// the K loop so it stays in registers for the whole of K. Blocks as tall as they can be
// pack each panel of B the fewest times: measured, that costs more than A's rows leaving
// the L2 cache (128-row blocks ran 2048^3 f32 at 0.77 of OpenBLAS, whole columns at 0.95).
//
// Every loop is peeled so that all tiles have static shapes, and the partial ones are
// re-tiled to unit size in the ragged dimension (a row of C, a column of the panel):
// every tile is vectorized, none is left to the default lowering. That matters beyond
// speed: hoisting C out of the K loop requires that nothing else in the loop nest view C
// through a subview, which an unvectorized remainder tile would.
//
// {tiling} names the sequence that cuts the matmul into register tiles: @pack_panels, the
// scheme above; @tile_rows for a static M of fewer rows than a register tile, which reads
// B in place (@tile_one_row for a static M of 1, which also cuts K); or @split_rows for a
// dynamic M, which gives its rows to the one or the other depending on M, at run time. The
// blocks of rows form an scf.forall; {distribution} says whether it runs in order or its
// blocks are tasks on the async runtime's workers.
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.consumed}) {
    %func = transform.structured.match ops{["func.func"]} in %root : (!transform.any_op) -> !transform.any_op
    %matmul = transform.structured.match ops{["linalg.matmul"]} in %func : (!transform.any_op) -> !transform.any_op
    transform.include @{tiling} failures(propagate) (%func, %matmul) : (!transform.any_op, !transform.any_op) -> ()
    // Then one step of K at a time, innermost: the C tile is the same for the whole loop.
    %register_tiles = transform.structured.match ops{["linalg.matmul"]} in %func
        : (!transform.any_op) -> !transform.any_op
    transform.foreach %register_tiles : !transform.any_op {
    ^bb0(%register_tile: !transform.any_op):
      %step, %depth = transform.structured.tile_using_for %register_tile tile_sizes [0, 0, 1]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    }
    transform.apply_patterns to %func {
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    // Fills (of a tensor kernel's output, say) become plain loops, left to LLVM: vectorized
    // here, a fill is one transfer the size of its memref, unrolled into thousands of stores.
    %fills = transform.structured.match ops{["linalg.fill"]} in %func : (!transform.any_op) -> !transform.any_op
    %fill_loops = transform.structured.convert_to_loops %fills : (!transform.any_op) -> !transform.any_op
    %vectorized = transform.structured.vectorize_children_and_apply_patterns %func
        : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %vectorized {
      transform.apply_patterns.vector.reduction_to_contract
      transform.apply_patterns.vector.transfer_permutation_patterns
      transform.apply_patterns.memref.fold_memref_alias_ops
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    // The C tile's read and write now index the argument directly; made loop-invariant and
    // identical, the pair is hoisted out of the K loop.
    %all_loops = transform.structured.match ops{["scf.for"]} in %vectorized : (!transform.any_op) -> !transform.any_op
    transform.apply_licm to %all_loops : !transform.any_op
    transform.apply_cse to %vectorized : !transform.any_op
    %hoisted = transform.structured.hoist_redundant_vector_transfers %vectorized
        : (!transform.any_op) -> !transform.any_op
    // Transfers are unrolled to 1-d here: left to the default lowering, a 2-d transfer goes
    // through a stack buffer allocated inside the loops, which grows the stack.
    transform.apply_patterns to %hoisted {
      transform.apply_patterns.vector.lower_contraction lowering_strategy = "outerproduct"
      transform.apply_patterns.vector.lower_outerproduct
      transform.apply_patterns.vector.transfer_permutation_patterns
      transform.apply_patterns.vector.transfer_to_scf max_transfer_rank = 1 full_unroll = true
      transform.apply_patterns.vector.lower_transfer max_transfer_rank = 1
      transform.apply_patterns.vector.lower_shape_cast
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    transform.include @{distribution} failures(propagate) (%root) : (!transform.any_op) -> ()
    transform.yield
  }

  // Blocks of rows, B's panels packed, register tiles (see the top of the file).
  transform.named_sequence @pack_panels(%func: !transform.any_op {transform.readonly},
                                        %matmul: !transform.any_op {transform.consumed}) {
    // The blocks of rows, an scf.forall: its iterations are independent, and run on the
    // workers when the kernel is parallel (see @run_blocks_on_workers).
    %block, %blocks = transform.structured.tile_using_forall %matmul num_threads [{blocks}, 0, 0]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.include @pack_block failures(propagate) (%func, %block) : (!transform.any_op, !transform.any_op) -> ()
    transform.yield
  }

  // A block's panels, packed, and its register tiles.
  transform.named_sequence @pack_block(%func: !transform.any_op {transform.readonly},
                                       %block: !transform.any_op {transform.consumed}) {
    %panel, %columns = transform.structured.tile_using_for %block tile_sizes [0, {register_columns}, 0]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    %promoted = transform.structured.promote %panel { operands_to_promote = [1], alignment = 64 }
        : (!transform.any_op) -> !transform.any_op
    // Marked, so that the register tiles below are cut from these panels only (and not from
    // the rows @split_rows gave @tile_rows); the mark stays on the copies tiling and peeling make.
    transform.annotate %promoted "memkernel.packed" : !transform.any_op
    // The packing copies, one row of the panel at a time (unrolled whole, a long panel
    // would make code LLVM takes seconds to compile).
    %copies = transform.structured.match ops{["linalg.copy"]} in %func : (!transform.any_op) -> !transform.any_op
    transform.foreach %copies : !transform.any_op {
    ^bb0(%copy: !transform.any_op):
      %copy_row, %copy_loop = transform.structured.tile_using_for %copy tile_sizes [1, 0]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    }
    // A loop whose trip count divides evenly has nothing to peel, which is not a failure here.
    // The last panel, narrower than a register tile, is done {leftover_columns} column(s) at a
    // time: one when shapes are dynamic; with static shapes its width is static, and a tile
    // as wide as the panel leaves it whole.
    transform.sequence %columns : !transform.any_op failures(suppress) {
    ^bb0(%loop: !transform.any_op):
      %for = transform.cast %loop : !transform.any_op to !transform.op<"scf.for">
      %main, %rest = transform.loop.peel %for : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
      transform.foreach %rest : !transform.any_op {
      ^bb1(%rest_loop: !transform.any_op):
        %narrow = transform.structured.match ops{["linalg.matmul"]} in %rest_loop : (!transform.any_op) -> !transform.any_op
        transform.foreach %narrow : !transform.any_op {
        ^bb2(%op: !transform.any_op):
          %column, %column_loop = transform.structured.tile_using_for %op tile_sizes [0, {leftover_columns}, 0]
              : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        }
      }
    }
    transform.apply_patterns to %func {
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    // Register tiles; the rows left over at the end of a block are done one row at a time
    // (a block's height is dynamic, the last block's being what is left of M).
    %tiles = transform.structured.match ops{["linalg.matmul"]} attributes {memkernel.packed} in %func
        : (!transform.any_op) -> !transform.any_op
    transform.foreach %tiles : !transform.any_op {
    ^bb0(%tile: !transform.any_op):
      %micro, %rows, %cols = transform.structured.tile_using_for %tile tile_sizes [{register_rows}, {register_columns}, 0]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op)
      transform.sequence %rows : !transform.any_op failures(suppress) {
      ^bb1(%loop: !transform.any_op):
        %for = transform.cast %loop : !transform.any_op to !transform.op<"scf.for">
        %main, %rest = transform.loop.peel %for : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
        transform.foreach %rest : !transform.any_op {
        ^bb2(%rest_loop: !transform.any_op):
          %leftover = transform.structured.match ops{["linalg.matmul"]} in %rest_loop : (!transform.any_op) -> !transform.any_op
          transform.foreach %leftover : !transform.any_op {
          ^bb3(%left: !transform.any_op):
            %single, %single_rows = transform.structured.tile_using_for %left tile_sizes [1, 0, 0]
                : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          }
        }
      }
    }
    transform.yield
  }

  // A static M below a register tile's rows: one tile of all M rows by {row_columns} columns
  // at a time, reading B in place. Packing a panel would cost as much as the few rows it
  // serves.
  transform.named_sequence @tile_rows(%func: !transform.any_op {transform.readonly},
                                      %matmul: !transform.any_op {transform.consumed}) {
    %tile, %columns = transform.structured.tile_using_for %matmul tile_sizes [0, {row_columns}, 0]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.sequence %columns : !transform.any_op failures(suppress) {
    ^bb0(%loop: !transform.any_op):
      %for = transform.cast %loop : !transform.any_op to !transform.op<"scf.for">
      %main, %rest = transform.loop.peel %for : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
      transform.foreach %rest : !transform.any_op {
      ^bb1(%rest_loop: !transform.any_op):
        %narrow = transform.structured.match ops{["linalg.matmul"]} in %rest_loop : (!transform.any_op) -> !transform.any_op
        transform.foreach %narrow : !transform.any_op {
        ^bb2(%op: !transform.any_op):
          %column, %column_loop = transform.structured.tile_using_for %op tile_sizes [0, {leftover_columns}, 0]
              : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
        }
      }
    }
    transform.yield
  }

  // One row of A (a static M of 1, or a dynamic M's few rows one at a time): K is first cut
  // into steps of {row_depth}, outermost, so that each step reads {row_depth} rows of B from
  // end to end (as OpenBLAS's sgemv does) while the row of C stays in the L1 cache, loaded
  // and stored once per step. Left to @tile_rows alone, each tile of columns would walk all
  // of K down B's columns, a stride of a whole row of B per step.
  transform.named_sequence @tile_one_row(%func: !transform.any_op {transform.readonly},
                                         %matmul: !transform.any_op {transform.consumed}) {
    %deep, %depths = transform.structured.tile_using_for %matmul tile_sizes [0, 0, {row_depth}]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.include @tile_rows failures(propagate) (%func, %deep) : (!transform.any_op, !transform.any_op) -> ()
    transform.yield
  }

  // A dynamic M: the rows before the split point memkernel computes, M when M is below the
  // register rows and else 0, take @tile_one_row one row at a time; the others @pack_panels.
  // So a few rows, which packing B would cost as much as computing, are not packed, and a
  // large M costs one comparison more.
  transform.named_sequence @split_rows(%func: !transform.any_op {transform.readonly},
                                       %matmul: !transform.any_op {transform.consumed}) {
    %point = transform.structured.match ops{["arith.select"]} attributes {memkernel.few_rows} in %func
        : (!transform.any_op) -> !transform.any_op
    %parts = transform.structured.split %matmul after %point {dimension = 0} : !transform.any_op, !transform.any_op
    %few, %many = transform.split_handle %parts : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    %row, %rows = transform.structured.tile_using_for %few tile_sizes [1, 0, 0]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.include @tile_one_row failures(propagate) (%func, %row) : (!transform.any_op, !transform.any_op) -> ()
    // Blocks of a size memkernel computes: the same as @pack_panels's, but none when no row
    // is left, where @pack_panels's would be a block of no rows that still packs B.
    %size = transform.structured.match ops{["arith.maxui"]} attributes {memkernel.block_rows} in %func
        : (!transform.any_op) -> !transform.any_op
    %block, %blocks = transform.structured.tile_using_forall %many tile_sizes [%size, 0, 0]
        : (!transform.any_op, !transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.include @pack_block failures(propagate) (%func, %block) : (!transform.any_op, !transform.any_op) -> ()
    transform.yield
  }

  // Serial: one block, whose scf.forall the pipeline turns into an scf.for.
  transform.named_sequence @run_blocks_in_order(%root: !transform.any_op {transform.consumed}) {
    transform.yield
  }

  // Parallel: the blocks are tasks for the async runtime's {workers} workers. Done here, not
  // by the pipeline's async-parallel-for, whose minimum task of 1024 iterations suits
  // elementwise loops but would leave a few large blocks to a single task.
  transform.named_sequence @run_blocks_on_workers(%root: !transform.any_op {transform.consumed}) {
    %blocks = transform.structured.match ops{["scf.forall"]} in %root : (!transform.any_op) -> !transform.any_op
    transform.foreach %blocks : !transform.any_op {
    ^bb0(%forall: !transform.any_op):
      %parallel = transform.loop.forall_to_parallel %forall : (!transform.any_op) -> !transform.any_op
    }
    %tasks = transform.apply_registered_pass "async-parallel-for"
        with options = { "async-dispatch" = false, "num-workers" = {workers} : i64, "min-task-size" = 1 : i64 }
        to %root : (!transform.any_op) -> !transform.any_op
    transform.yield
  }
}
