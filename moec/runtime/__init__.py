"""Plain modules copied verbatim into generated packages.

They import only the standard library, torch, triton, numpy, safetensors and each other (relative
imports), never `moec`, so a generated package runs where moec is not installed. The codegen
copies the modules a plan's renderers name (and what those import); lint and tests read them
here, as ordinary code.
"""
