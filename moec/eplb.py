"""`moec eplb`: a placement of replicated experts from a recorded load, by DeepSeek's
hierarchical balancing (github.com/deepseek-ai/EPLB; its facts, this code moec's own).

    load [E] ──▶ 1. pack the expert groups to nodes (equal group counts, balanced loads)
             ──▶ 2. in each node, replicate the expert whose replicas carry the most load,
                    until the node's physical experts are filled
             ──▶ 3. pack each node's replicas to its GPUs (equal counts, balanced loads)
             ──▶ placement [ranks][experts per rank] of logical ids

Packing is greedy: items by descending load (ties by index), each to the lightest pack that
still has room. A replica's load is its expert's load over its replica count. Where the groups
do not divide over the nodes, the same steps run with one group and one node (DeepSeek's
global policy). Pure Python: the numbers are a few hundred.

Like DeepSeek's, the balancing assumes each expert's load splits evenly over its replicas (the
random replica choice). The imbalance it reports follows the layer's replica choice
(`expected_rows`, which `moec explain --load` also uses): under static each rank's share of an
expert goes to that rank's one fixed replica, in steps of a rank's share, so the rows can
balance worse (or better) than the even sharing the placement was made for. The placement is
the same for either choice; its file records the choice its imbalance figures are for.
"""

from __future__ import annotations

import json
from collections import Counter
from itertools import chain
from pathlib import Path

from moec.errors import MoecError, problem, shown_path
from moec.runtime import load_record
from moec.spec import placement as placements
from moec.vocab import ReplicaChoice

LOAD_FORMAT = load_record.FORMAT
MAX_PHYSICAL = 4096
"""The most physical experts a placement holds (DeepSeek-V3 with EPLB: 288); the balancing and
its figures are pure Python, quadratic in them (4096 on 4096 ranks: a few seconds)."""
MAX_TOKENS = 2**53
"""The largest token count a load may hold: counts up to it add exactly in a float."""


def pack(loads: list[float], packs: int) -> tuple[list[int], list[int]]:
    """Each item's pack and its position in the pack: len(loads) / packs items per pack,
    heaviest first into the lightest pack with room (the first such on a tie)."""
    per_pack = len(loads) // packs
    if per_pack == 1:
        return list(range(len(loads))), [0] * len(loads)
    weight, count = [0.0] * packs, [0] * packs
    pack_of, position = [0] * len(loads), [0] * len(loads)
    for item in sorted(range(len(loads)), key=lambda i: -loads[i]):
        chosen = min((p for p in range(packs) if count[p] < per_pack), key=weight.__getitem__)
        pack_of[item], position[item] = chosen, count[chosen]
        weight[chosen] += loads[item]
        count[chosen] += 1
    return pack_of, position


def replicate(loads: list[float], slots: int) -> tuple[list[int], list[int]]:
    """`slots` physical experts for len(loads) logical ones: each logical once, then a
    replica of the one whose replicas carry the most load (the first on a tie), repeatedly.
    Returns (the logical expert of each physical one, each logical expert's replica count)."""
    physical, counts = list(range(len(loads))), [1] * len(loads)
    for _ in range(slots - len(loads)):
        hottest = max(range(len(loads)), key=lambda e: loads[e] / counts[e])
        physical.append(hottest)
        counts[hottest] += 1
    return physical, counts


