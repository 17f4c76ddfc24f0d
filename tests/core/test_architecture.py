import json
import subprocess
import sys

import pytest

from frugalnas import Architecture, ArchitectureParseError
from frugalnas.spaces.nb201.space import NB201Cell, NB201Space

CELL = "|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|"


def test_nb201_string_round_trip():
    space = NB201Space()
    arch = space.parse(CELL)
    assert isinstance(arch, NB201Cell)
    assert str(arch) == "nb201:" + CELL
    assert NB201Cell.parse(str(arch)) == arch
    assert space.parse(str(arch)) == arch


def test_a_genotype_class_reads_only_its_own_space():
    """The text form is read by the space's genotype class (no process-wide codec table):
    the generic reader refuses NB201's form, the NB201 reader another space's string."""
    arch = NB201Space().parse(CELL)
    with pytest.raises(ArchitectureParseError):
        Architecture.parse(str(arch))
    with pytest.raises(ArchitectureParseError, match="not an architecture of space 'nb201'"):
        NB201Cell.parse("toy:depth=3")


def test_json_round_trip_and_generic_codec():
    arch = Architecture("toy", {"depth": 3, "act": "relu", "se": True, "lr": 0.5})
    assert Architecture.from_json(arch.to_json()) == arch
    assert Architecture.parse(str(arch)) == arch
    assert json.loads(arch.to_json())["decisions"]["se"] is True


def test_immutable_and_hashable():
    arch = NB201Space().parse(CELL)
    with pytest.raises(AttributeError):
        arch.space = "x"
    d = arch.decisions
    d["edge_1_0"] = "none"
    assert arch["edge_1_0"] == "nor_conv_3x3"
    assert len({arch, NB201Space().parse(CELL)}) == 1
    assert arch.replace(edge_1_0="none") != arch


def test_key_is_stable_across_processes():
    arch = NB201Space().parse(CELL)
    code = ("from frugalnas.spaces.nb201.space import NB201Space;"
            f"print(NB201Space().parse({CELL!r}).key)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == arch.key
    assert len(arch.key) == 16


@pytest.mark.parametrize("bad, fragment", [
    ("|nor_conv_3x3~0|+|nor_conv_3x3~0|", "expected 3 nodes"),
    ("|conv_9x9~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|none~2|", "conv_9x9"),
    ("|nor_conv_3x3~1|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|none~2|", "OP~0"),
    ("nor_conv_3x3", "malformed NB201 cell string"),
])
def test_malformed_cell_strings_name_the_problem(bad, fragment):
    with pytest.raises(ArchitectureParseError, match=fragment):
        NB201Space().parse(bad)


def test_malformed_generic_string():
    with pytest.raises(ArchitectureParseError, match="SPACE:BODY"):
        Architecture.parse("no-colon-here")
    with pytest.raises(ArchitectureParseError, match="key=value"):
        Architecture.parse("toy:depth")
