"""Turning a kernel into machine code (imported only when something must be compiled): pipelines and
presets, the compile worker, lowering and code generation, and what decoration and a first call ask of it."""
