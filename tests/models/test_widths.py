"""The one table of model widths (vit_rope.models.widths)."""

import pytest

from vit_rope.models.widths import width


def test_a_size_gives_model_arguments_and_an_unknown_one_lists_the_sizes():
    assert width("small") == dict(embed_dim=384, depth=12, num_heads=6)
    with pytest.raises(KeyError, match="Unknown model size 'smol': the sizes are tiny, small, "):
        width("smol")
