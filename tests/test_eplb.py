"""`moec eplb` and the load record: DeepSeek's hierarchical balancing against hand-computed
placements and the example in its README (github.com/deepseek-ai/EPLB), the imbalance it
reports, the command's files and errors, and the layer's per-expert token counter."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import EXAMPLES
from test_distributed import HIDDEN, SPEC

from moec.cli import main
from moec.eplb import baseline, expected_rows, imbalance, pack, rank_rows, rebalance, replicate
from moec.spec import parse_spec

README_LOAD = [
    [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
    [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
]
README_PLACEMENT = [
    [5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
    [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1],
]
"""EPLB's README: 2 layers of 12 experts in 4 groups, 16 physical experts on 2 nodes of 4 GPUs."""


@pytest.mark.parametrize("layer", [0, 1])
def test_readme_example(layer):
    placement = rebalance(README_LOAD[layer], 16, 4, 2, 8)
    assert [e for rank in placement for e in rank] == README_PLACEMENT[layer]


def test_hand_computed():
    # pack: heaviest first into the lightest pack with room, the first on a tie
    assert pack([5, 1, 1, 4, 5, 4], 2) == ([0, 0, 1, 0, 1, 1], [0, 2, 2, 1, 0, 1])
    # replicate: the expert whose replicas carry the most, repeatedly
    assert replicate([10, 1, 1, 8], 6) == ([0, 1, 2, 3, 0, 3], [2, 1, 1, 2])
    # global (one group): 0 and 3 replicated, each rank 10 rows
    assert rebalance([10, 1, 1, 8], 6, 1, 1, 2) == [[0, 3, 1], [0, 3, 2]]
    # hierarchical: group {0, 1} to node 0, {2, 3} to node 1, each replicates its hottest
    assert rebalance([10, 1, 1, 8], 6, 2, 2, 2) == [[0, 0, 1], [3, 3, 2]]
    # groups that do not divide over the nodes: the global policy
    assert rebalance([10, 1, 1, 8], 6, 1, 2, 2) == [[0, 3, 1], [0, 3, 2]]


def test_imbalance_on_a_skewed_load():
    """Expert 0 takes 100 of 250 rows: evenly split by index its rank takes 130 (2.08 x the
    mean); with 4 replicas its 5 copies carry 20 each and the ranks 70, 60, 60, 60 (1.12, the
    best whole replicas of 20 and 10 allow)."""
    load = [100.0] + [10.0] * 15
    even = [list(range(r * 4, r * 4 + 4)) for r in range(4)]
    assert imbalance(rank_rows(even, load)) == pytest.approx(130 / 62.5)
    placement = rebalance(load, 20, 1, 1, 4)
    assert sorted(rank_rows(placement, load)) == [60, 60, 60, 70]
    assert imbalance(rank_rows(placement, load)) == pytest.approx(70 / 62.5)


SKEWED = [40.0, 40.0, 10.0, 10.0, 10.0, 10.0]
"""Two hot experts of 6: on 4 ranks with 2 redundant, each has two replicas."""


def test_imbalance_under_each_replica_choice():
    """The balancing replicates experts 0 and 1 onto ranks 0, 2 and 1, 3: shared evenly
    (random) each replica takes 20 and every rank 30, the mean. Statically ranks 0 and 2 keep
    their own share of expert 0 (10 each), and rank 1 and 3, holding none, both pick the
    replica at their rank mod 2, rank 2's: 10 and 30; expert 1 the same onto rank 1: rows 20,
    40, 40, 20 (1.333), no better than the even split's (replicas of 0 and 1 on ranks 0 and
    3, 40, 20, 20, 40 under either choice). Expert 0 of [100] + [10] * 15 on every rank, twice
    on rank 0: statically each rank takes its own 25, randomly rank 0's two replicas 40."""
    placement = rebalance(SKEWED, 8, 1, 1, 4)
    assert placement == [[0, 2], [1, 3], [0, 4], [1, 5]]
    assert expected_rows(placement, SKEWED, "random", 1) == [30, 30, 30, 30]
    assert expected_rows(placement, SKEWED, "static", 1) == [20, 40, 40, 20]
    split = baseline(6, 2, 4)
    assert split == [[0, 1], [2, 3], [4, 5], [0, 1]]
    for choice in ("random", "static"):
        assert expected_rows(split, SKEWED, choice, 1) == [40, 20, 20, 40]
    load = [100.0] + [10.0] * 15
    placement = rebalance(load, 20, 1, 1, 4)
    assert placement[0][:2] == [0, 0] and all(rank[0] == 0 for rank in placement)
    assert expected_rows(placement, load, "static", 1) == [55, 65, 65, 65]
    assert expected_rows(placement, load, "random", 1) == [70, 60, 60, 60]


