"""The vocabulary (moec/vocab.py): each spec Literal lists its enum's names, a spec field takes
the vocabulary's Literal, and a member reaches generated code and JSON as its plain string."""

from __future__ import annotations

import ast
import json
import typing
from pathlib import Path

import pytest

from moec import vocab
from moec.codegen.render import literal
from moec.plan.types import DType
from moec.spec import models

# (Literal, its enum, the spec's extra choices)
NAMES = [
    (vocab.SchemeName, vocab.Scheme, ()),
    (vocab.ScaleDtypeName, vocab.ScaleDtype, ()),
    (vocab.ActivationSchemeName, vocab.ActivationScheme, ()),
    (vocab.CheckpointFormatName, vocab.CheckpointFormat, ()),
    (vocab.LayoutChoice, vocab.GemmLayout, ("auto",)),
    (vocab.GemmBackendChoice, vocab.GEMM_BACKENDS, ("auto",)),
    (vocab.DispatchModeName, vocab.DispatchMode, ()),
    (vocab.ScoringFuncName, vocab.ScoringFunc, ()),
    (vocab.TopkMethodName, vocab.TopkMethod, ()),
    (vocab.SharedExpertsChoice, vocab.SharedExperts, ("auto",)),
    (vocab.ReplicaChoiceName, vocab.ReplicaChoice, ()),
    (vocab.DeviceKindName, vocab.DeviceKind, ()),
    (vocab.ArchName, vocab.Arch, ()),
]

# spec field -> the vocabulary's Literal it is typed with
FIELDS = [
    (models.Quant, "scheme", vocab.SchemeName),
    (models.Quant, "shared_scheme", vocab.SchemeName),
    (models.Quant, "scale_dtype", vocab.ScaleDtypeName),
    (models.Quant, "activation_scheme", vocab.ActivationSchemeName),
    (models.Quant, "checkpoint", vocab.CheckpointFormatName),
    (models.Experts, "layout", vocab.LayoutChoice),
    (models.Experts, "gemm_backend", vocab.GemmBackendChoice),
    (models.Experts, "shared_experts", vocab.SharedExpertsChoice),
    (models.Parallel, "dispatch", vocab.DispatchModeName),
    (models.Parallel, "replica_choice", vocab.ReplicaChoiceName),
    (models.Router, "scoring_func", vocab.ScoringFuncName),
    (models.Router, "topk_method", vocab.TopkMethodName),
    (models.Target, "device", vocab.DeviceKindName),
    (models.Target, "arch", vocab.ArchName),
]


@pytest.mark.parametrize("name, members, extra", NAMES, ids=lambda v: getattr(v, "__name__", ""))
def test_literal_lists_the_enum(name, members, extra):
    assert typing.get_args(name) == (*extra, *(m.value for m in members))


@pytest.mark.parametrize("table, field, name", FIELDS, ids=lambda v: getattr(v, "__name__", v))
def test_spec_field_takes_the_vocabulary(table, field, name):
    annotation = table.model_fields[field].annotation
    if typing.get_origin(annotation) is not typing.Literal:  # X | None
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    assert annotation == name


def test_activation_kinds_are_the_spec_tables():
    tables = typing.get_args(typing.get_args(models.Activation)[0])
    kinds = [typing.get_args(t.model_fields["kind"].annotation)[0] for t in tables]
    assert kinds == [k.value for k in vocab.ActivationKind]


def test_target_dtypes_are_dtypes():
    dtypes = typing.get_args(models.Target.model_fields["dtype"].annotation)
    assert {DType(d) for d in dtypes} <= set(DType)


def test_a_member_is_written_as_its_string():
    member = vocab.GemmLayout.masked
    assert member == "masked" and hash(member) == hash("masked")
    assert (f"{member}", str(member), literal(member)) == ("masked", "masked", "'masked'")
    assert literal((vocab.Backend.torch_distributed,)) == "('torch.distributed',)"
    assert json.dumps({member: member}) == '{"masked": "masked"}'


def test_vocabulary_imports_nothing_of_moec():
    tree = ast.parse(Path(vocab.__file__).read_text(encoding="utf-8"))
    imported = [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    ] + [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not [name for name in imported if name.split(".")[0] == "moec"]
