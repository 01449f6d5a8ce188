"""Every renderer moec has, one module per backend; importing this package registers them."""

from moec.codegen.renderers import distributed, torch_stages, triton_stages  # noqa: F401
