"""The command blocks of docs/scale-out.md marked for the tests: a fenced block whose info string
is `sh guide:NAME` (or `bash guide:NAME`) is the guide's text for step NAME, run as written."""

import re

from pgcluster import HERE

GUIDE = HERE.parent / "docs" / "scale-out.md"


def guide_blocks() -> dict[str, str]:
    found = {}
    for m in re.finditer(r"^```(?:sh|bash) guide:([\w-]+)\n(.*?)^```$", GUIDE.read_text(), re.M | re.S):
        assert m.group(1) not in found, f"two blocks guide:{m.group(1)} in {GUIDE}"
        found[m.group(1)] = m.group(2)
    return found
