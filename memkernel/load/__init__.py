"""Loading compiled kernels, with no compiler: the process and disk caches, the object loader, the libraries."""
