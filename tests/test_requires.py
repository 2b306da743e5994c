"""vit_rope refuses a timm older than the one its attention reuses, naming the version and the fix."""

import pytest
import timm

from vit_rope._requires import TIMM_MIN, check_timm


def test_current_timm_accepted() -> None:
    check_timm(timm.__version__)
    check_timm("1.0.31")
    check_timm("1.1.0.dev0")


@pytest.mark.parametrize("version", ["1.0.30", "1.0.20", "0.9.16", "1.0.30.dev0"])
def test_older_timm_refused(version: str) -> None:
    need = ".".join(map(str, TIMM_MIN))
    with pytest.raises(ImportError, match=rf"needs timm >= {need}, found timm {version}: pip install 'timm>={need}'"):
        check_timm(version)
