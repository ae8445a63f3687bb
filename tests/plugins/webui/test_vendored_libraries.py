"""The vendored browser libraries are what static/vendor/README.md says: every file of its
table is there and holds the version the table names, the same version update.sh fetches,
and every licence file it names is there and is the licence it names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

VENDOR = Path(__file__).resolve().parents[3] / "plugins" / "webui" / "static" / "vendor"
#: licence name in the table -> words its text must hold
LICENCE_WORDS = {
    "MIT": "Permission is hereby granted",
    "Apache-2.0": "Apache License",
    "MPL-2.0": "Mozilla Public License Version 2.0",
    "BSD-3-Clause": "BSD 3-Clause License",
}


def _rows() -> list[dict]:
    """The README table's rows: files, npm package, version, licences and their files."""
    rows = []
    for line in (VENDOR / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith("`"):
            continue
        files, package, version, licence, _ = cells
        rows.append({
            "files": re.findall(r"`([^`]+)`", files),
            "package": re.search(r"\[([^\]]+)\]", package).group(1),
            "version": version,
            "licences": [n for n in LICENCE_WORDS if n in licence.split("(")[0]],
            "licence_files": re.findall(r"`([^`]+)`", licence),
        })  # fmt: skip
    return rows


ROWS = _rows()


def test_the_table_names_the_four_libraries():
    assert [r["package"] for r in ROWS] == [
        "marked",
        "dompurify",
        "@highlightjs/cdn-assets",
        "katex",
    ]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["package"])
def test_each_file_is_there_with_its_version_and_licence(row):
    script = next(f for f in row["files"] if f.endswith(".js"))
    assert row["version"] in (VENDOR / script).read_text(encoding="utf-8"), script
    for name in row["files"]:
        assert (VENDOR / name).stat().st_size > 0, name
    texts = [(VENDOR / name).read_text(encoding="utf-8") for name in row["licence_files"]]
    assert row["licences"] and len(texts) == len(row["licences"])
    for licence in row["licences"]:
        assert any(LICENCE_WORDS[licence] in t for t in texts), (row["package"], licence)


def test_update_sh_fetches_the_versions_of_the_table():
    script = (VENDOR / "update.sh").read_text(encoding="utf-8")
    fetched = dict(re.findall(r"^([A-Z]+)=(\S+)$", script, re.M))
    assert sorted(fetched.values()) == sorted(r["version"] for r in ROWS)
