"""DVC stage entry points: ``python -m stages.<name> [args]``. Each reads params.yaml,
calls the library and writes its outputs atomically."""
