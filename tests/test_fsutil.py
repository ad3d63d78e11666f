"""fsutil's refusals read as one plain sentence: what stands at the path and what to do instead."""
from __future__ import annotations

import os
import re

import pytest

from taxmodel import fsutil
from taxmodel.errors import InputError


def _no_nested_parentheses(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth > 1:
            return False
    return depth == 0


@pytest.mark.parametrize("kind", ["fifo", "link", "dir"])
def test_a_special_output_path_is_refused_in_one_plain_sentence(tmp_path, kind):
    path = tmp_path / "out"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.mkdir()
    with pytest.raises(InputError) as err:
        fsutil.check_output_file(path)
    msg = str(err.value)
    assert re.match(rf"{re.escape(str(path))}: is (a FIFO \(named pipe\)|a symbolic link|a directory); taxmodel only "
                    r"replaces regular files \(", msg), msg
    assert _no_nested_parentheses(msg), msg
