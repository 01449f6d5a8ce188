"""The files of one generated package, from the plan alone.

Stage functions are rendered through the registry (moec/codegen/functions.py); the package
files around them (stages.py, layer.py, weights.py, the activation, the tiles) from their
templates; the runtime modules the renderers name are copied from moec/runtime/ with the
modules they import. Nothing here decides: every value comes from the plan.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from moec.codegen.functions import render_stages, side_stream_stages, with_split
from moec.codegen.render import WIDTH, environment, literal, render, wrap
from moec.plan.activations import lower
from moec.plan.graph import Plan
from moec.plan.placement import physical_to_logical
from moec.plan.sizes import dim, symbols
from moec.plan.stages import Gemm, Select
from moec.plan.tuning import COMBINE_DECODE_ROWS
from moec.version import __version__

RUNTIME_DIR = Path(__file__).resolve().parent.parent / "runtime"
GENERATED_MODULES = ("gated_activation", "tiles")
"""Package modules rendered per plan; every other module a renderer names is copied."""
WEIGHT_MODULES = ("expert_weights", "progress")
"""Modules every package uses to load and initialize its weights (and report it on a terminal)."""
CHECK_MODULES = ("self_check",)
"""Modules of every package's `python -m <package>.check` (with those they import)."""
COPY_MARK = "# A verbatim copy of moec/runtime/"
_RELATIVE_IMPORT = re.compile(r"^from \.(\w*) import (.+)$", re.MULTILINE)


def python_sources(plan: Plan) -> dict[str, str]:
    """Every Python file of the package, unformatted: file name -> source."""
    jinja = environment()
    rendered = render_stages(jinja, plan, set(WEIGHT_MODULES))
    if plan.above is not None:
        rendered = with_split(plan, rendered, render_stages(jinja, plan.above, set()))
    functions, bindings, imports, modules = (
        rendered.functions,
        rendered.bindings,
        rendered.imports,
        rendered.modules,
    )
    stage_modules = sorted(modules - set(WEIGHT_MODULES))
    common = _common_fields(plan, rendered.pipeline)
    sources = {
        "__init__.py": render(jinja, "package/__init__.py.j2", common),
        "layer.py": render(
            jinja, "package/layer.py.j2", {**common, **_layer_fields(plan, rendered.calls)}
        ),
        "stages.py": render(
            jinja,
            "package/stages.py.j2",
            {
                **common,
                "imports": _import_lines(imports, stage_modules),
                "bindings": list(bindings.items()),
                "stages": functions,
            },
        ),
        "weights.py": render(jinja, "package/weights.py.j2", {**common, **_weight_fields(plan)}),
    }
    if "gated_activation" in modules:
        sources["gated_activation.py"] = _activation_module(jinja, plan, common, modules)
    if "tiles" in modules:
        sources["tiles.py"] = render(jinja, "package/tiles.py.j2", {**common, **_tile_fields(plan)})
    sources["check.py"] = render(jinja, "package/check.py.j2", common)
    layer_modules = {"streams"} if side_stream_stages(plan) else set()
    if plan.layer.record_load:
        layer_modules.add("load_record")
    for module in runtime_closure(
        (modules - set(GENERATED_MODULES)) | set(CHECK_MODULES) | layer_modules
    ):
        sources[f"{module}.py"] = _runtime_copy(jinja, module, common)
    return sources


def runtime_closure(modules: set[str]) -> list[str]:
    """`modules` of moec/runtime/ and every runtime module they import, sorted."""
    found, todo = set(), list(modules)
    while todo:
        module = todo.pop()
        if module in found:
            continue
        found.add(module)
        source = (RUNTIME_DIR / f"{module}.py").read_text(encoding="utf-8")
        for origin, names in _RELATIVE_IMPORT.findall(source):
            todo += [origin] if origin else [n.strip() for n in names.split(",")]
    return sorted(found)


