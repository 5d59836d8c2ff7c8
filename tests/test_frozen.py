"""schedules.frozen.fast_init: the same objects as the dataclass's own __init__ makes."""
from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass, field

import pytest

from clustersim.schedules.frozen import fast_init
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.timeline import MemorySample, Span


def _reference(cls: type) -> type:
    """The same dataclass with the __init__ dataclasses generates."""
    fields = [(f.name, f.type, field(default=f.default)) if f.default is not dataclasses.MISSING
              else (f.name, f.type) for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(f"Reference{cls.__name__}", fields, frozen=True,
                                      slots=True)


@pytest.mark.parametrize("cls, args", [
    (Op, (OpKind.F, 3)),
    (Op, (OpKind.SEND_B, 1, 7, "pp", 4096, 1.5e12, 2, 3, True, True)),
    (Span, (2, "compute", Op(OpKind.B, 1, 0), 0.25, 1.5)),
    (Span, (2, "send", Op(OpKind.SEND_F, 1, 0), 0.25, 1.5, {"peer": 3})),
    (MemorySample, (5, 0.125, 1 << 40)),
])
def test_fields_and_defaults_are_the_dataclass_init_s(cls, args):
    made, reference = cls(*args), _reference(cls)(*args)
    assert dataclasses.astuple(made) == dataclasses.astuple(reference)
    keywords = dict(zip([f.name for f in dataclasses.fields(cls)], args))
    assert cls(**keywords) == made
    if not isinstance(args[-1], dict):  # a Span with an info dict is unhashable, as before
        assert hash(cls(**keywords)) == hash(made) == hash(_reference(cls)(*args))
    assert pickle.loads(pickle.dumps(made)) == made
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, dataclasses.fields(cls)[0].name, None)


def test_missing_and_extra_arguments_fail_as_before():
    with pytest.raises(TypeError):
        Span(0, "compute")  # noqa: the point is the missing fields
    with pytest.raises(TypeError):
        MemorySample(0, 1.0, 2, 3)


def test_refuses_what_it_would_get_wrong():
    @dataclass(frozen=True)
    class NoSlots:
        x: int

    @dataclass(frozen=True, slots=True)
    class Factory:
        x: list = field(default_factory=list)

    @dataclass(frozen=True, slots=True)
    class Post:
        x: int

        def __post_init__(self):
            pass

    for cls in (NoSlots, Factory, Post):
        with pytest.raises(TypeError, match="fast_init"):
            fast_init(cls)
