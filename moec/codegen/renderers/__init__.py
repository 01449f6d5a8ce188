"""Every renderer moec has, one module per backend; importing this package registers them."""

from moec.codegen.renderers import (  # noqa: F401
    deep_ep,
    deep_gemm,
    distributed,
    torch_stages,
    triton_stages,
)