def _runtime_copy(jinja, module: str, common: dict[str, Any]) -> str:
    header = render(jinja, "package/header.j2", common)
    source = (RUNTIME_DIR / f"{module}.py").read_text(encoding="utf-8")
    return f"{header}{COPY_MARK}{module}.py.\n{source}"


def _import_lines(statements: set[str], modules: list[str]) -> list[str]:
    """Standard-library imports, torch, then this package's modules (isort's order)."""
    plain = sorted(s for s in statements if not s.startswith("import torch"))
    torch_lines = ["import torch", *sorted(s for s in statements if s.startswith("import torch"))]
    lines = [*plain, *([""] if plain else []), *torch_lines]
    if modules:
        lines += ["", f"from . import {', '.join(modules)}"]
    return lines


def _legend(plan: Plan) -> str:
    """The named dims of the shapes in the code's comments and docstrings, once, with their
    values (the plan's symbols, moec/plan/sizes.py)."""
    layer = plan.layer
    dims = {
        s
        for stage in plan.order()
        for t in (*stage.outputs.values(), *stage.weights.values())
        for s in t.shape
    }
    lines = [
        f"T tokens, H = {layer.hidden} hidden, I = {layer.intermediate} intermediate per "
        f"expert{' on this rank' if layer.tp > 1 else ''} (2I: gate and up)."
    ]
    routed = f"{layer.routed_experts} routed experts"
    if layer.fused_shared:
        shared = (
            "the shared expert" if layer.n_shared == 1 else f"the {layer.n_shared} shared experts"
        )
        ids = (
            f"expert {layer.local_experts}"
            if layer.n_shared == 1
            else f"experts {layer.local_experts}.."
        )
        lines.append(
            f"E: {routed} in the router's [T, E]; {layer.grouped_experts} in the grouped "
            f"layout and the expert weights ({layer.local_experts} routed"
            f"{' on this rank' if layer.ep > 1 else ''} + {shared}, fused as {ids}). "
            f"K = {layer.grouped_top_k} rows per token (top-{layer.top_k} and {layer.n_shared} shared)."
        )
    else:
        here = (
            f"; {layer.local_experts} of them on this rank in the grouped layout"
            if layer.ep > 1
            else ""
        )
        lines.append(f"E: {routed}{here}. K = {layer.top_k} top-k.")
    if "Is" in dims:
        lines.append(f"Is = {layer.shared_intermediate}: the shared experts' intermediate.")
    if "Kr" in dims:
        lines.append(f"Kr = {layer.top_k}: the routed experts of a token.")
    if "S" in dims:
        lines.append("S: the router's split-K parts (per token bucket, tiles.py).")
    if "V" in dims:
        lines.append(f"V = {layer.vocab}: the token ids the hash table maps.")
    if "T*K" in dims:
        lines.append("T*K: one entry per (token, expert) sent to another rank.")
    rows = "E x max_m" if plan.backends.layout == "masked" else "M"
    lines.append(f"{rows} rows of the grouped layout ({plan.backends.layout}).")
    return "Shapes:\n" + "\n".join(
        "\n".join(wrap(line, WIDTH, first="    ", then="      ")) for line in lines
    )


def _common_fields(plan: Plan, pipeline: str) -> dict[str, Any]:
    layer = plan.layer
    return {
        "version": __version__,
        "name": plan.name,
        "hash": plan.spec_hash,
        "description": plan.description,
        "device": layer.device,
        "dtype": layer.dtype.torch,
        "hidden": layer.hidden,
        "pipeline": pipeline,
        "legend": _legend(plan),
    }


