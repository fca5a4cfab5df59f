"""What is read from the MLIR source at decoration: the module, the signature, the element types,
which arguments the kernel may write, and each argument's contract."""
