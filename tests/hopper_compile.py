"""Record the Triton launches of a generated layer under the interpreter, then compile each for
Hopper (sm_90) without a GPU. Run by tests/test_hopper_compile.py, one process per mode (the
interpreter is chosen when Triton is imported):

    TRITON_INTERPRET=1 python tests/hopper_compile.py record PACKAGE TOKENS,... OUT.json
    TRITON_INTERPRET=0 python tests/hopper_compile.py compile IN.json

A recorded launch is the kernel (module and name), each argument's Triton type (`*bf16`, `i32`,
...), the constexpr values and the launch options. Compiling sets the constexprs that only the
interpreter sets as a GPU sets them: SOFT_ROUND and UPCAST off, PDL on (with launch_pdl).
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import time

OPTIONS = ("num_warps", "num_stages", "launch_pdl")
ON_A_GPU = {"SOFT_ROUND": False, "UPCAST": False, "PDL": True}


def _constant(value, name: str):
    """A constexpr value as JSON: plain values as they are, a jit function by module and name."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    fn = getattr(value, "fn", None)
    if fn is not None:  # a @triton.jit function passed as a constexpr (the activation)
        return {"jit": [fn.__module__, fn.__name__]}
    raise TypeError(f"constexpr {name} = {value!r}: no JSON form for it")


def _describe(fn, args, kwargs) -> dict:
    import triton.language as tl
    from triton.runtime.jit import mangle_type

    options = {key: kwargs.pop(key) for key in OPTIONS if key in kwargs}
    signature = inspect.signature(fn)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    types, constants = {}, {}
    for name, parameter in signature.parameters.items():
        value = bound.arguments[name]
        kind = "constexpr" if parameter.annotation is tl.constexpr else mangle_type(value)
        types[name] = kind
        if kind == "constexpr":
            constants[name] = _constant(value, name)
    return {
        "kernel": [fn.__module__, fn.__name__],
        "types": types,
        "constants": constants,
        "options": options,
    }


def record(package: str, tokens: list[int], out: str) -> None:
    import torch
    from triton.runtime import interpreter

    launches = []
    run = interpreter.InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        launches.append(_describe(self.fn, args, dict(kwargs)))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    interpreter.InterpretedFunction.run = recording_run
    layer_module = importlib.import_module(f"{package}.layer")
    layer = layer_module.MoELayer().random_(0)
    for count in tokens:
        x = torch.randn(count, layer_module.HIDDEN, generator=torch.Generator().manual_seed(count))
        layer(x.bfloat16())
    distinct = {json.dumps(launch, sort_keys=True) for launch in launches}
    with open(out, "w") as f:
        json.dump([json.loads(launch) for launch in sorted(distinct)], f)


def _resolve(value):
    if isinstance(value, dict) and "jit" in value:
        module, name = value["jit"]
        return getattr(importlib.import_module(module), name)
    return value


def compile_all(path: str) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    with open(path) as f:
        launches = json.load(f)
    target = GPUTarget("cuda", 90, 32)
    failed = 0
    for launch in launches:
        module, name = launch["kernel"]
        kernel = getattr(importlib.import_module(module), name)
        constants = {key: _resolve(value) for key, value in launch["constants"].items()}
        constants.update({key: value for key, value in ON_A_GPU.items() if key in constants})
        options = dict(launch["options"])
        if constants.get("PDL"):
            options["launch_pdl"] = True
        names = kernel.arg_names  # the recorded types are sorted by name
        source = ASTSource(
            kernel,
            {key: launch["types"][key] for key in names},
            {(names.index(key),): value for key, value in constants.items()},
        )
        start = time.perf_counter()
        try:
            triton.compile(source, target=target, options=options)
        except Exception as error:  # noqa: BLE001  (every failure is reported, then the exit code)
            failed += 1
            lines = str(error).strip().splitlines()  # the compiler's message ends with its cause
            print(
                f"FAILED {module}.{name} {launch['constants']}: {lines[-1] if lines else error!r}"
            )
            continue
        print(f"compiled {name} in {time.perf_counter() - start:.1f} s")
    print(f"{len(launches) - failed} of {len(launches)} launches compiled for sm_90")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    if sys.argv[1] == "record":
        record(sys.argv[2], [int(t) for t in sys.argv[3].split(",")], sys.argv[4])
    else:
        compile_all(sys.argv[2])
