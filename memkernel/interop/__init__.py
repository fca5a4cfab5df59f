"""The kernel in other array libraries: a torch custom op (:mod:`.torch_op`), a JAX function
(:mod:`.jax_function`), both planned from the kernel's spec (:mod:`.op_plan`). Imported when asked for, each
module imports its library then."""
