"""Which blocks of a region run whenever the region does, read off its control-flow graph.

An op in the entry block of a function runs on every call (that gets as far).
An op in another block of a ``cf`` control-flow graph runs only when a branch
leads there: the block behind ``cf.cond_br %big, ^store, ^done`` runs on some
calls and not others, as the body of an ``scf.if`` does. A block that every
path from the entry to an exit passes through runs on every call all the same:
the ``^done`` where the two branches meet again, or the rest of a function after
a call to a function of several blocks was inlined into it.

So a block runs whenever its region runs when it is the entry, or when it can
be reached from the entry but no exit can be reached from the entry without
passing through it (it post-dominates the entry). An exit is a block whose
terminator has no successor (``func.return``, ``scf.yield``).
"""

from __future__ import annotations

from mlir import ir


def _successors(block: ir.Block) -> list[ir.Block]:
    operations = list(block.operations)
    return list(operations[-1].operation.successors) if operations else []


class EveryRun:
    """Whether blocks lie on every path through their region, each block's answer computed once."""

    def __init__(self) -> None:
        self._answers: dict[ir.Block, bool] = {}

    def passes_through(self, block: ir.Block) -> bool:
        """Whether every run of ``block``'s region from its entry to an exit passes through ``block``."""
        answer = self._answers.get(block)
        if answer is None:
            answer = self._answers[block] = self._compute(block)
        return answer

    @staticmethod
    def _compute(block: ir.Block) -> bool:
        entry = block.region.blocks[0]
        if block == entry:
            return True
        reached = {entry}
        todo = [entry]
        while todo:
            successors = _successors(todo.pop())
            for successor in successors:
                if successor not in reached:
                    reached.add(successor)
                    todo.append(successor)
        if block not in reached:
            return False  # never runs
        avoiding = {entry}
        todo = [entry]
        while todo:
            successors = _successors(todo.pop())
            if not successors:
                return False  # an exit, reached without passing through the block
            for successor in successors:
                if successor != block and successor not in avoiding:
                    avoiding.add(successor)
                    todo.append(successor)
        return True
