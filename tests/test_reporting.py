"""The shared table and number helpers every report uses (reporting/)."""

from __future__ import annotations

import pytest

from reporting.machine import bf16_native, cpu_flags, cpu_model, describe, machine_lines
from reporting.tables import number, percent, table, templates

CPUINFO = (
    "processor\t: 0\nmodel name\t: AMD EPYC 7B13\n"
    "flags\t\t: fpu sse avx2 fma avx512f avx512_vnni avx512_bf16 ht\n"
)


def test_the_cpu_its_model_and_the_flags_that_decide_its_speed():
    assert cpu_model(CPUINFO) == "AMD EPYC 7B13"
    assert cpu_model("processor: 0\n") == "unknown CPU"
    flags = cpu_flags(CPUINFO)
    assert flags == ["avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni"]
    assert bf16_native(flags)
    assert not bf16_native(cpu_flags("flags\t: fpu avx2 fma avx512f\n"))
    assert cpu_flags("processor: 0\n") == []


def test_this_machine_described_once_for_every_report():
    info = describe()
    assert info["cores"] and info["cpu"] and "locust" in info and "torch" in info
    lines = machine_lines(info)
    assert lines[0].startswith(f"- CPU: {info['cpu']} ({info['cores']} cores)")


def test_a_table_aligns_its_columns_and_writes_every_cell():
    lines = table(
        ["kind", "sent", "p50 s"], [("unary", 12, number(0.25, 2)), ("total", 1234, "-")], "lrr"
    )
    assert lines == [
        "| kind | sent | p50 s |",
        "|---|---:|---:|",
        "| unary | 12 | 0.25 |",
        "| total | 1234 | - |",
    ]


@pytest.mark.parametrize(
    ("rows", "align", "message"),
    [
        ([("a",)], "", "a row of 1 cells in a table of 2 columns"),
        ([], "lrr", "more letters than the 2 columns"),
        ([], "lc", "one of l or r per column"),
    ],
)
def test_a_malformed_table_is_refused_saying_what_is_wrong(rows, align, message):
    with pytest.raises(ValueError, match=message):
        table(["a", "b"], rows, align)


def test_missing_figures_read_as_a_dash_and_others_keep_their_digits():
    assert number(None) == percent(None) == "-"
    assert number(12345.678, 1) == "12,345.7"
    assert percent(0.1234, 1) == "12.3%"


def test_templates_are_split_on_their_markers(tmp_path):
    path = tmp_path / "t.md"
    path.write_text("<!-- comment -->\n<!-- template: a -->\nA {x}\n<!-- template: b -->\nB\n")
    pieces = templates(path)
    assert sorted(pieces) == ["a", "b"]
    assert pieces["a"].format(x=1) == "A 1"