def _layer_fields(plan: Plan, calls: list[str]) -> dict[str, Any]:
    layer = plan.layer
    world = layer.tp * layer.ep
    kind = "tensor" if layer.tp > 1 else "expert" if layer.ep > 1 else "one"
    shared = " plus the shared experts" if layer.n_shared else ""
    return {
        "world": world,
        "world_doc": f"{kind}-parallel ranks" if world > 1 else "one rank",
        "empty_returns_early": layer.ep == 1,
        "side_stream": bool(side_stream_stages(plan)),
        "workspace": bool(workspace(plan)),
        "scratch": scratch(plan),
        "tables": bool(tables(plan)),
        "record_load": layer.record_load,
        "router_parts": _router_parts(plan),
        "sum_load": layer.ep > 1,  # each expert-parallel rank routes its own tokens
        "routed_experts": layer.routed_experts,
        "calls": calls,
        "forward_doc": f"Route each token to its top-{layer.top_k} experts and return the "
        f"weighted sum{shared}."
        + (
            " The experts of a token are tid2eid[token_id] (token_ids [T], int64 or int32)."
            if layer.hashed
            else ""
        ),
        "vocab": layer.vocab,
        "pickled_as_bytes": _pickled_as_bytes(plan),
        # Triton kernels built for a GPU: a CPU layer would fail in Triton's driver lookup
        "triton_needs_cuda": layer.device == "cuda" and "triton" in plan.requires,
    }


def _pickled_as_bytes(plan: Plan) -> list[str]:
    """The torch names of the dtypes of the layer's tensors that a pickled layer carries as
    uint8 bytes (DType.pickled_as_bytes)."""
    tensor_types = [
        tensor_type
        for stage in plan.order()
        for tensor_type in (*stage.weights.values(), *stage.workspace.values())
    ]
    return sorted({t.dtype.torch for t in tensor_types if t.dtype.pickled_as_bytes})


def _weight_format(fmt, dtype: str) -> str:
    block = tuple(fmt.weight_block) if fmt.weight_block else None
    source = f", source={literal(fmt.source)}" if fmt.source else ""
    return (
        f"WeightFormat(scheme={literal(fmt.scheme)}, block={literal(block)}, "
        f"pow2_scales={literal(fmt.pow2_scales)}, checkpoint_quantized={literal(fmt.checkpoint_quantized)}, "
        f"static={literal(fmt.static)}, dtype=torch.{dtype}{source})"
    )


def _router_parts(plan: Plan) -> bool:
    """Whether the layer holds the router weight as bf16 parts whose use it counts."""
    return any(
        held.in_use == "router_parts" for stage in plan.order() for held in stage.weights.values()
    )


def _weight_fields(plan: Plan) -> dict[str, Any]:
    layer = plan.layer
    dtype = layer.dtype.torch
    select = plan.stage("select", Select)
    values: list[tuple[str, object]] = [
        ("hidden", layer.hidden),
        ("intermediate", layer.intermediate * layer.tp),
        ("routed_experts", layer.routed_experts),
        ("local_experts", layer.local_experts),
        ("n_shared", layer.n_shared),
        ("shared_intermediate", layer.shared_intermediate * layer.tp),
        ("tp", layer.tp),
        ("ep", layer.ep),
        ("has_bias", select.has_bias),
        ("router_parts", _router_parts(plan)),
        ("fused_shared", layer.fused_shared),
    ]
    if layer.placed:
        values.append(("physical_to_logical", tuple(physical_to_logical(layer.placement))))
    rows = [(key, literal(value)) for key, value in values]
    rows.append(("routed", _weight_format(layer.routed, dtype)))
    rows.append(("shared", _weight_format(layer.shared, dtype) if layer.n_shared else "None"))
    if layer.hashed:
        rows.append(("hash_table", literal((layer.vocab, layer.top_k))))
    return {
        "parameters": parameters(plan),
        "workspace": workspace(plan),
        "tables": tables(plan),
        "layer_weights": rows,
        "router_parts": _router_parts(plan),
        "doc": _weights_doc(plan),
    }


