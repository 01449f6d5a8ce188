"""Expert placement: which logical expert each physical expert of each expert-parallel rank
holds (`parallel.placement`), read from a `moec eplb` file or made evenly, and checked.

A placement is a list of ep_size lists, rank by rank, of logical expert ids; every rank holds
as many physical experts, (n_routed_experts + redundant_experts) / ep_size, and the physical id
of rank r's j-th expert is r * that + j. No torch here: the plan and `moec eplb` use it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from moec.errors import Problem, problem, shown_path

FORMAT = "moec-placement"
"""The `format` of a placement file."""
KEY = "parallel.placement"


def even(experts: int, redundant: int, ranks: int) -> list[list[int]]:
    """The even placement: physical expert p holds logical expert p mod experts, laid out rank
    by rank (without redundancy, rank r holds r * E/ranks .. in order; replicas of experts
    0, 1, .. fill the slots after the last expert)."""
    physical = experts + redundant
    per_rank = physical // ranks
    return [[p % experts for p in range(r * per_rank, (r + 1) * per_rank)] for r in range(ranks)]


def of(parallel, experts: int) -> list[list[int]]:
    """The placement of a checked spec's [parallel] table, rank by rank."""
    if parallel.placement == "even":
        return even(experts, parallel.redundant_experts, parallel.ep_size)
    return [list(rank) for rank in parallel.placement]


def problems(placement: list[list[int]], experts: int, redundant: int, ranks: int) -> list[str]:
    """What is wrong with `placement` for this layer (empty: nothing)."""
    if not any(placement):  # one mistake: the consequences below would each repeat it
        held = f"{experts + redundant} physical experts on {ranks} rank{'s' * (ranks > 1)}"
        return [f"places no experts, the layer has {held}"]
    found = []
    if len(placement) != ranks:
        found.append(f"has {len(placement)} ranks, the layer ep_size = {ranks}")
    physical = experts + redundant
    sizes = sorted({len(rank) for rank in placement})
    if len(sizes) > 1:
        found.append(f"ranks hold different numbers of experts ({', '.join(map(str, sizes))})")
    total = sum(len(rank) for rank in placement)
    if total != physical:
        found.append(
            f"places {total} physical experts, the layer has {physical} (n_routed_experts "
            f"{experts} + redundant_experts {redundant})"
        )
    unknown = sorted({e for rank in placement for e in rank if e >= experts})
    if unknown:
        found.append(f"names experts {_ids(unknown)}, beyond the {experts} routed experts")
    placed = {e for rank in placement for e in rank}
    absent = [e for e in range(experts) if e not in placed]
    if absent:
        found.append(f"leaves experts {_ids(absent)} without a replica")
    return found


def replica_choice_problem(
    choice: str, redundant: int, key: str, redundant_key: str, zero: str
) -> Problem | None:
    """The rule of a replica choice, as the spec (parallel.replica_choice) and `moec eplb
    --replica-choice` state it: any choice but static chooses among an expert's replicas, so it
    needs redundant experts (`redundant_key`, which `zero` writes as 0)."""
    if choice == "static" or redundant:
        return None
    return problem(
        key,
        f"chooses among replicas, and {zero} makes none",
        f"leave it out, or set {redundant_key}",
        value=choice,
    )


def _ids(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:8]))
    return shown + (f" (and {len(ids) - 8} more)" if len(ids) > 8 else "")


def read(path: Path) -> tuple[list[list[int]] | None, Problem | None]:
    """The placement in a `moec eplb` file, or the problem with the file (schema: an object
    with "format": "moec-placement" and "physical_to_logical": a list of lists of integers)."""
    from moec.spec.loader import RepeatedKey, read_user_json

    hint = f'a JSON file written by `moec eplb` ({{"format": "{FORMAT}", ...}}), or "even"'
    name = shown_path(path)
    try:
        data = read_user_json(path)
    except RepeatedKey as error:
        message = f"{name}: names the key {json.dumps(error.key)} twice (which one is meant?)"
        return None, problem(KEY, message, hint, value=str(path))
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        return None, problem(KEY, f"cannot read {name}: {reason}", hint, value=str(path))
    except json.JSONDecodeError as error:
        return None, problem(KEY, f"{name} is not JSON: {error}", hint, value=str(path))
    except ValueError as error:  # not a regular file, a BOM, too deep, a number too long
        return None, problem(KEY, f"{name}: {error}", hint, value=str(path))
    found = shape_problem(data)
    if found:
        return None, problem(KEY, f"{name}: {found}", hint, value=str(path))
    return [list(rank) for rank in data["physical_to_logical"]], None


def shape_problem(data: Any) -> str:
    """What keeps `data` from being a placement file ("" when nothing)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return f'not a placement file (an object with "format": "{FORMAT}")'
    ranks = data.get("physical_to_logical")
    if not isinstance(ranks, list) or not all(isinstance(rank, list) for rank in ranks):
        return '"physical_to_logical" must be a list of each rank\'s list of expert ids'
    if not all(
        isinstance(e, int) and not isinstance(e, bool) and 0 <= e < 2**31
        for rank in ranks
        for e in rank
    ):
        return '"physical_to_logical" holds a value that is not an expert id (0, 1, ...)'
    return ""


def document(placement: list[list[int]], experts: int, **extra: Any) -> dict[str, Any]:
    """A placement file's contents."""
    return {
        "format": FORMAT,
        "experts": experts,
        "ranks": len(placement),
        "physical_to_logical": placement,
        **extra,
    }