def rebalance(
    load: list[float], physical: int, groups: int, nodes: int, ranks: int
) -> list[list[int]]:
    """The placement of `physical` experts over `ranks` GPUs on `nodes` nodes for one layer's
    `load` per logical expert, its experts in `groups` groups (hierarchical when the groups
    divide over the nodes, else global)."""
    if groups % nodes:
        groups, nodes = 1, 1
    experts = len(load)
    size = experts // groups
    group_load = [sum(load[g * size : (g + 1) * size]) for g in range(groups)]
    node_of, position = pack(group_load, nodes)
    placement: list[list[int]] = []
    for node in range(nodes):
        mine = sorted((position[g], g) for g in range(groups) if node_of[g] == node)
        logical = [e for _, g in mine for e in range(g * size, (g + 1) * size)]
        node_load = [load[e] for e in logical]
        copies, counts = replicate(node_load, physical // nodes)
        gpus, per_gpu = ranks // nodes, physical // ranks
        gpu_of, slot = pack([node_load[c] / counts[c] for c in copies], gpus)
        node_ranks = [[0] * per_gpu for _ in range(gpus)]
        for j, copy in enumerate(copies):
            node_ranks[gpu_of[j]][slot[j]] = logical[copy]
        placement += node_ranks
    return placement


def rank_rows(placement: list[list[int]], load: list[float]) -> list[float]:
    """Expected rows of each rank: its experts' loads, each shared evenly by its replicas."""
    counts = [0] * len(load)
    for rank in placement:
        for e in rank:
            counts[e] += 1
    return [sum(load[e] / counts[e] for e in rank) for rank in placement]


def static_rank_rows(
    choice: list[list[int]], placement: list[list[int]], load: list[float]
) -> list[float]:
    """Expected rows of each rank of `placement` under the static replica choice: rank r sends
    its tokens of expert e, an equal share of its load, to the replica choice[r][e] (physical
    id p on rank p // its experts per rank), so a replica no rank chooses takes none. Counted
    per physical expert (each holds one logical expert): ranks x experts choices are counted
    at C speed, not added one by one (4096 ranks of one expert each: 16M choices)."""
    per_rank, share = len(placement[0]), [v / len(choice) for v in load]
    logical = [e for rank in placement for e in rank]
    rows = [0.0] * len(placement)
    for physical, times in sorted(Counter(chain.from_iterable(choice)).items()):
        rows[physical // per_rank] += times * share[logical[physical]]
    return rows


def expected_rows(
    placement: list[list[int]], load: list[float], replica_choice: str, nodes: int
) -> list[float]:
    """Expected rows of each rank of `placement` (ranks on `nodes` nodes) under `load`, each
    rank sending an equal share of every expert's tokens: random shares each expert's load
    evenly by its replicas (rank_rows), static sends each rank's share to the replica the
    layer's table chooses for it (moec.plan.placement.static_choice, static_rank_rows)."""
    if ReplicaChoice(replica_choice) == ReplicaChoice.random:
        return rank_rows(placement, load)
    from moec.plan.placement import static_choice

    choice = static_choice(placement, len(load), nodes)
    return static_rank_rows(choice, placement, load)


def imbalance(rows: list[float]) -> float:
    """Max over mean rows per rank (1 = balanced); 1 for no load at all."""
    mean = sum(rows) / len(rows)
    return max(rows) / mean if mean else 1.0


def read_load(path: Path) -> list[float]:
    """The load in a file the layer's `write_expert_load` wrote ({"format": "moec-load",
    "load": [tokens per logical expert]}); MoecError naming the file, and the key or the entry
    that is wrong, otherwise."""
    from moec.spec.loader import read_user_json

    try:
        data = read_user_json(path)
    except OSError as error:
        raise _load_error(path, f"cannot read the load: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        where = f"{error.reason} at byte {error.start}"
        raise _load_error(path, f"cannot read the load: not UTF-8 text: {where}") from None
    except json.JSONDecodeError as error:
        raise _load_error(path, f"cannot read the load: not JSON: {error}") from None
    except ValueError as error:  # a key twice, a BOM, too deep, a number too long, no file
        raise _load_error(path, f"cannot read the load: {error}") from None
    if not isinstance(data, dict):
        raise _load_error(path, f"is not a load file: a JSON {_json_kind(data)}, not an object")
    if data.get("format") != LOAD_FORMAT:
        said = (
            'has no "format"'
            if "format" not in data
            else f'says "format": {_shown(data["format"])}'
        )
        raise _load_error(path, f"is not a load file: it {said}")
    unknown = sorted(set(data) - LOAD_KEYS)
    if unknown:  # a misspelt key would otherwise be a load silently read without it
        raise _load_error(
            path,
            f"is not a load file: it has the key {_shown(unknown[0])}"
            + (f" and {len(unknown) - 1} more unknown" if len(unknown) > 1 else ""),
            f"only the keys write_expert_load writes: {', '.join(sorted(LOAD_KEYS))}",
        )
    load = data.get("load")
    if not isinstance(load, list) or not load:
        wrong = "is empty" if load == [] else "is missing" if load is None else "is not a list"
        raise _load_error(path, f'is not a load file: its "load" {wrong}', COUNTS_HINT)
    for index, count in enumerate(load):
        if not is_token_count(count):
            bad = sum(not is_token_count(v) for v in load)
            more = f", nor are {bad - 1} more of its {len(load)}" if bad > 1 else ""
            raise MoecError(
                [problem(f"load[{index}]", f"is not a load file's token count{more}",
                         COUNTS_HINT, value=_AsWritten(count))],
                str(path),
            )  # fmt: skip
    return [float(v) for v in load]


LOAD_KEYS = frozenset(load_record.KEYS)
"""The keys of a load file (only format and load are needed)."""

COUNTS_HINT = (
    f"token counts from 0 to 2**53, one per logical expert, as write_expert_load writes: "
    f'{{"format": "{LOAD_FORMAT}", "load": [...]}}'
)


def is_token_count(value: object) -> bool:
    """A load's entry: a number (not a boolean) from 0 to MAX_TOKENS; NaN is none."""
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS
    )


class _AsWritten:
    """A load's entry as a message shows it: JSON's null, NaN and Infinity as the file writes
    them (not Python's None, nan, inf), the rest as moec's messages show any value."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __str__(self) -> str:
        return _shown(self.value)


def _shown(value: object) -> str:
    """A value of the file as a message quotes it (JSON, cut short)."""
    try:
        text = json.dumps(value)
    except RecursionError:  # nested almost as deep as the parser went
        return "[...]"
    return text if len(text) <= 60 else text[:56] + "..."


def _json_kind(value: object) -> str:
    names = {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _load_error(path: Path, message: str, hint: str = "") -> MoecError:
    hint = hint or f'a JSON file {{"format": "{LOAD_FORMAT}", "load": [...]}} (write_expert_load)'
    return MoecError([problem("", message, hint)], str(path))


PHYSICAL_BOUND = f"at most {MAX_PHYSICAL} physical experts, the load's experts plus --redundant"
"""What `moec eplb` accepts of the physical experts, as its messages say it."""


def check_shape(experts: int, physical: int, groups: int, nodes: int, ranks: int) -> list:
    """Problems of the counts (command-line argument names)."""
    found = []
    if experts > MAX_PHYSICAL:
        found.append(
            problem("LOAD", f"holds {experts} experts, more than a placement holds",
                    PHYSICAL_BOUND)
        )  # fmt: skip
        return found
    if physical > MAX_PHYSICAL:
        found.append(
            problem("--redundant", f"makes {physical} physical experts with the load's {experts}",
                    f"{PHYSICAL_BOUND}; with this load --redundant at most {MAX_PHYSICAL - experts}",
                    value=physical - experts)
        )  # fmt: skip
        return found
    if physical % ranks:
        found.append(
            problem("--ranks", f"does not divide the {physical} physical experts",
                    "a divisor of the experts plus --redundant", value=ranks)
        )  # fmt: skip
    if ranks % nodes:
        found.append(
            problem("--nodes", f"does not divide --ranks {ranks}", "a divisor of --ranks",
                    value=nodes)
        )  # fmt: skip
    if experts % groups:
        found.append(
            problem("--groups", f"does not divide the load's {experts} experts",
                    "a divisor of the load's experts (router.n_group)", value=groups)
        )  # fmt: skip
    return found


def is_placement_file(head: bytes) -> bool:
    """Whether a file's first bytes are a placement moec eplb wrote (what -o may replace)."""
    try:
        data = json.loads(head)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("format") == placements.FORMAT


def baseline(experts: int, redundant: int, ranks: int) -> list[list[int]]:
    """What the balance is measured against: the experts split evenly by index without
    replicas where the ranks divide them, else parallel.placement = "even" with the replicas."""
    return placements.even(experts, 0 if experts % ranks == 0 else redundant, ranks)


def check_choice(replica_choice: str, redundant: int) -> list:
    """Problems of --replica-choice: a choice parallel.replica_choice takes, under the spec's
    rule (moec.spec.placement.replica_choice_problem)."""
    names = [choice.value for choice in ReplicaChoice]
    if replica_choice not in names:
        hint = " or ".join(names) + ", as parallel.replica_choice takes"
        return [problem("--replica-choice", "is not a replica choice", hint, value=replica_choice)]
    found = placements.replica_choice_problem(
        replica_choice, redundant, "--replica-choice", "--redundant", "--redundant 0"
    )
    return [found] if found is not None else []


def document(
    load: list[float], placement: list[list[int]], replica_choice: str, **settings: int
) -> dict:
    """The placement file: the placement, the settings, and the imbalance before (baseline)
    and after, under the replica choice it names."""
    ranks, nodes = len(placement), settings.get("nodes", 1)
    split = baseline(len(load), settings.get("redundant_experts", 0), ranks)
    before = imbalance(expected_rows(split, load, replica_choice, nodes))
    after = imbalance(expected_rows(placement, load, replica_choice, nodes))
    figures = {"replica_choice": replica_choice, "before": before, "after": after}
    return placements.document(placement, len(load), **settings, imbalance=figures)


def command(
    load_file: str,
    out: str,
    ranks: int,
    nodes: int,
    redundant: int,
    groups: int,
    replica_choice: str,
) -> str:
    """`moec eplb`: read the load, balance, write the placement file; the report to print."""
    from moec.codegen.write import write_text

    found = check_choice(replica_choice, redundant)  # before the load: it needs none
    if found:
        raise MoecError(found, "moec eplb", kind="usage")
    load = read_load(Path(load_file))
    physical = len(load) + redundant
    found = check_shape(len(load), physical, groups, nodes, ranks)
    if found:
        raise MoecError(found, "moec eplb", kind="usage")
    placement = rebalance(load, physical, groups, nodes, ranks)
    data = document(
        load, placement, replica_choice, redundant_experts=redundant, nodes=nodes, groups=groups
    )
    text = json.dumps(data, indent=1)
    write_text(Path(out), text + "\n", is_placement_file, recorded=True)
    policy = (
        "hierarchical"
        if groups % nodes == 0
        else "global (the groups do not divide over the nodes)"
    )
    before, after = data["imbalance"]["before"], data["imbalance"]["after"]
    rows = expected_rows(placement, load, replica_choice, nodes)
    settings = f"parallel.placement = {json.dumps(out)}, parallel.redundant_experts = {redundant}"
    if redundant:
        settings += f", parallel.replica_choice = {json.dumps(replica_choice)}"
    lines = [
        f"{len(load)} experts + {redundant} redundant on {ranks} ranks, {nodes} node(s), "
        f"{groups} group(s): {policy}",
        _choice_line(load, placement, replica_choice, redundant),
        f"imbalance (max / mean rows per rank, {replica_choice} replica choice): {before:.3f} "
        f"even, {after:.3f} balanced",
        *(f"  rank {r}: {rows[r]:.1f} rows, experts {placement[r]}" for r in range(ranks)),
        f"wrote {shown_path(out)} ({settings})",
    ]
    return "\n".join(lines) + "\n"


def _choice_line(
    load: list[float], placement: list[list[int]], replica_choice: str, redundant: int
) -> str:
    """What the replica choice does to the rows, beside the balancing's assumption."""
    if not redundant:
        return "no replicas: each expert's rows go to its one rank (either replica choice)"
    if replica_choice == ReplicaChoice.random:
        return (
            "replica choice random: a hash spreads each expert's tokens over its replicas, "
            "their loads split evenly, as the balancing assumes"
        )
    evenly = imbalance(rank_rows(placement, load))
    return (
        "replica choice static: each rank sends its tokens of an expert to one fixed replica;\n"
        "  the balancing assumes each expert's load split evenly over its replicas, as random "
        f"does ({evenly:.3f} balanced)"
    )