def _weights_doc(plan: Plan) -> str:
    layer = plan.layer
    lines = [f"Routed experts: {layer.routed.label()}"]
    if layer.routed.quantized and not layer.routed.checkpoint_quantized:
        lines[-1] += ", quantized on load from a bf16 checkpoint"
    if layer.n_shared:
        where = (
            f", stored as experts {layer.local_experts}..{layer.grouped_experts - 1}"
            if layer.fused_shared
            else ""
        )
        lines.append(f"Shared experts: {layer.shared.label()}{where}")
    return ".\n".join(lines) + "."


def parameters(plan: Plan) -> list[dict[str, Any]]:
    """(name, shape, dtype) of every weight, with this rank's sizes."""
    layer = plan.layer
    rows = []
    for stage in plan.order():
        table = symbols(layer, 0)
        # "E" of the grouped GEMMs' weights is this rank's experts (with fused shared experts);
        # elsewhere (the router) it is every routed expert.
        table["E"] = layer.grouped_experts if isinstance(stage, Gemm) else layer.routed_experts
        for name, tensor_type in stage.weights.items():
            shape = tuple(dim(d, table) for d in tensor_type.shape)
            rows.append({"name": name, "shape": shape, "dtype": tensor_type.dtype.torch})
    return rows


def workspace(plan: Plan) -> list[dict[str, Any]]:
    """(name, shape, dtype) of every buffer the stages keep between calls."""
    table = symbols(plan.layer, 0)
    return [
        {"name": name, "shape": tuple(dim(d, table) for d in tensor_type.shape),
         "dtype": tensor_type.dtype.torch}
        for stage in plan.order()
        for name, tensor_type in stage.workspace.items()
    ]  # fmt: skip


def scratch(plan: Plan) -> list[str]:
    """The workspace buffers the kernels leave zero (the plan's stages say which): zeroed again
    when the weights are set."""
    return [name for stage in plan.order() for name in stage.zeroed_workspace()]


def tables(plan: Plan) -> list[dict[str, Any]]:
    """Workspace buffers filled with constants when the layer is made: (name, values, whether
    the values hold one row per rank, of which the layer takes its own)."""
    return [
        {"name": name, "rows": values, "per_rank": per_rank}
        for stage in plan.order()
        for per_rank, named in ((False, getattr(stage, "tables", ())),
                                (True, getattr(stage, "rank_tables", ())))
        for name, values in named
    ]  # fmt: skip


def _activation_module(jinja, plan: Plan, common: dict[str, Any], modules: set[str]) -> str:
    layer = plan.layer
    values = dict(layer.activation_values)
    triton = any(m.startswith("triton_") for m in runtime_closure(modules - set(GENERATED_MODULES)))
    sections = [
        render(
            jinja,
            "package/gated_torch.py.j2",
            {"kind": layer.activation, "lines": lower(layer.activation, values, "torch").lines},
        )
    ]
    imports = ["import torch"]
    if triton:
        imports += ["import triton", "import triton.language as tl"]
        sections.append(
            render(
                jinja,
                "package/gated_triton.py.j2",
                {
                    "kind": layer.activation,
                    "lines": lower(layer.activation, values, "triton").lines,
                },
            )
        )
    doc = (
        f"The gated activation of the {plan.name} layer ({layer.activation}), lowered to torch"
        + (" and Triton" if triton else "")
        + " from its one definition in moec/plan/activations.py."
    )
    return render(
        jinja,
        "package/module.py.j2",
        {**common, "doc": doc, "imports": imports, "sections": [s.rstrip("\n") for s in sections]},
    )


def _tile_fields(plan: Plan) -> dict[str, Any]:
    tiles = plan.tiles
    assert tiles is not None, "tiles.py is rendered only for a plan with tiles"
    return {
        "source": tiles.source,
        "buckets": tiles.buckets,
        "permute": tiles.permute,
        "act": tiles.act,
        "combine": tiles.combine,
        "combine_decode": tiles.combine_decode,
        "combine_decode_rows": COMBINE_DECODE_ROWS,
        "routers": tiles.routers,
        "pdl": tiles.pdl,
        "received_per_token": tiles.received_per_token,
    }
