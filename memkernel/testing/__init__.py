"""Testing kernels and lowerings with pytest and hypothesis.

Import it explicitly (``import memkernel.testing``): it needs hypothesis, which
``import memkernel`` does not.

- :func:`arguments`: a hypothesis strategy of valid argument tuples for a kernel.
- :func:`assert_matches`: call a kernel and check it against a numpy reference.
- :func:`check_equivalent`: check on drawn arguments that two kernels (or one
  source under two pipelines) compute the same thing.
"""

from .compare import assert_matches, default_tolerance
from .copies import layout_copy
from .equivalence import check_equivalent
from .strategies import arguments, default_elements

__all__ = ["arguments", "assert_matches", "check_equivalent", "default_elements", "default_tolerance",
           "layout_copy"]