def _static_reference(placement, load, nodes):
    """The static choice and its rows the plain way, every (rank, expert) in turn: the rank's
    own replica, else one on its node, else any, spread by rank; rank r sends load / ranks."""
    ranks, per_rank = len(placement), len(placement[0])
    per_node = max(1, ranks // nodes)
    flat = [e for rank in placement for e in rank]
    choice, rows = [], [0.0] * ranks
    for rank in range(ranks):
        row = []
        for e in range(len(load)):
            candidates = [p for p, logical in enumerate(flat) if logical == e]
            own = [p for p in candidates if p // per_rank == rank]
            node = [p for p in candidates if p // per_rank // per_node == rank // per_node]
            pool = own or node or candidates
            row.append(pool[rank % len(pool)])
            rows[row[-1] // per_rank] += load[e] / ranks
        choice.append(row)
    return choice, rows


@pytest.mark.parametrize(("ranks", "nodes", "redundant"), [(4, 1, 4), (8, 2, 8), (12, 3, 0)])
def test_static_figures_are_the_plain_ones(ranks, nodes, redundant):
    """static_choice (per expert, one column of choices) and static_rank_rows (counted per
    physical expert) give what choosing and adding rank by rank gives."""
    from moec.eplb import static_rank_rows
    from moec.plan.placement import static_choice

    load = [float((e * 37) % 23 + (50 if e % 5 == 0 else 0)) for e in range(24)]
    for placement in (rebalance(load, 24 + redundant, 1, nodes, ranks),
                      baseline(24, redundant, ranks)):  # fmt: skip
        choice, rows = _static_reference(placement, load, nodes)
        assert static_choice(placement, 24, nodes) == choice
        assert static_rank_rows(choice, placement, load) == pytest.approx(rows, rel=1e-12)
        assert expected_rows(placement, load, "static", nodes) == pytest.approx(rows, rel=1e-12)


def test_command_reports_the_replica_choice(tmp_path, capsys):
    """The figures of test_imbalance_under_each_replica_choice, printed and recorded."""
    load = tmp_path / "load.json"
    load.write_text(json.dumps({"format": "moec-load", "load": SKEWED}))
    out = tmp_path / "placement.json"
    argv = ["eplb", str(load), "-o", str(out), "--ranks", "4", "--redundant", "2"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("replica choice static: each rank sends its tokens of an expert")
    assert lines[2].endswith("split evenly over its replicas, as random does (1.000 balanced)")
    assert lines[3].endswith("rows per rank, static replica choice): 1.333 even, 1.333 balanced")
    assert lines[4:8] == ["  rank 0: 20.0 rows, experts [0, 2]", "  rank 1: 40.0 rows, experts [1, 3]",
                          "  rank 2: 40.0 rows, experts [0, 4]", "  rank 3: 20.0 rows, experts [1, 5]"]  # fmt: skip
    assert lines[8].endswith('parallel.redundant_experts = 2, parallel.replica_choice = "static")')
    recorded = json.loads(out.read_text())["imbalance"]
    assert recorded == {"replica_choice": "static", "before": pytest.approx(4 / 3),
                        "after": pytest.approx(4 / 3)}  # fmt: skip
    assert main([*argv, "--replica-choice", "random"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == ("replica choice random: a hash spreads each expert's tokens over its "
                        "replicas, their loads split evenly, as the balancing assumes")  # fmt: skip
    assert lines[2].endswith("rows per rank, random replica choice): 1.333 even, 1.000 balanced")
    assert [line.split()[2] for line in lines[3:7]] == ["30.0"] * 4
    recorded = json.loads(out.read_text())["imbalance"]
    assert recorded == {"replica_choice": "random", "before": pytest.approx(4 / 3), "after": 1.0}


@pytest.mark.parametrize(
    ("ranks", "nodes", "redundant", "load", "figures"),
    [
        # 3 ranks: the even split holds replicas of 0 and 1 on rank 2; balanced, expert 0 sits
        # on ranks 0 and 1, and rank 2 sends its share to rank 0's (static: 110 of the mean 80)
        (3, 1, 2, [90, 50] + [10] * 14, {"static": (1.429, 1.179), "random": (1.179, 1.018)}),
        # 2 nodes, one group (the global policy): statically rank 1 sends its share of expert 0
        # to its node's one replica, rank 0's, which takes 45 of it, expert 1 (20) and 30: 95 of
        # the mean 65 (1.154 if the ranks were on one node)
        (4, 2, 4, [90, 20, 20] + [10] * 13, {"static": (2.154, 1.462), "random": (2.154, 1.046)}),
    ],
)
def test_command_figures_are_explains(tmp_path, capsys, ranks, nodes, redundant, load, figures):
    """What `moec eplb` prints for a placement, each rank's rows and the imbalance before and
    after, is what `moec explain --load` shows for it under the same replica choice."""
    (tmp_path / "load.json").write_text(json.dumps({"format": "moec-load", "load": load}))
    for choice, (before, after) in figures.items():
        argv = ["eplb", str(tmp_path / "load.json"), "-o", str(tmp_path / "placement.json"),
                "--ranks", str(ranks), "--nodes", str(nodes), "--redundant", str(redundant),
                "--replica-choice", choice]  # fmt: skip
        assert main(argv) == 0
        printed = capsys.readouterr().out.splitlines()
        figure = f"rows per rank, {choice} replica choice): {before:.3f} even, {after:.3f} balanced"
        ranks_at = next(i for i, line in enumerate(printed) if line.endswith(figure)) + 1
        rows = [float(line.split()[2]) for line in printed[ranks_at : ranks_at + ranks]]
        parallel = (f'dispatch = "all2all"\nep_size = {ranks}\nnodes = {nodes}\n'
                    f'redundant_experts = {redundant}\nplacement = "placement.json"\n'
                    f'replica_choice = "{choice}"\n')  # fmt: skip
        lines = _explain_load(tmp_path, capsys, parallel, load)
        shares = [float(line.split()[2].rstrip("%")) for line in lines[1 : ranks + 1]]
        assert shares == [round(100 * r / sum(load), 1) for r in rows]
        assert lines[ranks + 1].endswith(f"{after:.3f} placed, {before:.3f} for the even split")


def test_replica_choice_errors(tmp_path, capsys):
    """A choice the spec does not take, or random without replicas (the spec refuses it):
    one message each, exit 2, nothing written."""
    load = tmp_path / "load.json"
    load.write_text(json.dumps({"format": "moec-load", "load": SKEWED}))
    out = tmp_path / "placement.json"
    for extra, message in [
        (["--redundant", "2", "--replica-choice", "hash"],
         'moec eplb: --replica-choice = "hash": is not a replica choice (static or random, '
         "as parallel.replica_choice takes)"),
        (["--replica-choice", "random"],
         'moec eplb: --replica-choice = "random": chooses among replicas, and --redundant 0 '
         "makes none (leave it out, or set --redundant)"),
    ]:  # fmt: skip
        assert main(["eplb", str(load), "-o", str(out), "--ranks", "2", *extra]) == 2
        captured = capsys.readouterr()
        assert captured.err == message + "\n" and captured.out == ""
    assert not out.exists()


PLACED = """
name = "placed"
[model]
hidden_size = 256
moe_intermediate_size = 128
n_routed_experts = 12
num_experts_per_tok = 2
[parallel]
dispatch = "all2all"
ep_size = 8
redundant_experts = 4
placement = "placement.json"
"""
"""A spec naming the placement file that `moec eplb` writes in write_placement."""


def write_placement(folder, capsys) -> dict:
    """`moec eplb` of EPLB's README load into folder/placement.json (twice: the second replaces
    its own file); the file's data. Checks what it prints and holds."""
    load = folder / "load.json"
    load.write_text(json.dumps({"format": "moec-load", "load": README_LOAD[0]}))
    out = folder / "placement.json"
    argv = ["eplb", str(load), "-o", str(out), "--ranks", "8", "--nodes", "2",
            "--redundant", "4", "--groups", "4"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    # even: 8 ranks do not divide 12 experts, so "even" with replicas of 0-3: rank 2 holds 4
    # and 5, 269 rows of the mean 129.1; balanced: rank 6 holds 0 and 1, 156 rows
    # (the static choice the same: each rank's fixed replica splits the replicated experts
    # evenly here)
    assert "rows per rank, static replica choice): 2.083 even, 1.208 balanced" in printed
    data = json.loads(out.read_text())
    assert data["imbalance"]["replica_choice"] == "static"
    assert [e for rank in data["physical_to_logical"] for e in rank] == README_PLACEMENT[0]
    assert main(argv) == 0  # its own file: replaced
    return data


def test_command_writes_a_placement_the_spec_takes(tmp_path, capsys):
    data = write_placement(tmp_path, capsys)
    loaded = parse_spec(PLACED, "<spec>", folder=tmp_path)
    assert loaded.spec.parallel.placement == data["physical_to_logical"]


def test_a_placement_path_of_the_command_line_starts_in_the_current_folder(
    tmp_path, capsys, monkeypatch
):
    """A relative placement path in the spec is found beside the spec; given by --set, where the
    command runs (as a shell completed it): here two files of one name, two placements."""
    beside_spec = write_placement(tmp_path, capsys)
    here = tmp_path / "work"
    here.mkdir()
    moved = [rank[1:] + rank[:1] for rank in beside_spec["physical_to_logical"]]  # also valid
    (here / "placement.json").write_text(json.dumps({**beside_spec, "physical_to_logical": moved}))
    monkeypatch.chdir(here)
    set_here = ["parallel.placement=placement.json"]
    placed = parse_spec(PLACED, "<spec>", folder=tmp_path).spec.parallel.placement
    assert placed == beside_spec["physical_to_logical"]
    assert parse_spec(PLACED, "<spec>", set_here, folder=tmp_path).spec.parallel.placement == moved
    (tmp_path / "placed.toml").write_text(PLACED)
    assert main(["validate", str(tmp_path / "placed.toml"), "--set", set_here[0]]) == 0
    assert main(["validate", str(tmp_path / "placed.toml")]) == 0


def test_command_errors(tmp_path, capsys):
    load = tmp_path / "load.json"
    load.write_text(json.dumps({"format": "moec-load", "load": [1, 2, 3, 4]}))
    foreign = tmp_path / "notes.json"
    foreign.write_text("{}")
    cases = [
        (["--ranks", "3"], str(tmp_path / "p.json"), "--ranks = 3: does not divide"),
        (["--ranks", "2", "--groups", "3"], str(tmp_path / "p.json"), "--groups = 3"),
        (["--ranks", "0"], str(tmp_path / "p.json"), '--ranks = "0": must be a whole number'),
        (["--ranks", "2"], str(foreign), "was not written by moec"),
    ]
    for extra, out, message in cases:
        assert main(["eplb", str(load), "-o", out, *extra]) == 2
        assert message in capsys.readouterr().err
    load.write_text(json.dumps({"format": "moec-load", "load": [1, -2]}))
    assert main(["eplb", str(load), "-o", str(tmp_path / "p.json"), "--ranks", "2"]) == 2
    assert "not a load file" in capsys.readouterr().err
    assert foreign.read_text() == "{}"


def test_bad_placement_files(tmp_path):
    from moec.errors import MoecError

    spec = SPEC + '[parallel]\nplacement = "p.json"\nredundant_experts = 1\n'
    for text, message in [
        ("[[0]]", "not a placement file"),
        ('{"format": "moec-placement", "physical_to_logical": [[0, true]]}', "not an expert id"),
        ('{"format": "moec-placement", "physical_to_logical": [[0, 1, 2, 3, 4, 5, 6, 8, 9]]}',
         "beyond the 8 routed experts"),
        ("{", "is not JSON"),
    ]:  # fmt: skip
        (tmp_path / "p.json").write_text(text)
        with pytest.raises(MoecError) as caught:
            parse_spec(spec, "<spec>", folder=tmp_path)
        assert message in caught.value.report()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_recorded_load_is_the_routing_histogram(load_layer, tmp_path, backend):
    """Over three forwards the counter holds the histogram of the selected experts (computed
    here from the router's fp32 logits by torch_select), reset starts it again, and the load
    file holds it."""
    from moec.runtime.torch_select import select_topk

    overrides = ["parallel.record_load=true", f"experts.gemm_backend={backend}",
                 "experts.layout=contiguous", "parallel.redundant_experts=2",
                 "parallel.replica_choice=random"]  # fmt: skip
    layer = load_layer(SPEC, *overrides).MoELayer().random_(11)
    gen = torch.Generator().manual_seed(35)
    expected = torch.zeros(8, dtype=torch.int64)
    for tokens in (5, 1, 12):
        x = torch.randn(tokens, HIDDEN, generator=gen)
        layer(x)
        logits = torch.nn.functional.linear(x.float(), layer.gate_weight)
        _, ids = select_topk(
            logits, layer.gate_bias, scoring_func="sigmoid", topk_method="noaux_tc", n_group=4,
            topk_group=2, top_k=3, norm_topk_prob=True, routed_scaling_factor=1.0, fused_shared=0,
        )  # fmt: skip
        expected += torch.bincount(ids.flatten().long(), minlength=8)
    assert torch.equal(layer.expert_load(), expected) and expected.sum() == 18 * 3
    path = tmp_path / "load.json"
    assert layer.write_expert_load(path) == expected.tolist()
    assert json.loads(path.read_text())["load"] == expected.tolist()
    layer.reset_expert_load()
    assert int(layer.expert_load().sum()) == 0


def test_explain_shows_ranks_and_the_slowest_rank_under_a_load(tmp_path, capsys):
    """Expert 0 hot: the even split's first rank takes 130 of 250 rows (2.08 x the mean); the
    balanced placement 1.12 with random replicas (each shares its expert's load evenly);
    explain lists each rank's experts and share and the slowest rank's floor, lower placed
    than split evenly, both above uniform routing's."""
    load = tmp_path / "load.json"
    load.write_text(json.dumps({"format": "moec-load", "load": [100] + [10] * 15}))
    placement = tmp_path / "placement.json"
    assert main(["eplb", str(load), "-o", str(placement), "--ranks", "4", "--redundant", "4"]) == 0
    spec = tmp_path / "ep4.toml"
    spec.write_text(
        (EXAMPLES / "tiny-cpu.toml").read_text()
        + '[parallel]\ndispatch = "all2all"\nep_size = 4\nredundant_experts = 4\n'
        + 'placement = "placement.json"\nreplica_choice = "random"\n'
    )
    capsys.readouterr()
    assert main(["explain", str(spec), "--load", str(load), "--tokens", "256"]) == 0
    text = capsys.readouterr().out
    assert "placement: 20 physical experts on 4 rank(s), replica choice random" in text
    assert "  rank 0:   28.0% of the rows, experts 0, " in text  # 70 of 250
    assert "imbalance (max / mean rows per rank) 1.120 placed, 2.080 for the even split" in text
    slowest, even, uniform = map(float, text.rstrip().splitlines()[-1].split()[1:])
    assert uniform < slowest < even
    assert main(["explain", str(spec), "--load", str(tmp_path / "none.json")]) == 2
    assert "cannot read the load" in capsys.readouterr().err


def _explain_load(tmp_path, capsys, parallel: str, load: list[int], *more: str) -> list[str]:
    """`moec explain` of tiny-cpu.toml with `parallel` under a load: its placement lines."""
    (tmp_path / "load.json").write_text(json.dumps({"format": "moec-load", "load": load}))
    spec = tmp_path / "placed.toml"
    spec.write_text((EXAMPLES / "tiny-cpu.toml").read_text() + "[parallel]\n" + parallel)
    capsys.readouterr()
    argv = ["explain", str(spec), "--load", str(tmp_path / "load.json"), "--tokens", "64", *more]
    assert main(argv) == 0
    lines = capsys.readouterr().out.rstrip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("placement: "))
    return lines[start:]


def test_explain_rows_under_the_static_choice(tmp_path, capsys):
    """Static replicas: each rank sends its quarter of an expert's load to its fixed replica,
    so the rows are not the even sharing's. Expert 0 (80 rows) on rank 0 twice and rank 1:
    ranks 0 and 1 take their own, rank 2 (holding none) the third of its replicas (rank 1's),
    rank 3 the first (rank 0's): 40 rows each, none for the second copy. Expert 1 (40) on
    ranks 0 and 3, ranks 1 and 2 spread to 3 and 0: 20 each; expert 8 (20) on ranks 2 and 3:
    10 each. Rows 80, 80, 50, 60 of the mean 67.5 (random replicas: 93.3 on rank 0); split
    evenly, rank 0 holds experts 0-3: 140."""
    parallel = ('dispatch = "all2all"\nep_size = 4\nredundant_experts = 4\n'
                "placement = [[0, 0, 1, 2, 3], [0, 4, 5, 6, 7], [8, 9, 10, 11, 12], "
                "[13, 14, 15, 1, 8]]\n")  # fmt: skip
    load = [80, 40] + [10] * 6 + [20] + [10] * 7
    lines = _explain_load(tmp_path, capsys, parallel, load)
    shares = [float(line.split()[2].rstrip("%")) for line in lines[1:5]]
    assert shares == [29.6, 29.6, 18.5, 22.2]  # 80, 80, 50, 60 of 270
    imbalance_line = f"{80 / 67.5:.3f} placed, {140 / 67.5:.3f} for the even split"
    assert lines[5].endswith(imbalance_line)
    random = _explain_load(tmp_path, capsys, parallel, load, "--set",
                           'parallel.replica_choice="random"')  # fmt: skip
    rank_0 = 80 * 2 / 3 + 40 / 2 + 20  # two of expert 0's three replicas, half of expert 1
    assert random[5].endswith(f"{rank_0 / 67.5:.3f} placed, {140 / 67.5:.3f} for the even split")


def test_explain_even_split_with_replicas_under_the_static_choice(tmp_path, capsys):
    """3 ranks do not divide 16 experts: the even split holds replicas of 0 and 1 on rank 2
    (experts 12-15, 0, 1). Statically, rank 1 sends its tokens of 0 and 1 to rank 2's
    replicas: rank 2 takes 40 + 2/3 * (90 + 10) of 240 rows (1.333 x the mean 80), randomly
    40 + (90 + 10) / 2 (1.125). Expert 0 on every rank: each takes 80 (1.000), and its slowest
    rank's floor is uniform routing's."""
    parallel = ('dispatch = "all2all"\nep_size = 3\nredundant_experts = 2\n'
                "placement = [[0, 1, 2, 3, 4, 5], [0, 6, 7, 8, 9, 10], "
                "[0, 11, 12, 13, 14, 15]]\n")  # fmt: skip
    load = [90] + [10] * 15
    lines = _explain_load(tmp_path, capsys, parallel, load)
    assert lines[4].endswith(f"1.000 placed, {(40 + 200 / 3) / 80:.3f} for the even split")
    slowest, even, uniform = map(float, lines[-1].split()[1:])
    assert slowest == uniform < even
    random = _explain_load(tmp_path, capsys, parallel, load, "--set",
                           'parallel.replica_choice="random"')  # fmt: skip
    assert random[4].endswith(f"1.000 placed, {(40 + 100 / 2) / 80:.3f} for the even split")


def test_counts_past_what_a_placement_holds_are_refused_at_once(tmp_path, capsys):
    """No count makes the balancing run without end: physical experts are bounded, and a
    load's counts must add exactly (an explain --load of 1e308s reached the cost model)."""
    import time

    load = tmp_path / "load.json"
    load.write_text(json.dumps({"format": "moec-load", "load": [1, 1, 1, 1]}))
    start = time.monotonic()
    out = str(tmp_path / "p.json")
    assert main(["eplb", str(load), "-o", out, "--ranks", "1", "--redundant", "2147483647"]) == 2
    assert "--redundant = 2147483647: makes 2147483651 physical experts" in capsys.readouterr().err
    assert time.monotonic() - start < 5
    load.write_text(json.dumps({"format": "moec-load", "load": [1] * 5000}))
    assert main(["eplb", str(load), "-o", out, "--ranks", "1000"]) == 2
    assert "holds 5000 experts" in capsys.readouterr().err
    load.write_text(json.dumps({"format": "moec-load", "load": [1e308] * 16}))
    assert main(["explain", str(EXAMPLES / "tiny-cpu.toml"), "--load", str(load)]) == 2
    assert "token counts from 0 to 2**53" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_a_load_file_writing_a_key_twice_is_refused(tmp_path, capsys):
    load = tmp_path / "load.json"
    load.write_text('{"format": "moec-load", "load": [1, 2, 3, 4], "load": [4, 3, 2, 1]}')
    assert main(["explain", str(EXAMPLES / "tiny-cpu.toml"), "--load", str(load)]) == 2
    err = capsys.readouterr().err
    assert "cannot read the load" in err
    assert 'the key "load" is written twice' in err


def test_a_load_file_with_an_unknown_key_is_refused(tmp_path, capsys):
    """A misspelt key is named, not skipped: every key write_expert_load writes is taken."""
    load = tmp_path / "load.json"
    spec = str(EXAMPLES / "tiny-cpu.toml")
    load.write_text('{"format": "moec-load", "load": [1, 2, 3, 4], "leyer": "moe"}')
    assert main(["explain", spec, "--load", str(load)]) == 2
    err = capsys.readouterr().err
    assert 'is not a load file: it has the key "leyer"' in err
    assert "format, layer, load, sha256" in err
    record = {"format": "moec-load", "layer": "moe", "load": [1] * 16, "sha256": "0" * 64}
    load.write_text(json.dumps(record))
    assert main(["explain", spec, "--load", str(load)]) == 0


def test_explain_of_one_rank_under_a_load_shows_it(tmp_path, capsys):
    """One rank holding every expert: the text still shows the load it was given (as the JSON
    does), and the load file's name is escaped as every message escapes paths."""
    load = tmp_path / "l\nfake line\x1b[31m.json"
    load.write_text(json.dumps({"format": "moec-load", "load": [100] + [10] * 15}))
    capsys.readouterr()
    assert main(["explain", str(EXAMPLES / "tiny-cpu.toml"), "--load", str(load)]) == 0
    text = capsys.readouterr().out
    assert "placement: 16 physical experts on 1 rank(s)" in text
    assert "  rank 0:  100.0% of the rows, experts 0, 1, " in text
    assert "l\\x0afake line\\x1b[31m.json: imbalance (max / mean rows per rank) 1.000" in text
    assert "\x1b" not in text and "\nfake line" not in text
