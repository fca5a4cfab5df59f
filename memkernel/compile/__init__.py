"""Turning a kernel into machine code: pipelines and presets, the JIT engine, object loading,
runtime libraries and the compile caches."""
