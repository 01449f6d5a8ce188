"""SideStream: kernels that overlap the layer's main chain, on a second CUDA stream.

    with side.beside(x):      # issued on the second stream, after all work issued so far
        shared = ...
    ...                       # the main chain, issued meanwhile on the current stream
    side.join(shared)         # the current stream waits for the second one

join also marks the tensor as used on the current stream: it was allocated on the second
stream, and the caching allocator must not give its memory back to that stream while the
current one may still read it. CUDA graphs capture the fork and the join as they are. On a CPU
tensor both do nothing, and the work runs in order.
"""

import contextlib

import torch


class SideStream:
    """A second CUDA stream of the device of the tensors it is given, made on first use."""

    def __init__(self) -> None:
        self.stream: torch.cuda.Stream | None = None

    def __getstate__(self) -> dict:
        """A copy of the layer (copy.deepcopy, torch.save, pickle) makes its own stream on first
        use: a CUDA stream cannot be pickled, and the copy's kernels are its own."""
        return {"stream": None}

    @contextlib.contextmanager
    def beside(self, x: torch.Tensor):
        """Issue the block's kernels on the second stream, after the current stream's work."""
        if x.device.type != "cuda":
            yield
            return
        if self.stream is None or self.stream.device != x.device:
            self.stream = torch.cuda.Stream(x.device)
        self.stream.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(self.stream):
            yield

    def join(self, tensor: torch.Tensor) -> None:
        """Make the current stream wait for the second one, which produced `tensor`."""
        if tensor.device.type != "cuda":
            return
        current = torch.cuda.current_stream(tensor.device)
        assert self.stream is not None, "join() follows a beside() block on the same device"
        current.wait_stream(self.stream)
        tensor.record_stream(current)
