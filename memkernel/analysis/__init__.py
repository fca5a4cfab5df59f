"""The compiler's reading of a kernel at decoration (imported only when no cache answers): parsing, the
signature's types, which arguments the kernel may write, and the rules its ops put on their dims."""
