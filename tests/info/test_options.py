"""``resolve_info_options``: flag conflicts rejected by name, dtype names parsed, nothing run."""

from __future__ import annotations

import pytest

from dtypecheck.cli.info import resolve_info_options
from dtypecheck.errors import UsageError
from dtypecheck.render import OutputFormat


def _resolve(dtypes: list[str] | None, **flags: bool) -> object:
    base = {"all_dtypes": False, "list_names": False, "promote": False}
    return resolve_info_options(dtypes, **{**base, **flags}, fmt=OutputFormat.json, output=None, quiet=True)


@pytest.mark.parametrize(
    ("dtypes", "flags", "named"),
    [
        (["fp16"], {"list_names": True}, "dtype names"),
        (None, {"list_names": True, "all_dtypes": True}, "--all"),
        (None, {"list_names": True, "promote": True}, "--promote"),
        (["fp16"], {"all_dtypes": True}, "--all"),
        (["fp16"], {"promote": True}, "--promote"),
    ],
)
def test_conflicting_flags_name_the_flag(dtypes: list[str] | None, flags: dict[str, bool], named: str) -> None:
    with pytest.raises(UsageError, match=named):
        _resolve(dtypes, **flags)


def test_names_are_parsed_in_order_without_repeats() -> None:
    options = resolve_info_options(
        ["bf16", "fp16,bf16"],
        all_dtypes=False,
        list_names=False,
        promote=True,
        fmt=OutputFormat.json,
        output=None,
        quiet=True,
    )
    assert [s.name for s in options.specs] == ["bfloat16", "float16"]
    assert options.promote
    assert not options.list_names
