"""Capture a layer's forward in a CUDA graph, for the GPU tests and the benchmarks (no package
imports it, so none ships it)."""

import torch


def capture(run, warmup: int):
    """Capture run() in a CUDA graph; return the graph's replay and the output of the captured
    run (its memory belongs to the graph: each replay writes it again). The `warmup` runs before
    the capture go on a side stream, as torch's CUDA graph notes ask, so that kernels compile
    and memory is allocated outside the capture."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    return graph.replay, out
